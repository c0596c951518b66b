"""The fork's private copies of a shared tail block on a CPU worker: one slice copy a pair.

Every branch forked inside a block gets a private copy of the shared context's tail block
before its forward (`internals.fork`), so at 32 fields a call copies 32 blocks in every layer.
vLLM 0.32 copies a step's blocks with one fancy-indexed assignment per layer
(`blocks[dst] = blocks[src]`), which first gathers all the sources into a temporary and then
scatters it: on CPU that takes ×5-12 the time of one contiguous `copy_` per pair
(`python -m benchmarks.bench_kv_copy`). The layout inside a block does not matter here: a
scheduler block is copied whole, whatever the attention kernel's packing of its tokens.

Runs in: the worker process (CPU).
Changes: the per-layer copy of a step's copy-on-write block pairs.
Remove when: vLLM's CPU worker copies block pairs with one contiguous copy each.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ContextManager, Iterable, Sequence

from vllm_pcd.compat import require_methods

Pairs = Sequence[tuple[int, int]]


def block_view(cache: Any, num_blocks: int) -> Any:
    """`cache` with its first dimension counting the scheduler's blocks (CPU attention's
    layout starts with its blocks), with finer kernel blocks folded in."""
    per_block, remainder = divmod(cache.shape[0], num_blocks)
    if remainder:
        raise RuntimeError(f"vllm-pcd fork copy: a KV cache of shape {tuple(cache.shape)} "
                           f"does not start with its {num_blocks} blocks")
    return cache.unflatten(0, (num_blocks, per_block))


def copy_blocks(caches: Iterable[Any], num_blocks: int, pairs: Pairs) -> None:
    """Copy each pair's source block onto its destination in every layer's KV cache (layers
    that share one cache are copied once)."""
    seen: set[int] = set()
    for cache in caches:
        if cache.data_ptr() in seen:
            continue
        seen.add(cache.data_ptr())
        blocks = block_view(cache, num_blocks)
        for source, target in pairs:
            blocks[target].copy_(blocks[source])


def copy_after_update_states(runner_cls: Any,
                             step_pairs: Callable[[Any], ContextManager[Pairs | None]]) -> None:
    """Wrap the runner's `_update_states` so that the (source, target) pairs a step carries are
    copied after its bookkeeping and new-block zeroing, before the forward. `step_pairs`
    hands a scheduler output's pairs over for the length of the stock call (each vLLM version
    carries them differently)."""
    require_methods(runner_cls, "_update_states", patch="fork copy")
    update_states = runner_cls._update_states

    @functools.wraps(update_states)
    def update_states_copying(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any
                              ) -> Any:
        with step_pairs(scheduler_output) as pairs:
            result = update_states(self, scheduler_output, *args, **kwargs)
        if pairs:
            copy_blocks(self.kv_caches, self.kv_cache_config.num_blocks, pairs)
        return result

    runner_cls._update_states = update_states_copying
