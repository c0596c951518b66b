"""sources.lock.json: well-formed, and its vLLM entry is the vLLM installed and supported here."""

import json
import re
from pathlib import Path

import pytest

from vllm_pcd import compat

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "sources.lock.json"
REQUIRED = ("repository", "commit", "ref", "version", "tested_here", "note")
HEX40 = re.compile(r"[0-9a-f]{40}")
ABBREV = re.compile(r"[0-9a-f]{7,39}")
ARM_NOTE = "needs an Arm FlagOS host"
GPU_NOTE = "needs a CUDA GPU host"


@pytest.fixture(scope="module")
def lock():
    return json.loads(LOCK.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def sources(lock):
    return lock["sources"]


def test_parses_and_documents_its_format(lock):
    assert set(lock) == {"format", "sources"}
    assert isinstance(lock["format"], str) and "commit" in lock["format"]
    assert isinstance(lock["sources"], dict) and lock["sources"]


def test_every_entry_has_the_required_keys(sources):
    for name, entry in sources.items():
        missing = [k for k in REQUIRED if k not in entry]
        assert not missing, f"{name}: missing {missing}"
        assert entry["repository"].startswith("https://github.com/"), name
        assert isinstance(entry["tested_here"], bool), name
        assert isinstance(entry["version"], str) and entry["version"], name
        assert isinstance(entry["note"], str) and entry["note"], name
        assert entry.get("pypi") is None or isinstance(entry["pypi"], str), name


def test_every_commit_is_40_hex_or_explained(sources):
    for name, entry in sources.items():
        commit = entry["commit"]
        if commit is not None:
            assert HEX40.fullmatch(commit), f"{name}: commit {commit!r} is not 40 lowercase hex"
            assert "commit_unresolved" not in entry, name
            continue
        # Only an explicit, explained gap is allowed: never a guessed hash.
        reason = entry.get("commit_unresolved")
        assert isinstance(reason, str) and reason, f"{name}: null commit without a reason"
        if "commit_abbrev" in entry:
            assert ABBREV.fullmatch(entry["commit_abbrev"]), name


def test_only_what_is_installed_here_is_marked_tested(sources):
    tested = {name for name, entry in sources.items() if entry["tested_here"]}
    assert tested == {"vllm", "vllm-0.24", "triton"}
    for name, entry in sources.items():
        if not entry["tested_here"]:
            assert ARM_NOTE in entry["note"] or GPU_NOTE in entry["note"], name


def test_patch_paths_exist(sources):
    for name, entry in sources.items():
        for patch in entry.get("patches", []):
            assert (ROOT / patch).is_file(), f"{name}: {patch} missing"


def test_lock_matches_the_installed_supported_vllm(sources):
    locked = {sources[k]["version"]: sources[k] for k in ("vllm", "vllm-0.24", "vllm-0.33")}
    assert set(locked) == set(compat.SUPPORTED_VLLM_VERSIONS)
    entry = locked[compat.vllm_version()]
    assert entry["repository"] == "https://github.com/vllm-project/vllm"


def test_lock_matches_the_installed_triton(sources):
    triton = pytest.importorskip("triton")
    assert sources["triton"]["version"] == triton.__version__.split("+")[0]
