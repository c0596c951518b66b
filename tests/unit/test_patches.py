"""Every patch in patches/ applies cleanly (`git apply --check`) to a pristine copy of its source.

vLLM patches are checked against a copy of the installed vllm package. site-packages/vllm is
the release tree's vllm/ directory, so the copy is placed at <tmp>/vllm. Other sources cannot
be fetched in CI. Set PCD_UPSTREAM_SRC to a directory holding one checkout per lock key at
the locked commit, e.g. $PCD_UPSTREAM_SRC/flaggems-arm; without it, their checks are skipped.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "patches"
LOCK = json.loads((ROOT / "sources.lock.json").read_text(encoding="utf-8"))["sources"]
ENV = "PCD_UPSTREAM_SRC"

CASES = [(name, patch) for name, entry in LOCK.items() for patch in entry.get("patches", [])]


def _git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_every_patch_file_is_locked_once_and_documented():
    files = sorted(p.name for p in PATCHES.glob("*.patch"))
    locked = sorted(Path(patch).name for _, patch in CASES)
    assert files == locked, "each patches/*.patch must be listed in exactly one lock entry"
    readme = (PATCHES / "README.md").read_text(encoding="utf-8")
    for name in files:
        lines = [line for line in readme.splitlines() if line.startswith(f"- `{name}`")]
        assert len(lines) == 1, f"patches/README.md needs one line for {name}"


def test_patches_are_plain_unified_diffs():
    for _, patch in CASES:
        text = (ROOT / patch).read_text(encoding="utf-8")
        assert "\ndiff --git a/" in text and "\n+++ b/" in text, patch


def _pristine_vllm(tmp_path: Path) -> Path:
    import vllm

    from vllm_pcd.compat import vllm_version

    assert vllm_version() == LOCK["vllm"]["version"], "installed vLLM is not the locked one"
    shutil.copytree(Path(vllm.__file__).parent, tmp_path / "vllm",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    return tmp_path


def _upstream_checkout(name: str) -> Path:
    base = os.environ.get(ENV)
    if not base:
        pytest.skip(f"{name} is not obtainable offline; set {ENV}=/dir with a checkout of "
                    f"{LOCK[name]['repository']} at {LOCK[name]['commit']} in /dir/{name}")
    root = Path(base) / name
    if not root.is_dir():
        pytest.skip(f"{ENV} is set but {root} does not exist")
    if (root / ".git").exists():
        head = _git("rev-parse", "HEAD", cwd=root)
        assert head.returncode == 0, head.stderr
        assert head.stdout.strip() == LOCK[name]["commit"], (
            f"{root} is at {head.stdout.strip()}, not the locked {LOCK[name]['commit']}")
    return root


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize(("name", "patch"), CASES, ids=[Path(p).name for _, p in CASES])
def test_patch_applies_to_pristine_source(name, patch, tmp_path):
    root = _pristine_vllm(tmp_path) if name == "vllm" else _upstream_checkout(name)
    result = _git("apply", "--check", "-v", str(ROOT / patch), cwd=root)
    assert result.returncode == 0, f"{patch} does not apply to {name}:\n{result.stderr}"
