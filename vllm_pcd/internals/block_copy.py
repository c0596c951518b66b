"""The fork's private copies of a shared tail block on a CPU worker: one slice copy a pair.

Every branch forked inside a block gets a private copy of the shared context's tail block
before its forward (`internals.fork`), so at 32 fields a call copies 32 blocks in every layer.
vLLM 0.32 copies a step's blocks with one fancy-indexed assignment per layer
(`blocks[dst] = blocks[src]`), which first gathers all the sources into a temporary and then
scatters it: on CPU that takes ×2-2.7 the time of one contiguous `copy_` per pair
(`python -m benchmarks.bench_kv_copy`). The layout inside a block does not matter here: a
scheduler block is copied whole, whatever the attention kernel's packing of its tokens.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def block_view(cache: Any, num_blocks: int) -> Any:
    """`cache` with its first dimension counting the scheduler's blocks (CPU attention's
    layout starts with its blocks), with finer kernel blocks folded in."""
    per_block, remainder = divmod(cache.shape[0], num_blocks)
    if remainder:
        raise RuntimeError(f"vllm-pcd fork copy: a KV cache of shape {tuple(cache.shape)} "
                           f"does not start with its {num_blocks} blocks")
    return cache.unflatten(0, (num_blocks, per_block))


def copy_blocks(caches: Iterable[Any], num_blocks: int, pairs: Sequence[tuple[int, int]]
                ) -> None:
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
