"""`benchmarks.activation_error`: a body's linears read per-token INT8 inputs inside the
context and their own inputs again after it."""

import torch

from benchmarks.activation_error import int8_activations, int8_tokens
from vllm_pcd import quantized_checkpoint as qc


def test_each_token_is_read_back_from_at_most_256_levels_within_half_a_step():
    x = torch.randn(5, 300) * torch.tensor([0.1, 1.0, 3.0, 10.0, 0.01])[:, None]
    x[2, 7] = 80.0  # an outlier widens its own token's step, not the others'
    got = int8_tokens(x)
    for row, back in zip(x, got):
        step = (row.max().clamp(min=0) - row.min().clamp(max=0)) / 255
        assert len(back.unique()) <= 256
        assert ((back - row).abs() <= step / 2 * 1.001 + row.abs() * 2 ** -8).all()
    assert (got[2] - x[2]).abs().max() > (got[1] - x[1]).abs().max()


def test_the_body_reads_int8_inputs_inside_and_its_own_after(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = qc.write_tiny_llama(tmp_path / "tiny", layers=2)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 14, 3]])
    with torch.inference_mode():
        before = model.model(ids).last_hidden_state
        with int8_activations(model.model) as linears:
            quantized = model.model(ids).last_hidden_state
        after = model.model(ids).last_hidden_state
    assert linears == 2 * 7  # q, k, v, o, gate, up, down a layer; the head is not the body's
    assert not torch.equal(before, quantized)
    assert (quantized - before).abs().max() < 0.1 * before.abs().max()
    assert torch.equal(before, after)
