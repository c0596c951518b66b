"""The plugin never takes a host package's import name.

The restricted-projection code lives in the repository's `kernels/` folder but is installed as
`vllm_pcd_kernels`: `kernels` is the import name of Hugging Face's `kernels` distribution,
which transformers imports (5.25 and later require it). `scripts/setup.sh` installs Hugging
Face's package, in the version range the environment's transformers accepts, beside this one
on every supported vLLM, so these tests run against the collision they guard against.

Each check runs in a fresh interpreter, from the repository root (where the folder `kernels/`
is first on `sys.path`) and from elsewhere.
"""

import json
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, sys
import transformers
from transformers.integrations import hub_kernels  # imports `kernels` when it is usable
from transformers.utils.import_utils import is_kernels_available
import kernels
import vllm_pcd_kernels
from vllm_pcd_kernels import ROUTES, project, select_route
print(json.dumps({
    "kernels_file": kernels.__file__,
    "kernels_has_kernelize": hasattr(kernels, "kernelize"),
    "kernels_has_routes": hasattr(kernels, "ROUTES"),
    "kernels_used_by_transformers": is_kernels_available(),
    "ours_file": vllm_pcd_kernels.__file__,
    "ours_routes": sorted(ROUTES),
}))
"""


def hugging_face_kernels() -> metadata.Distribution:
    try:
        return metadata.distribution("kernels")
    except metadata.PackageNotFoundError:
        pytest.fail("Hugging Face's `kernels` is not installed beside vllm-pcd: "
                    "scripts/setup.sh installs it")


def probe(cwd: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("where", ["repository root", "elsewhere"])
def test_transformers_and_hugging_face_kernels_import_beside_the_plugin(where, tmp_path):
    dist = hugging_face_kernels()
    found = probe(ROOT if where == "repository root" else tmp_path)
    # `import kernels` is Hugging Face's package, the one its distribution installed...
    assert Path(found["kernels_file"]).resolve() == \
        Path(dist.locate_file("kernels/__init__.py")).resolve()
    assert found["kernels_has_kernelize"] and not found["kernels_has_routes"]
    # ...and transformers' hub-kernels integration really imported it (a version outside
    # transformers' range would leave that import untried).
    assert found["kernels_used_by_transformers"], (
        f"kernels {dist.version} is outside the range this transformers accepts")
    # The plugin's projection code is ours, under its own name.
    assert Path(found["ours_file"]).resolve() == \
        (ROOT / "kernels" / "vllm_pcd_kernels" / "__init__.py").resolve() \
        or "site-packages" in found["ours_file"]
    assert "torch" in found["ours_routes"]


def test_the_plugin_installs_no_top_level_kernels_package():
    """Neither a regular nor an editable install may claim `kernels`: a regular install would
    write into Hugging Face's `site-packages/kernels/`, and uninstalling either would delete
    the other's files."""
    assert not (ROOT / "kernels" / "__init__.py").exists(), \
        "kernels/ must stay a plain folder; its package is kernels/vllm_pcd_kernels"
    # The installed distribution, not the repository's own vllm_pcd.egg-info (whose
    # SOURCES.txt lists the source folders).
    installed = [d for d in metadata.distributions(name="vllm-pcd",
                                                   path=[sysconfig.get_paths()["purelib"]])]
    assert installed, "vllm-pcd is not installed in this environment"
    dist = installed[0]
    claimed = [str(f) for f in dist.files or () if f.parts and f.parts[0] == "kernels"]
    assert claimed == []
    top_level = (dist.read_text("top_level.txt") or "").split()
    assert "kernels" not in top_level
    # An editable install maps import names to folders in its finder module.
    for f in dist.files or ():
        if f.name.startswith("__editable__") and f.suffix == ".py":
            source = Path(dist.locate_file(f)).read_text()
            assert "'kernels':" not in source and '"kernels":' not in source, f
