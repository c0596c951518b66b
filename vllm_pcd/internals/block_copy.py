"""The fork's private copies of a shared tail block on a CPU worker: one broadcast copy per
run of consecutive destinations.

Every branch forked inside a block gets a private copy of the shared context's tail block
before its forward (`internals.fork`), so at 32 fields a call copies 32 blocks in every layer.
vLLM 0.32 copies a step's blocks with one fancy-indexed assignment per layer
(`blocks[dst] = blocks[src]`), which first gathers all the sources into a temporary and then
scatters it: on CPU that takes ×5-12 the time of one contiguous `copy_` per pair
(`python -m benchmarks.bench_kv_copy`). A call's branches take their private blocks from the
free queue one after another, so their destinations mostly run consecutively: one source
broadcast onto such a run is one copy instead of one a pair, and a copy's fixed cost, not its
bytes, is most of a small block's. The layout inside a block does not matter here: a
scheduler block is copied whole, whatever the attention kernel's packing of its tokens.
Copying only a tail's filled slots would read less, but in strided slices of the kernel's
packed layout that took ×2.5 the whole block's time (docs/benchmarks.md).
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


def runs(pairs: Pairs) -> list[tuple[int, int, int]]:
    """The pairs as (source, first destination, count): one source onto consecutive blocks.
    A destination equal to its source is nothing to copy, so no run covers its source."""
    targets: dict[int, list[int]] = {}
    for source, target in pairs:
        if target != source:
            targets.setdefault(source, []).append(target)
    found = []
    for source, ids in targets.items():
        ids.sort()
        first = last = ids[0]
        for target in ids[1:]:
            if target != last + 1:
                found.append((source, first, last - first + 1))
                first = target
            last = target
        found.append((source, first, last - first + 1))
    return found


def copy_blocks(caches: Iterable[Any], num_blocks: int, pairs: Pairs) -> None:
    """Copy each pair's source block onto its destination in every layer's KV cache (layers
    that share one cache are copied once)."""
    seen: set[int] = set()
    planned = runs(pairs)
    for cache in caches:
        if cache.data_ptr() in seen:
            continue
        seen.add(cache.data_ptr())
        blocks = block_view(cache, num_blocks)
        for source, first, count in planned:
            block = blocks[source]
            blocks[first:first + count].copy_(block.expand(count, *block.shape))


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
