"""The fork's block copy on plain tensors: each pair's source block lands on its destination
in every layer, and nothing else moves; on vLLM 0.32 a CPU worker's step copies with it,
after vLLM's own per-step bookkeeping, as vLLM's copy would."""

from types import SimpleNamespace

import pytest
import torch

from vllm_pcd.internals.block_copy import block_view, copy_blocks
from vllm_pcd.internals.v0_24.cow import ends_inside_block

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

NUM_BLOCKS = 6


def cpu_layout():
    """CPU attention: blocks, KV heads, tokens per block, 2 × head size."""
    return torch.randn(NUM_BLOCKS, 3, 4, 8)


def test_each_pair_is_copied_in_every_layer():
    layers = [cpu_layout(), cpu_layout()]
    before = [layer.clone() for layer in layers]
    copy_blocks([*layers, layers[0]], NUM_BLOCKS, [(1, 4), (1, 5), (2, 3)])  # layer 0 twice
    for new, old in zip(layers, before):
        for source, target in [(1, 4), (1, 5), (2, 3)]:
            assert torch.equal(new[target], old[source])
        for untouched in (0, 1, 2):
            assert torch.equal(new[untouched], old[untouched])


def test_kernel_blocks_finer_than_the_schedulers_are_copied_together():
    cache = torch.randn(2 * NUM_BLOCKS, 4, 8)  # two kernel blocks per scheduler block
    old = cache.clone()
    copy_blocks([cache], NUM_BLOCKS, [(0, 5)])
    assert torch.equal(cache[10:12], old[0:2]) and torch.equal(cache[:10], old[:10])


def test_a_cache_without_a_block_dimension_is_refused():
    with pytest.raises(RuntimeError, match="does not start with its 6 blocks"):
        block_view(torch.zeros(7, 3), NUM_BLOCKS)


def test_only_a_hit_ending_inside_a_block_is_copied():
    assert ends_inside_block(["b0", "b1"], 130, 128)
    assert not ends_inside_block(["b0"], 128, 128)
    assert not ends_inside_block([], 5, 128)


def test_0_32_step_copies_are_made_by_pcd_after_the_bookkeeping():
    from vllm_pcd.internals.v0_32.copies import patch_runner

    cache = cpu_layout()
    old = cache.clone()
    seen = []

    class Runner:
        kv_caches = [cache]
        kv_cache_config = SimpleNamespace(num_blocks=NUM_BLOCKS)

        def _update_states(self, scheduler_output):
            seen.append((scheduler_output.kv_cache_block_copies, cache[4].clone()))
            return "state"

    patch_runner(Runner)
    copies = [SimpleNamespace(src_block_id=1, dst_block_id=4)]
    output = SimpleNamespace(kv_cache_block_copies=copies)
    assert Runner()._update_states(output) == "state"
    (handed, block_then), = seen
    assert handed is None and torch.equal(block_then, old[4])  # vLLM's copy skipped
    assert torch.equal(cache[4], old[1]) and output.kv_cache_block_copies is copies
    Runner()._update_states(SimpleNamespace(kv_cache_block_copies=None))
    assert seen[-1][0] is None and torch.equal(cache[4], old[1])
