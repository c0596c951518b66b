"""Does another vLLM still have what PCD patches? Read its wheel, install nothing.

    python -m vllm_pcd.targets --wheel vllm-0.33.0-…whl     # a table; exit 1 if any differs

GPU builds of vLLM cannot be installed on a CPU host (their CUDA dependencies), yet whether
PCD's patches would find their targets there is a question about source text. This applies
PCD's patches to the installed, supported vLLM, which records every function they replace or
call through with its parameters (`compat.PATCH_TARGETS`), then finds each one in the wheel's
sources by parsing them (`ast`: nothing is imported) and compares the parameters: `same`,
`changed` (both lists shown), or `missing`. It says nothing about behaviour: a function with
the same parameters may do something else.
"""

from __future__ import annotations

import argparse
import ast
import sys
import zipfile
from pathlib import Path

from vllm_pcd.compat import PATCH_TARGETS

Parameters = tuple[tuple[str, str], ...]


def recorded() -> dict[tuple[str, str], tuple[str, Parameters]]:
    """Every target of PCD's patches on the installed vLLM (which must be a supported one)."""
    from vllm_pcd import internals
    from vllm_pcd.internals import handler

    internals.apply()
    handler.require_hooks()
    return {(module, name): found for (module, name), found in PATCH_TARGETS.items()
            if module.split(".")[0] == "vllm"}  # not what other code checked in this process


def _ast_parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Parameters:
    args = node.args
    return (*((a.arg, "POSITIONAL_ONLY") for a in args.posonlyargs),
            *((a.arg, "POSITIONAL_OR_KEYWORD") for a in args.args),
            *(((args.vararg.arg, "VAR_POSITIONAL"),) if args.vararg else ()),
            *((a.arg, "KEYWORD_ONLY") for a in args.kwonlyargs),
            *(((args.kwarg.arg, "VAR_KEYWORD"),) if args.kwarg else ()))


def _dataclass_init(node: ast.ClassDef) -> Parameters | None:
    """A dataclass's generated `__init__`: self, then its annotated fields (ClassVars and
    fields of its bases left out), keyword-only where the decorator says `kw_only=True`."""
    for decorator in node.decorator_list:
        call = decorator if isinstance(decorator, ast.Call) else None
        named = call.func if call else decorator
        if getattr(named, "id", getattr(named, "attr", None)) != "dataclass":
            continue
        kw_only = any(k.arg == "kw_only" and getattr(k.value, "value", False) is True
                      for k in (call.keywords if call else []))
        kind = "KEYWORD_ONLY" if kw_only else "POSITIONAL_OR_KEYWORD"
        return (("self", "POSITIONAL_OR_KEYWORD"),
                *((n.target.id, kind) for n in node.body
                  if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                  and "ClassVar" not in ast.unparse(n.annotation)))
    return None


def find(source: str, qualname: str) -> Parameters | None:
    """The parameters of `qualname` (`Class.method`, or a module-level function) in a
    module's source, or None where it defines no such function."""
    scope: list[ast.stmt] = ast.parse(source).body
    *classes, name = qualname.split(".")
    owner = None
    for class_name in classes:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == class_name]
        if not found:
            return None
        owner, scope = found[-1], found[-1].body
    functions = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == name]
    if functions:
        return _ast_parameters(functions[-1])
    return _dataclass_init(owner) if owner is not None and name == "__init__" else None


def compare(wheel: Path, targets: dict[tuple[str, str], tuple[str, Parameters]]
            ) -> list[tuple[str, str, str, str]]:
    """(patch, target, verdict, detail) for every target, against the wheel's sources."""
    rows = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for (module, qualname), (patch, expected) in sorted(targets.items()):
            path = module.replace(".", "/") + ".py"
            if path not in names:
                path = module.replace(".", "/") + "/__init__.py"
            found = find(archive.read(path).decode(), qualname) if path in names else None
            target = f"{module}.{qualname}"
            if found is None:
                rows.append((patch, target, "missing", f"not defined in {path}"))
            elif found != expected:
                rows.append((patch, target, "changed",
                             f"({_shown(expected)}) → ({_shown(found)})"))
            else:
                rows.append((patch, target, "same", ""))
    return rows


def _shown(parameters: Parameters) -> str:
    marks = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}
    return ", ".join(marks.get(kind, "") + name for name, kind in parameters)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_pcd.targets",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--wheel", type=Path, required=True, help="a vLLM wheel file")
    args = parser.parse_args(argv)
    import vllm

    rows = compare(args.wheel, recorded())
    print(f"PCD's patch targets, vLLM {vllm.__version__} (installed) against {args.wheel.name}")
    print("| patch | target | verdict | parameters: installed → wheel |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    differing = [r for r in rows if r[2] != "same"]
    print(f"{len(rows) - len(differing)} of {len(rows)} the same")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
