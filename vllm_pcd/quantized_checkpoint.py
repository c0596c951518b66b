"""W4A8-G128 compressed-tensors checkpoints, written by the `compressed-tensors` package's own
compressor, and a small Llama to write one from.

The format is the one FlagOS serves on Arm CPU hosts: every body linear's weights symmetric
INT4 in groups of 128 input columns (one scale a group), input activations quantized to INT8
per token at run time, symmetric; the embedding and `lm_head` stay in the source dtype (BF16).
`compressed-tensors`' W4A8 preset is exactly that scheme, and its int-quantized compressor
stores each weight as int8 codes in [-8, 7] with a `weight_scale` of [out, in / 128]: what
vLLM's `CompressedTensorsW4A8Int` loads. vLLM pins the `compressed-tensors` it ships with, and
`llmcompressor`, the usual front end, requires a newer one, so the compressor is called here
directly: the same scheme, the same scales (absmax / 7.5 per group, as its min-max observer
computes them from the weights alone), the same files.

    python -m vllm_pcd.quantized_checkpoint tiny-llama --out DIR     # a small random Llama
    python -m vllm_pcd.quantized_checkpoint w4a8 --source DIR --out DIR [--ignore PATTERN]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

PRESET = "W4A8"
GROUP_SIZE = 128
# Module names (compressed-tensors patterns) kept in the source dtype. The embedding is no
# Linear, so the scheme's "Linear" target never reaches it.
KEEP_DENSE = ("lm_head",)

# The small test model: every linear's input size divides GROUP_SIZE, its vocabulary is the
# default model's tokenizer's.
TINY_SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 64}


def w4a8_scheme() -> Any:
    """The preset's scheme on every Linear, checked to be the FlagOS contract (a preset that
    changed under a new `compressed-tensors` would write another format silently)."""
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme(PRESET, ["Linear"])
    w, a = scheme.weights, scheme.input_activations
    got = (w.num_bits, w.type, w.symmetric, w.strategy, w.group_size, w.dynamic,
           a.num_bits, a.type, a.symmetric, a.strategy, a.dynamic)
    if got != (4, "int", True, "group", GROUP_SIZE, False, 8, "int", True, "token", True):
        raise RuntimeError(f"compressed-tensors' {PRESET} preset is not INT4 G{GROUP_SIZE} "
                           f"symmetric weights with dynamic INT8 per-token activations: {scheme}")
    return scheme


def write_w4a8(source: str | Path, out: str | Path, ignore: Sequence[str] = ()) -> Path:
    """Quantize `source`'s body linears to W4A8-G128 and write the compressed checkpoint, with
    the source's tokenizer and chat template, to `out`. `ignore` names more modules to keep
    dense (compressed-tensors patterns, e.g. `re:.*down_proj$`)."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus,
                                                 apply_quantization_config)
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    model = AutoModelForCausalLM.from_pretrained(source, dtype="auto")
    config = QuantizationConfig(config_groups={"group_0": w4a8_scheme()},
                                ignore=[*KEEP_DENSE, *ignore],
                                quantization_status=QuantizationStatus.INITIALIZED)
    apply_quantization_config(model, config)
    with torch.no_grad():
        for module in model.modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None:
                continue
            scale, zero_point = compute_dynamic_scales_and_zp(module.weight, scheme.weights,
                                                              module)
            module.weight_scale.copy_(scale)
            module.weight_zero_point.copy_(zero_point)
            module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    compressor.update_config(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


def write_tiny_llama(out: str | Path, layers: int = 2, seed: int = 0) -> Path:
    """A random-weight Llama of TINY_SHAPE with the default model's tokenizer and chat
    template, saved in BF16. Weights are drawn at 1/sqrt(hidden) so that each layer and the
    head move the logits by O(1): option scores spread enough that a quantization error
    shows."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from vllm_pcd.models import provision

    source = provision()
    base = AutoConfig.from_pretrained(source)
    config = LlamaConfig(**TINY_SHAPE, num_hidden_layers=layers, vocab_size=base.vocab_size,
                         tie_word_embeddings=False, max_position_embeddings=4096,
                         initializer_range=TINY_SHAPE["hidden_size"] ** -0.5,
                         bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id,
                         pad_token_id=base.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(torch.bfloat16)
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


def quantization_of(folder: str | Path) -> dict[str, Any]:
    """The checkpoint's quantization in short, as config.json states it: format, each config
    group's weights and input activations, and what is kept dense."""
    config = json.loads((Path(folder) / "config.json").read_text())["quantization_config"]

    def args(a: dict[str, Any] | None) -> dict[str, Any] | None:
        keys = ("num_bits", "type", "symmetric", "strategy", "group_size", "dynamic")
        return {k: a[k] for k in keys} if a else None

    return {"quant_method": config["quant_method"], "format": config["format"],
            "groups": {name: {"targets": group["targets"], "weights": args(group["weights"]),
                              "input_activations": args(group["input_activations"])}
                       for name, group in config["config_groups"].items()},
            "ignore": config["ignore"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_pcd.quantized_checkpoint")
    sub = parser.add_subparsers(dest="command", required=True)
    quantize = sub.add_parser("w4a8", help="write a W4A8-G128 compressed-tensors checkpoint")
    quantize.add_argument("--source", required=True, type=Path)
    quantize.add_argument("--out", required=True, type=Path)
    quantize.add_argument("--ignore", action="append", default=[],
                          help="another module to keep dense (repeatable)")
    tiny = sub.add_parser("tiny-llama", help="write a small random Llama to quantize")
    tiny.add_argument("--out", required=True, type=Path)
    tiny.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "tiny-llama":
        print(write_tiny_llama(args.out, args.layers))
        return 0
    out = write_w4a8(args.source, args.out, args.ignore)
    print(json.dumps({"out": str(out), **quantization_of(out)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
