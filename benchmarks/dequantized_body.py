"""A W4A8-G128 body's weight error, served at BF16 speed: the compressed checkpoint's body
weights dequantized (int4 times the group's scale) into a plain checkpoint of the same model.

    python -m benchmarks.dequantized_body W4A8_FOLDER --out FOLDER
    python -m benchmarks.evaluate --model FOLDER --data dev sms_spam --limit 40 \
        --methods pcd_token --out benchmarks/results/body-w4-dequantized.json
    python -m benchmarks.compare_runs benchmarks/results/body-bf16.json pcd_token \
        benchmarks/results/body-w4-dequantized.json pcd_token

On x86 vLLM runs a W4A8 body through PyTorch's portable 4-bit kernel (minutes a prompt for a
1.5B model), so its answers cannot be measured over a data set here. Serving the dequantized
weights measures the error the format puts in the weights, with vLLM's ordinary BF16 path.
The per-token INT8 activations are not emulated here: `benchmarks.activation_error` measures
their share on the same dequantized body.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import torch

KEPT_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "generation_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")
QUANTIZATION_PARAMS = ("weight_scale", "weight_zero_point", "weight_g_idx", "weight_shape",
                       "input_scale", "input_zero_point")


def weight_args(config: dict[str, Any]) -> Any:
    """The weights' quantization arguments of a checkpoint with one config group (the FlagOS
    format has one: every Linear but `lm_head`)."""
    from compressed_tensors.quantization import QuantizationArgs

    quantization = config.get("quantization_config") or {}
    if quantization.get("format") != "int-quantized":
        raise ValueError(f"format {quantization.get('format')!r}: this reads int-quantized "
                         "checkpoints (int8-stored weights and their scales)")
    groups = list(quantization.get("config_groups", {}).values())
    if len(groups) != 1:
        raise ValueError(f"{len(groups)} quantization config groups; one is expected")
    return QuantizationArgs(**groups[0]["weights"])


def dequantized_tensors(folder: Path) -> tuple[dict[str, torch.Tensor], int]:
    """Every tensor of the checkpoint in BF16, each quantized weight dequantized by
    `compressed-tensors`' own `dequantize` (int4 times its group's scale), one at a time;
    and how many were."""
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from safetensors import safe_open

    args = weight_args(json.loads((folder / "config.json").read_text()))
    out: dict[str, torch.Tensor] = {}
    count = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            keys = set(f.keys())
            for key in sorted(keys):
                prefix, _, param = key.rpartition(".")
                if param in QUANTIZATION_PARAMS:
                    continue
                tensor = f.get_tensor(key)
                if param == "weight" and f"{prefix}.weight_scale" in keys:
                    zero = f.get_tensor(f"{prefix}.weight_zero_point") \
                        if f"{prefix}.weight_zero_point" in keys else None
                    tensor = dequantize(tensor, f.get_tensor(f"{prefix}.weight_scale"), zero,
                                        args, dtype=torch.float32)
                    count += 1
                out[key] = tensor.to(torch.bfloat16)
    return out, count


def levels_per_group(weight: torch.Tensor, group: int = 128) -> int:
    """The most distinct values a group of `group` inputs holds (int4: at most 16), over the
    first rows."""
    groups = weight[:8].float().reshape(-1, group)
    return max(len(torch.unique(g)) for g in groups)


def write_plain(folder: Path, out: Path) -> Path:
    """A plain BF16 checkpoint of `folder`'s model (config.json without its
    quantization_config) holding the dequantized weights, the tokenizer and chat template
    copied beside them."""
    from safetensors.torch import save_file

    tensors, count = dequantized_tensors(folder)
    if not count:
        raise ValueError(f"{folder}: no quantized weight found")
    levels = levels_per_group(next(v for k, v in tensors.items() if k.endswith("down_proj.weight")))
    if levels > 16:
        raise ValueError(f"{folder}: a body weight group holds {levels} values, not int4's 16")
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in KEPT_FILES:
        if (folder / name).exists():
            shutil.copy(folder / name, out / name)
    print(f"wrote {out}: {count} Linear weights dequantized from {folder.name} (a group holds "
          f"at most {levels} values), BF16")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dequantized_body",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("w4a8", type=Path, help="a W4A8-G128 compressed-tensors checkpoint")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    write_plain(args.w4a8, args.out)


if __name__ == "__main__":
    main()
