"""On a CPU worker, vLLM 0.32's partial-hit block copies (`kv_cache_block_copies`, applied in
`_update_states`) are made one slice copy a pair (`internals.block_copy`) instead of its
fancy-indexed assignment per layer. The same blocks, at the same point of the step: after the
step's bookkeeping and new-block zeroing, before the forward. Other devices keep vLLM's."""

from __future__ import annotations

import functools
from typing import Any

from vllm_pcd.compat import require_methods
from vllm_pcd.internals.block_copy import copy_blocks


def patch_runner(runner_cls: Any) -> None:
    require_methods(runner_cls, "_update_states", patch="fork copy")
    update_states = runner_cls._update_states

    @functools.wraps(update_states)
    def update_states_copying(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any
                              ) -> Any:
        copies = scheduler_output.kv_cache_block_copies
        if not copies:
            return update_states(self, scheduler_output, *args, **kwargs)
        scheduler_output.kv_cache_block_copies = None  # in one process this is the
        try:                                           # scheduler's own object: put back
            result = update_states(self, scheduler_output, *args, **kwargs)
        finally:
            scheduler_output.kv_cache_block_copies = copies
        copy_blocks(self.kv_caches, self.kv_cache_config.num_blocks,
                    [(c.src_block_id, c.dst_block_id) for c in copies])
        return result

    runner_cls._update_states = update_states_copying


def apply() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    patch_runner(GPUModelRunner)
