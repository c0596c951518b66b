"""Copy-on-write of a partial prefix hit on vLLM 0.24, the half of the fork that 0.32 has
built in.

The fork (`internals.fork`) lets a branch's prefix hit end inside a block: the context's
partially filled last block. vLLM 0.24 shares whole blocks only, so without a copy the
branch would write its own tokens into the very block every other branch reads. Here, as
vLLM 0.32 does it:
- scheduler: a first allocation whose prefix hit ends inside a block reserves one block
  more, puts a fresh block in the shared one's place in the request's table, and records
  the pair (shared → fresh);
- the step's `SchedulerOutput` carries the pairs' block ids (`COPIES`) to the workers, which
  copy them in every layer's KV cache (`internals.block_copy`) after their per-step
  bookkeeping (where new blocks may be zeroed) and before the forward;
- the shared block keeps the branch's hit reference until the scheduler has processed that
  step's output, so no later allocation in the same step can take it and have it zeroed
  before the copy has run. The private block needs no such hold: it leaves the request only
  when the request is freed, after this step was scheduled, and a worker runs the steps in
  order, so the copy is done before any later step's zeroing or forward reaches it (an extra
  reference would also make it look shared in `get_num_common_prefix_blocks`).

Runs in: the engine core process (scheduler) and the worker process (the copies).
Changes: vLLM 0.24's first allocation of a request whose prefix hit ends inside a block, its
  step output, and the worker's per-step state update.
Remove when: vLLM 0.24 is no longer supported (0.32 copies on write itself).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Sequence

from vllm_pcd.compat import require_methods
from vllm_pcd.internals.block_copy import copy_after_update_states

COPIES = "pcd_block_copies"  # SchedulerOutput attribute: [(source block id, copy block id)]


class TailCopies:
    """One KV cache group's pending partial hits and copies (per manager)."""

    def __init__(self) -> None:
        self.partial: dict[str, tuple[int, Any]] = {}  # request id → (block index, shared)
        self.pairs: list[tuple[Any, Any]] = []  # (shared block, private copy) this step

    def take(self) -> list[tuple[Any, Any]]:
        pairs, self.pairs = self.pairs, []
        return pairs


def tail_copies(manager: Any) -> TailCopies:
    if not hasattr(manager, "_pcd_tail_copies"):
        manager._pcd_tail_copies = TailCopies()
    return manager._pcd_tail_copies


def ends_inside_block(blocks: Sequence[Any], computed: int, block_size: int) -> bool:
    """A first allocation whose local prefix hit ends inside its last hit block."""
    return bool(blocks) and computed % block_size != 0


def patch_manager(manager_cls: Any) -> None:
    """The full-attention manager: reserve, swap and record a partial hit's tail block."""
    require_methods(manager_cls, "get_num_blocks_to_allocate", "add_local_computed_blocks",
                    "allocate_new_blocks", "pop_blocks_for_free", patch="fork copy")
    count = manager_cls.get_num_blocks_to_allocate
    add_hit = manager_cls.add_local_computed_blocks
    allocate = manager_cls.allocate_new_blocks
    pop_for_free = manager_cls.pop_blocks_for_free

    @functools.wraps(count)
    def count_with_copy(self: Any, request_id: str, num_tokens: int,
                        new_computed_blocks: Sequence[Any], total_computed_tokens: int,
                        *args: Any, **kwargs: Any) -> int:
        needed = count(self, request_id, num_tokens, new_computed_blocks,
                       total_computed_tokens, *args, **kwargs)
        if request_id not in self.num_cached_block and ends_inside_block(
                new_computed_blocks, total_computed_tokens, self.block_size):
            needed += 1  # the private copy of the shared tail block
        return needed

    @functools.wraps(add_hit)
    def add_hit_with_copy(self: Any, request_id: str, new_computed_blocks: Sequence[Any],
                          num_local_computed_tokens: int, *args: Any, **kwargs: Any) -> None:
        add_hit(self, request_id, new_computed_blocks, num_local_computed_tokens, *args,
                **kwargs)
        if ends_inside_block(new_computed_blocks, num_local_computed_tokens, self.block_size):
            index = num_local_computed_tokens // self.block_size
            tail_copies(self).partial[request_id] = (index, self.req_to_blocks[request_id][index])
            # The private copy is not cached yet: cache it under its full hash once full.
            self.num_cached_block[request_id] = index

    @functools.wraps(allocate)
    def allocate_with_copy(self: Any, request_id: str, *args: Any, **kwargs: Any) -> list[Any]:
        copies = tail_copies(self)
        hit = copies.partial.pop(request_id, None)
        if hit is not None:
            index, shared = hit
            (private,) = self.block_pool.get_new_blocks(1)
            self.req_to_blocks[request_id][index] = private
            copies.pairs.append((shared, private))  # `shared` keeps the hit's reference
        return allocate(self, request_id, *args, **kwargs)

    @functools.wraps(pop_for_free)
    def pop_for_free_with_copy(self: Any, request_id: str) -> list[Any]:
        tail_copies(self).partial.pop(request_id, None)
        return pop_for_free(self, request_id)

    manager_cls.get_num_blocks_to_allocate = count_with_copy
    manager_cls.add_local_computed_blocks = add_hit_with_copy
    manager_cls.allocate_new_blocks = allocate_with_copy
    manager_cls.pop_blocks_for_free = pop_for_free_with_copy


def patch_scheduler(scheduler_cls: Any) -> None:
    """Each step's pairs ride on its output; the shared blocks' references go when it is
    processed."""
    require_methods(scheduler_cls, "schedule", "update_from_output", patch="fork copy")
    schedule = scheduler_cls.schedule
    update = scheduler_cls.update_from_output

    @functools.wraps(schedule)
    def schedule_with_copies(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = schedule(self, *args, **kwargs)
        pairs = [pair for group in self.kv_cache_manager.coordinator.single_type_managers
                 for pair in tail_copies(group).take()]
        if pairs:
            setattr(output, COPIES, [(s.block_id, p.block_id) for s, p in pairs])
            held = self.__dict__.setdefault("_pcd_held_blocks", {})
            held[id(output)] = [shared for shared, _ in pairs]
        return output

    @functools.wraps(update)
    def update_releasing(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return update(self, scheduler_output, *args, **kwargs)
        finally:
            held = self.__dict__.get("_pcd_held_blocks", {}).pop(id(scheduler_output), None)
            if held:
                self.kv_cache_manager.block_pool.free_blocks(held)

    scheduler_cls.schedule = schedule_with_copies
    scheduler_cls.update_from_output = update_releasing


@contextlib.contextmanager
def _carried(scheduler_output: Any) -> Iterator[Any]:
    yield getattr(scheduler_output, COPIES, None)


def patch_runner(runner_cls: Any) -> None:
    """The worker copies a step's pairs after its per-step bookkeeping, before the forward."""
    copy_after_update_states(runner_cls, _carried)


def apply() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    patch_manager(FullAttentionManager)
    patch_scheduler(Scheduler)
    patch_runner(GPUModelRunner)
