"""The suite is sorted by what a test needs, read from each file's source: `tests/unit` builds
no engine and starts no server, `tests/engine` builds an engine but starts no server, and
`tests/server` may do both. Shared code lives in `tests/conftest.py` and `tests/helpers.py`,
never in another test file."""

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
FOLDERS = ("unit", "engine", "server")
# The fixtures of `tests/conftest.py` that build an engine or start a server.
ENGINE_FIXTURES = {"fp32_llm"}
SERVER_FIXTURES = {"pcd_server", "client", "http"}
# What else builds an engine (vLLM's offline `LLM`, here or in a child's script, and the
# Triton-interpreter child) or starts a server (`vllm_pcd.launch`: `vllm serve`, `run-batch`).
ENGINE_TEXT = re.compile(r"\bLLM\(")
ENGINE_NAMES = {"run_interpreted"}
SERVER_MODULES = {"vllm_pcd.launch"}
TEST_PATH = re.compile(r"(?<![\w/.])tests/[\w/]*test_\w+\.py")
# Where the repository names test files.
NAMING_TEXT = ["README.md", "CHANGELOG.md", "docs/*.md", "patches/*.md", "sources.lock.json",
               "scripts/*", ".ci/*", "benchmarks/*.py", "vllm_pcd/**/*.py", "kernels/**/*.py",
               "tests/**/*.py"]


def files(folder):
    return sorted((TESTS / folder).glob("test_*.py"))


def needs(source: str) -> set[str]:
    """What `source`'s tests need beyond plain Python: an engine, a server, or neither. A
    fixture counts where a function asks for it by parameter or by name."""
    used, modules = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            used |= {a.arg for a in node.args.args + node.args.kwonlyargs}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in (
                "usefixtures", "getfixturevalue"):
            used |= {a.value for a in node.args if isinstance(a, ast.Constant)}
        elif isinstance(node, ast.Name) and node.id in ENGINE_NAMES:
            used.add(node.id)
        elif isinstance(node, ast.ImportFrom):
            modules |= {node.module or ""} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
    found = set()
    if used & (ENGINE_FIXTURES | ENGINE_NAMES) or ENGINE_TEXT.search(source):
        found.add("engine")
    if used & SERVER_FIXTURES or modules & SERVER_MODULES:
        found.add("server")
    return found


def test_every_test_file_is_in_a_folder_of_what_it_needs():
    assert [p.name for p in TESTS.glob("test_*.py")] == [], "tests/unit, engine or server"
    assert all(files(folder) for folder in FOLDERS)


@pytest.mark.parametrize("folder, allowed", [("unit", set()), ("engine", {"engine"})])
def test_no_file_needs_more_than_its_folder_gives(folder, allowed):
    wrong = {path.name: sorted(needs(path.read_text(encoding="utf-8")) - allowed)
             for path in files(folder)}
    assert {name: found for name, found in wrong.items() if found} == {}


def test_the_check_sees_engines_and_servers():
    llm = "LLM"  # spelled apart, so that this file constructs none
    assert needs("def test_x(fp32_llm):\n    pass\n") == {"engine"}
    assert needs(f"def test_x(tmp_path):\n    llm = {llm}(str(tmp_path))\n") == {"engine"}
    assert needs(f'SCRIPT = """llm = {llm}(sys.argv[1])"""\n') == {"engine"}
    assert needs("def test_x(request):\n    run_interpreted(request.path)\n") == {"engine"}
    assert needs("def test_x(http, fp32_llm):\n    pass\n") == {"engine", "server"}
    assert needs("from vllm_pcd.launch import serve\n") == {"server"}
    assert needs("from vllm_pcd import launch\n") == {"server"}
    assert needs('pytestmark = pytest.mark.usefixtures("pcd_server")\n') == {"server"}
    assert needs("def test_x(tokenizer):\n    '''The client's http view.'''\n") == set()
    assert needs('monkeypatch.setattr("vllm_pcd.launch.serve", fake)\n') == set()


def test_no_test_file_imports_another():
    """A test module imported by another runs its module-level code twice and ties the two
    files' folders together: what both need goes to `tests/helpers.py` or `tests/conftest.py`."""
    imports = {}
    for folder in FOLDERS:
        for path in files(folder):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                         else [a.name for a in node.names] if isinstance(node, ast.Import)
                         else [])
                bad = [n for n in names if re.search(r"(^|\.)test_\w+$", n)]
                if bad:
                    imports[f"{folder}/{path.name}"] = bad
    assert imports == {}


def test_every_test_file_the_repository_names_is_named_at_its_place():
    """Upstream tests quoted in patches/ and the lock file are not this suite's: only names of
    this suite's files are checked."""
    ours = {path.name for path in TESTS.rglob("test_*.py")}
    named = {}
    for pattern in NAMING_TEXT:
        for path in ROOT.glob(pattern):
            if path.is_file():
                for name in TEST_PATH.findall(path.read_text(encoding="utf-8", errors="ignore")):
                    if Path(name).name in ours and not (ROOT / name).is_file():
                        named.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert named == {}
