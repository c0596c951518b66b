"""The package's shape, read from its source: layers that import only downwards, no import
circles, a pure core, and version code only where versions are told apart."""

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

ROOT = Path(__file__).resolve().parents[2]
# Import package -> its folder (the projection code lives in kernels/, imported as
# vllm_pcd_kernels so that Hugging Face's `kernels` keeps its name).
PACKAGES = {"vllm_pcd": ROOT / "vllm_pcd",
            "vllm_pcd_kernels": ROOT / "kernels" / "vllm_pcd_kernels"}
# Lower floors never import higher ones. Within a floor, modules may import each other
# (without circles).
FLOORS = (
    ("vllm_pcd.core", "vllm_pcd.compat", "vllm_pcd.models", "vllm_pcd.standin",
     "vllm_pcd.quantized_checkpoint", "vllm_pcd.launch", "vllm_pcd_kernels"),
    ("vllm_pcd.internals",),
    ("vllm_pcd.engine",),
    ("vllm_pcd.pipeline",),
    ("vllm_pcd.serving",),
    ("vllm_pcd.plugin", "vllm_pcd.demo", "vllm_pcd.calibrate", "vllm_pcd.targets",
     "vllm_pcd.coverage", "vllm_pcd"),
)
# The core's rooms, by floor: a room is a sub-package whose `__init__` is its public face.
# Nothing outside a room imports one of its modules, and no module inside imports its own face.
CORE_FLOORS = (
    ("vllm_pcd.core.config", "vllm_pcd.core.schema"),
    ("vllm_pcd.core.scoring",),
    ("vllm_pcd.core.plan",),
    ("vllm_pcd.core.profiles",),
    ("vllm_pcd.core.result", "vllm_pcd.core"),
)
ROOMS = ("vllm_pcd.core.schema", "vllm_pcd.core.scoring", "vllm_pcd.core.plan")
# What the pure core may import besides itself and the standard library.
CORE_THIRD_PARTY = {"jsonschema"}
VERSION_LITERAL = re.compile(r"\b0\.(24|32)\.\d")


def module_name(pkg: str, path: Path) -> str:
    parts = (pkg, *path.relative_to(PACKAGES[pkg]).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(pkg, p): p for pkg, folder in PACKAGES.items() for p in folder.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """Every module this file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & set(MODULES)
            found |= submodules or {node.module}  # `from package import module` names the module
    return found


GRAPH = {name: {m for m in imports(path) if m in MODULES and m != name}
         for name, path in MODULES.items()}


def floor(name: str, floors: tuple[tuple[str, ...], ...] = FLOORS) -> int:
    matches = [(len(prefix), level) for level, prefixes in enumerate(floors)
               for prefix in prefixes if name == prefix or name.startswith(prefix + ".")]
    assert matches, f"{name} is on no floor of FLOORS"
    return max(matches)[1]


def test_every_module_is_on_a_floor_and_imports_only_downwards():
    upward = [(name, target) for name, targets in GRAPH.items() for target in targets
              if floor(target) > floor(name)]
    assert upward == []


def test_the_core_stands_on_at_most_six_floors_of_rooms_that_import_only_downwards():
    assert len(CORE_FLOORS) <= 6
    core = {name: targets for name, targets in GRAPH.items() if name.startswith("vllm_pcd.core")}
    upward = [(name, target) for name, targets in core.items() for target in targets
              if floor(target, CORE_FLOORS) > floor(name, CORE_FLOORS)]
    assert upward == []


def _room(name: str) -> str | None:
    return next((room for room in ROOMS if name == room or name.startswith(room + ".")), None)


def test_a_room_is_entered_only_by_its_face():
    private = [(name, target) for name, targets in GRAPH.items() for target in targets
               if _room(target) not in (None, target, _room(name))]
    own_face = [(name, target) for name, targets in GRAPH.items() for target in targets
                if _room(name) not in (None, name) and target == _room(name)]
    assert private == [] and own_face == []



def test_there_are_no_import_circles():
    state: dict[str, int] = {}
    circles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                circles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert circles == []


def test_the_core_imports_nothing_of_vllm_torch_or_http():
    for name, path in MODULES.items():
        if not name.startswith("vllm_pcd.core"):
            continue
        outside = {m.split(".")[0] for m in imports(path)} - {"vllm_pcd", "__future__"}
        third_party = {m for m in outside if m not in sys.stdlib_module_names}
        assert third_party <= CORE_THIRD_PARTY, (name, third_party)
        assert all(m.startswith("vllm_pcd.core") for m in imports(path) if
                   m.startswith("vllm_pcd")), name


def _code_strings(path: Path) -> list[str]:
    """String constants that are not docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_version_code_lives_only_in_the_version_adapters(name):
    """A supported version's number appears in code only in its adapter and in `compat`."""
    if name == "vllm_pcd.compat" or re.match(r"vllm_pcd\.internals\.v\d+_\d+", name):
        return
    assert not [s for s in _code_strings(MODULES[name]) if VERSION_LITERAL.search(s)]


def test_each_supported_version_has_an_adapter_with_the_whole_interface():
    from vllm_pcd import compat
    from vllm_pcd.internals.version import VersionAdapter

    members = {n for n in vars(VersionAdapter) if not n.startswith("_")} \
        | set(VersionAdapter.__annotations__)
    for package in compat.ADAPTERS.values():
        # Adapters import nothing from vLLM at module level, so this runs on any vLLM.
        module = importlib.import_module(f"vllm_pcd.internals.{package}")
        assert not [m for m in members if not hasattr(module, m)], package


def test_every_patch_module_says_where_it_runs_what_it_changes_and_when_it_can_go():
    """A patch of vLLM names its process, the upstream behaviour it changes and the upstream
    change that would retire it, as vllm-ascend's and vllm-plugin-FL's patch modules do."""
    import ast

    missing = []
    for path in sorted((ROOT / "vllm_pcd" / "internals").rglob("*.py")):
        text = path.read_text()
        if "require_methods(" not in text and "_update_states" not in text:
            continue  # helpers and the package's own apply(), which patch nothing themselves
        if path.name == "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        for card in ("Runs in:", "Changes:", "Remove when:"):
            if card not in doc:
                missing.append(f"{path.relative_to(ROOT)}: {card}")
    assert not missing, missing
