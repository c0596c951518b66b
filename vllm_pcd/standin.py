"""A random-weight model of MiniCPM5-2B's exact shape, with a MiniCPM-style chat template.

MiniCPM5-2B is the workload PCD is built for, but its weights cannot be had offline. Its shape
can: a random-weight model of that shape is a faithful stand-in for speed, memory and the LM
head's size, never for accuracy.

What the release states: LlamaForCausalLM, 42 layers, GQA with 16 query and 2 KV heads,
2,516,756,480 parameters of which 1,981,982,720 are not the embedding or the head, a context of
131,072 tokens, a BF16 embedding and an untied BF16 `lm_head`.

What is derived here, not published: hidden size 2048, head dim 128 (16 x 128 = 2048) and
intermediate size 6144. A layer then holds q 2048x2048 + k, v 2x(256x2048) + o 2048x2048
(9,437,184) + gate, up, down 3x(2048x6144) (37,748,736) + two RMSNorms (4,096) = 47,190,016
parameters; x 42 + the final norm (2,048) = 1,981,982,720, the release's figure exactly. The
remaining 534,773,760 = 2 x 130,560 x 2048: an embedding and an untied head of 130,560 rows.
`tests/server/test_minicpm5_shape.py` checks this against transformers' own count of the config.

The tokenizer is the default model's (SmolLM2's ChatML tokens, 49,152 of them); the model's
vocabulary is padded to 130,560 rows, so the full head costs what MiniCPM5-2B's does.
"""

from __future__ import annotations

import json
import math
import shutil
import zlib
from pathlib import Path

RELEASE_LAYERS = 42
RELEASE_PARAMETERS = 2_516_756_480
RELEASE_NON_EMBEDDING_PARAMETERS = 1_981_982_720
HIDDEN, HEAD_DIM, INTERMEDIATE, VOCAB = 2048, 128, 6144, 130_560  # derived (module docstring)
QUERY_HEADS, KV_HEADS = 16, 2
CONTEXT = 131_072
# Not published either: a plain RoPE base that suits long contexts. Speed does not depend on it.
ROPE_THETA = 1_000_000.0
INIT_STD = 0.02  # transformers' initializer_range for Llama
LAYERS_PER_SHARD = 8  # about 755 MB of bf16 a shard: only one shard is ever in memory
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")

# ChatML turns as MiniCPM writes them. `enable_thinking` defaults to true, as in the
# release's template: the reply then opens a `<think>` block. With it false the reply starts
# after an empty one, which is how PCD renders every prompt.
CHAT_TEMPLATE = """\
{%- set thinking = enable_thinking if enable_thinking is defined else true -%}
{%- for message in messages -%}
{%- set content = message['content'] if message['content'] is string else '' -%}
{%- if message['role'] == 'assistant' and '</think>' in content -%}
{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if thinking -%}
{{- '<think>\\n' -}}
{%- else -%}
{{- '<think>\\n\\n</think>\\n\\n' -}}
{%- endif -%}
{%- endif -%}
"""


def tensor_shapes(layers: int) -> dict[str, tuple[int, ...]]:
    """Every weight of the checkpoint, named as transformers' and vLLM's Llama load them."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(layers):
        layer = f"model.layers.{i}"
        shapes.update({
            f"{layer}.self_attn.q_proj.weight": (QUERY_HEADS * HEAD_DIM, HIDDEN),
            f"{layer}.self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            f"{layer}.self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            f"{layer}.self_attn.o_proj.weight": (HIDDEN, QUERY_HEADS * HEAD_DIM),
            f"{layer}.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            f"{layer}.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            f"{layer}.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
            f"{layer}.input_layernorm.weight": (HIDDEN,),
            f"{layer}.post_attention_layernorm.weight": (HIDDEN,),
        })
    shapes["model.norm.weight"] = (HIDDEN,)
    shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    return shapes


def parameters(layers: int) -> tuple[int, int]:
    """(all parameters, those outside the embedding and the head) of the checkpoint."""
    shapes = tensor_shapes(layers)
    total = sum(math.prod(shape) for shape in shapes.values())
    head = math.prod(shapes["model.embed_tokens.weight"]) + math.prod(shapes["lm_head.weight"])
    return total, total - head


def config(layers: int, tokens: dict) -> dict:
    """config.json of the stand-in; `tokens` holds the tokenizer's bos/eos/pad ids."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "head_dim": HEAD_DIM,
        "num_hidden_layers": layers, "num_attention_heads": QUERY_HEADS,
        "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
        "max_position_embeddings": CONTEXT, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        # both spellings, so that transformers 4 and 5 and vLLM read the same base
        "rope_theta": ROPE_THETA, "rope_parameters": {"rope_type": "default",
                                                      "rope_theta": ROPE_THETA},
        "initializer_range": INIT_STD, "use_cache": True, "dtype": "bfloat16",
        "torch_dtype": "bfloat16", **tokens,
    }


def _weight(name: str, shape: tuple[int, ...], seed: int):
    """Norms at one, the rest N(0, INIT_STD) drawn in bf16 from a generator seeded by the
    tensor's name: the same tensor whatever the layer count, and no fp32 copy is made."""
    import torch

    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed((seed << 32) + zlib.crc32(name.encode()))
    return torch.empty(shape, dtype=torch.bfloat16).normal_(0.0, INIT_STD, generator=generator)


def _shards(layers: int) -> list[list[str]]:
    """Tensor names by shard: the embedding, layers in groups, the final norm and the head."""
    names = list(tensor_shapes(layers))
    groups = [names[:1]]
    for first in range(0, layers, LAYERS_PER_SHARD):
        prefixes = tuple(f"model.layers.{i}." for i in range(first, min(first + LAYERS_PER_SHARD,
                                                                        layers)))
        groups.append([n for n in names if n.startswith(prefixes)])
    groups.append(names[-2:])
    return groups


def write(folder: Path, layers: int, seed: int, tokenizer_source: Path) -> None:
    """Write the stand-in into the empty `folder`: bf16 safetensors shard by shard, the
    tokenizer of `tokenizer_source` (a model folder) with the chat template, the config."""
    from safetensors.torch import save_file

    shapes, shards = tensor_shapes(layers), _shards(layers)
    weight_map, total_bytes = {}, 0
    for index, names in enumerate(shards, 1):
        file = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: _weight(name, shapes[name], seed) for name in names}
        save_file(tensors, folder / file, metadata={"format": "pt"})
        total_bytes += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(names, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}, indent=2))
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_source / name, folder / name)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)  # chat_template.jinja is the one read
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    base = json.loads((tokenizer_source / "config.json").read_text())
    tokens = {k: base[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in base}
    (folder / "config.json").write_text(json.dumps(config(layers, tokens), indent=2))
