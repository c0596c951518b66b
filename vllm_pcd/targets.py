"""Does another vLLM still have what PCD patches? Read its wheel, install nothing.

    python -m vllm_pcd.targets --wheel vllm-0.33.0-…whl     # a table; exit 1 if any differs

GPU builds of vLLM cannot be installed on a CPU host (their CUDA dependencies), yet whether
PCD's patches would find their targets there is a question about source text. This applies
PCD's patches to the installed, supported vLLM, which records every function they replace or
call through with its parameters (`compat.PATCH_TARGETS`), then finds each one in the wheel's
sources by parsing them (`ast`: nothing is imported) and compares the parameters: `same`,
`changed` (both lists shown), or `missing`. Where `compat` has an adapter for the wheel's
version, the parameters it expects (its `TARGET_PARAMETERS`) replace the recorded ones. Every
name PCD imports from vLLM (outside other versions' adapters) must be defined there too. It
says nothing about behaviour: a function with the same parameters may do something else.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import sys
import zipfile
from pathlib import Path

from vllm_pcd.compat import ADAPTERS, PATCH_TARGETS

PACKAGE = Path(__file__).resolve().parent

Parameters = tuple[tuple[str, str], ...]


def recorded() -> dict[tuple[str, str], tuple[str, Parameters]]:
    """Every target of PCD's patches on the installed vLLM (which must be a supported one)."""
    from vllm_pcd import internals
    from vllm_pcd.internals import handler

    internals.apply()
    handler.require_hooks()
    return {(module, name): found for (module, name), found in PATCH_TARGETS.items()
            if module.split(".")[0] == "vllm"}  # not what other code checked in this process


def expected(wheel: Path, targets: dict[tuple[str, str], tuple[str, Parameters]]
             ) -> dict[tuple[str, str], tuple[str, Parameters]]:
    """The targets as the adapter for the wheel's version expects them (where it has one)."""
    name = _adapter_for(wheel)
    if name is None:
        return targets
    changes = getattr(importlib.import_module(f"vllm_pcd.internals.{name}"),
                      "TARGET_PARAMETERS", {})
    return {key: (patch, changes.get(key, found)) for key, (patch, found) in targets.items()}


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
            source = _module_source(names, archive, module)
            found = find(source, qualname) if source is not None else None
            target = f"{module}.{qualname}"
            if found is None:
                rows.append((patch, target, "missing", f"not defined in {module}"))
            elif found != expected:
                rows.append((patch, target, "changed",
                             f"({_shown(expected)}) → ({_shown(found)})"))
            else:
                rows.append((patch, target, "same", ""))
    return rows


def imported(adapter: str | None) -> dict[tuple[str, str | None], str]:
    """(vLLM module, name or None for a plain import) → the first PCD file importing it. The
    version adapters are left out but `adapter` and the adapters it builds on."""
    versions = re.compile(r"v\d+_\d+")
    sources = {p: ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    wanted = {adapter} if adapter else set()
    for path, tree in sources.items():
        if path.parent.name == adapter:
            wanted |= {n.module.split(".")[-1] for n in ast.walk(tree)
                       if isinstance(n, ast.ImportFrom) and n.module
                       and n.module.startswith("vllm_pcd.internals.v")}
    found: dict[tuple[str, str | None], str] = {}
    for path, tree in sources.items():
        if versions.fullmatch(path.parent.name) and path.parent.name not in wanted:
            continue
        where = str(path.relative_to(PACKAGE.parent))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level \
                    and (node.module or "").split(".")[0] == "vllm":
                for alias in node.names:
                    found.setdefault((node.module, alias.name), where)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "vllm":
                        found.setdefault((alias.name, None), where)
    return found


def _module_source(names: set[str], archive: zipfile.ZipFile, module: str) -> str | None:
    for path in (module.replace(".", "/") + ".py", module.replace(".", "/") + "/__init__.py"):
        if path in names:
            return archive.read(path).decode()
    return None


def defines(names: set[str], archive: zipfile.ZipFile, module: str, name: str | None,
            depth: int = 0) -> bool:
    """Whether the wheel's `module` exists and binds `name` (a definition, an assignment, an
    import, a submodule, or through a star import)."""
    source = _module_source(names, archive, module)
    if source is None or name is None:
        return source is not None
    if _module_source(names, archive, f"{module}.{name}") is not None:
        return True
    package = module if f"{module.replace('.', '/')}/__init__.py" in names \
        else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in {
                t.id for t in getattr(node, "targets", [getattr(node, "target", None)])
                if isinstance(t, ast.Name)}:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
            if isinstance(node, ast.ImportFrom) and node.names[0].name == "*" and depth < 3:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = node.module if not node.level else \
                    ".".join(p for p in (base, node.module) if p)
                if defines(names, archive, target, name, depth + 1):
                    return True
    return False


def compare_imports(wheel: Path, wanted: dict[tuple[str, str | None], str]
                    ) -> list[tuple[str, str, str, str]]:
    """('import', name, verdict, importing file) for every vLLM name PCD imports."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        return [("import", f"{module}.{name}" if name else module,
                 "same" if defines(names, archive, module, name) else "missing", where)
                for (module, name), where in sorted(wanted.items(), key=str)]


def _adapter_for(wheel: Path) -> str | None:
    match = re.match(r"vllm-([^-]+)-", wheel.name)
    return ADAPTERS.get(match.group(1).split("+")[0]) if match else None


def _shown(parameters: Parameters) -> str:
    marks = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}
    return ", ".join(marks.get(kind, "") + name for name, kind in parameters)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_pcd.targets",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--wheel", type=Path, required=True, help="a vLLM wheel file")
    args = parser.parse_args(argv)
    import vllm

    adapter = _adapter_for(args.wheel)
    rows = compare(args.wheel, expected(args.wheel, recorded()))
    rows += compare_imports(args.wheel, imported(adapter))
    print(f"PCD's patch targets and vLLM imports, as recorded on vLLM {vllm.__version__} "
          f"(installed) and expected by the adapter {adapter or '(none: an unknown version)'}, "
          f"against {args.wheel.name}")
    print("| patch | target | verdict | parameters expected → wheel, or where imported |\n"
          "|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    differing = [r for r in rows if r[2] != "same"]
    print(f"{len(rows) - len(differing)} of {len(rows)} the same")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
