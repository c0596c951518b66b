"""On a CPU worker, vLLM 0.32's partial-hit block copies (`kv_cache_block_copies`, applied in
`_update_states`) are made one slice copy a pair (`internals.block_copy`) instead of its
fancy-indexed assignment per layer. The same blocks, at the same point of the step: after the
step's bookkeeping and new-block zeroing, before the forward. Other devices keep vLLM's.

Runs in: the worker process (CPU).
Changes: how `_update_states` applies `kv_cache_block_copies`.
Remove when: vLLM's CPU worker copies block pairs with one contiguous copy each.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from vllm_pcd.internals.block_copy import Pairs, copy_after_update_states


@contextlib.contextmanager
def taken_from_stock(scheduler_output: Any) -> Iterator[Pairs | None]:
    """The step's `kv_cache_block_copies` as pairs, hidden from the stock `_update_states`
    while it runs, then put back (in one process this is the scheduler's own object)."""
    copies = scheduler_output.kv_cache_block_copies
    if not copies:
        yield None
        return
    scheduler_output.kv_cache_block_copies = None
    try:
        yield [(c.src_block_id, c.dst_block_id) for c in copies]
    finally:
        scheduler_output.kv_cache_block_copies = copies


def patch_runner(runner_cls: Any) -> None:
    copy_after_update_states(runner_cls, taken_from_stock)


def apply() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    patch_runner(GPUModelRunner)
