"""`benchmarks.dequantized_body`: a W4A8-G128 checkpoint's weights dequantized into a plain
one, checked against the BF16 source it was quantized from and against the format."""

import json

import torch
from safetensors import safe_open

from benchmarks.dequantized_body import levels_per_group, write_plain
from vllm_pcd import quantized_checkpoint as qc


def tensors(folder):
    with safe_open(folder / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_the_body_is_dequantized_and_the_rest_is_the_source_bit_for_bit(tmp_path):
    source = qc.write_tiny_llama(tmp_path / "bf16", layers=1)
    w4a8 = qc.write_w4a8(source, tmp_path / "w4a8")
    plain = write_plain(w4a8, tmp_path / "plain")
    assert "quantization_config" not in json.loads((plain / "config.json").read_text())
    before, after = tensors(source), tensors(plain)
    assert before.keys() == after.keys()
    body = [k for k in before if k.endswith("proj.weight")]
    assert len(body) == 7  # q, k, v, o, gate, up, down
    for key, old in before.items():
        new = after[key].float()
        error = ((new - old.float()).norm() / old.float().norm()).item()
        if key in body:
            assert 0.01 < error < 0.3, (key, error)  # int4 G128's error, not raw integers
            assert levels_per_group(after[key]) <= 16
        else:
            assert torch.equal(after[key], old), key  # norms, embedding, lm_head: untouched
