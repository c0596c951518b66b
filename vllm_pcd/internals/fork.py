"""Branches fork the shared context's KV at its exact length, not at a block boundary.

vLLM's prefix cache shares only full KV blocks, so every branch would recompute the last
`shared_len % block_size` tokens of the shared context. A request tagged with fork lengths
(`Tags.shared`: prompt lengths: the shared context's for the context
request and each branch; a trie node's parent's and its own when nodes chain):
- leaves, when it releases its blocks, the block holding tokens up to each n in vLLM's
  prefix cache under a hash of exactly those n tokens (only once that KV is computed, so a
  later step's hit never reads a block still being written);
- on admission, after the ordinary full-block lookup reached the block boundary below the
  longest n whose block is cached, takes that block too, so its computed tokens start at n.
  A partial-hit copy-on-write then gives the branch a private copy of it (the worker copies
  the block before the step's forward) while the full blocks stay shared: vLLM 0.32's own,
  and on vLLM 0.24 the adapter's (`internals.v0_24.cow`).
The entry is an ordinary evictable cache entry: nothing outlives vLLM's own reference
counting, so a finished, aborted or preempted request leaks nothing, and an evicted entry
just means the branch recomputes the tail (the engine reports what it computed).
Only an engine with one full-attention KV cache group and nothing that reads hashes
(KV events, connectors, EAGLE, context parallelism) gets it; `PCD_FORK=0` turns it off.

Runs in: the engine core process (scheduler, KV cache manager, block pool).
Changes: `Scheduler.__init__`, `KVCacheManager.get_computed_blocks`, `free`,
  `pop_blocks_for_free` and `BlockPool.get_cached_block`, `_insert_block_hash` cache and hit a
  partial block by its exact length.
Remove when: vLLM's prefix cache hits partial blocks (it copies on write since 0.32, but caches
  and looks up full blocks only).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Callable

from vllm_pcd.compat import require_methods
from vllm_pcd.internals.intake import tags_of
from vllm_pcd.internals.version import adapter

ENV = "PCD_FORK"


@dataclass(frozen=True)
class Fork:
    """Per-scheduler state: how to hash a shared context's tail."""

    hash_fn: Callable[[Any], bytes]
    block_size: int

    def boundaries(self, request: Any) -> list[int]:
        """The tagged lengths that end inside a block, longest first."""
        tags = tags_of(request)
        if tags is None or request.mm_features:
            return []
        return sorted((n for n in set(tags.shared) if n % self.block_size), reverse=True)

    def tail_hash(self, request: Any, n: int) -> bytes:
        """Chained like vLLM's block hashes, over the tokens of the partial block only."""
        from vllm.v1.core.kv_cache_utils import (generate_block_hash_extra_keys,
                                                 hash_block_tokens)

        start = n - n % self.block_size
        parent = request.block_hashes[start // self.block_size - 1] if start else None
        extra_keys, _ = generate_block_hash_extra_keys(request, start, n, 0)
        return hash_block_tokens(self.hash_fn, parent, request.all_token_ids[start:n],
                                 extra_keys)


def off_reason(scheduler: Any) -> str | None:
    """Why this engine keeps plain prefix caching; None when it gets the fork."""
    from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    manager = scheduler.kv_cache_manager
    coordinator = manager.coordinator
    if os.environ.get(ENV, "1") == "0":
        return f"{ENV}=0"
    if not manager.enable_caching:
        return "prefix caching is off"
    if type(coordinator) is not UnitaryKVCacheCoordinator:
        return "the model has more than one KV cache group"
    (group,) = coordinator.single_type_managers
    if type(group) is not FullAttentionManager:
        return f"the KV cache group is {type(group).__name__}, not full attention"
    if scheduler.connector is not None:
        return "a KV connector reads block hashes"
    blocker = adapter().fork_blocker(manager)
    if blocker is not None:
        return blocker
    if group.dcp_world_size != 1 or coordinator.pcp_world_size != 1:
        return "context parallelism shards blocks"
    if manager.block_pool.hash_block_size != group.block_size:
        return "block hashes are finer than blocks"
    return None


def _install(scheduler: Any) -> None:
    from vllm.logger import init_logger
    from vllm.utils.hashing import get_hash_fn_by_name

    reason = off_reason(scheduler)
    manager = scheduler.kv_cache_manager
    if reason is not None:
        manager.pcd_fork = None
        init_logger("vllm.pcd.fork").info("PCD KV fork off (%s): plain prefix caching", reason)
        return
    hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
    manager.pcd_fork = Fork(hash_fn, manager.coordinator.single_type_managers[0].block_size)
    init_logger("vllm.pcd.fork").info("PCD KV fork on (block size %d)", manager.pcd_fork.block_size)


def _fork_of(manager: Any) -> Fork | None:
    return getattr(manager, "pcd_fork", None)


def _extend_hit(manager: Any, request: Any, blocks: Any, hit: int, limit: int
                ) -> tuple[Any, int]:
    """The ordinary hit plus the longest cached partial tail block it reaches, up to `limit`
    tokens (the longest hit the scheduler allows)."""
    fork = _fork_of(manager)
    if fork is None or not adapter().lookup_allowed(manager, request):
        return blocks, hit
    for n in fork.boundaries(request):
        if hit != n - n % fork.block_size or n > limit:
            continue
        tail = manager.block_pool.get_cached_block(fork.tail_hash(request, n), [0])
        if tail is not None:
            return manager.create_kv_cache_blocks(([*blocks.blocks[0], *tail],)), n
    return blocks, hit


def _leave_tail(manager: Any, request: Any) -> None:
    """Before a request's blocks are released: cache its computed tails."""
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    fork = _fork_of(manager)
    if fork is None:
        return
    blocks = manager.coordinator.single_type_managers[0].req_to_blocks.get(request.request_id)
    for n in fork.boundaries(request):
        if request.num_computed_tokens < n or not blocks or len(blocks) <= n // fork.block_size:
            continue
        tail_hash = fork.tail_hash(request, n)
        if manager.block_pool.get_cached_block(tail_hash, [0]) is None:
            manager.block_pool._insert_block_hash(make_block_hash_with_group_id(tail_hash, 0),
                                                  blocks[n // fork.block_size], num_tokens=n)


def apply() -> None:
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    require_methods(Scheduler, "__init__", patch="fork")
    init = Scheduler.__init__

    @functools.wraps(init)
    def init_with_fork(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _install(self)

    Scheduler.__init__ = init_with_fork
    require_methods(KVCacheManager, "get_computed_blocks", "free", "pop_blocks_for_free",
                    "create_kv_cache_blocks", patch="fork")
    require_methods(BlockPool, "get_cached_block", "_insert_block_hash", patch="fork")

    free = KVCacheManager.free
    pop_for_free = KVCacheManager.pop_blocks_for_free

    @functools.wraps(free)
    def free_with_fork(self: Any, request: Any) -> None:
        _leave_tail(self, request)
        free(self, request)

    @functools.wraps(pop_for_free)
    def pop_for_free_with_fork(self: Any, request: Any) -> Any:
        _leave_tail(self, request)
        return pop_for_free(self, request)

    KVCacheManager.get_computed_blocks = adapter().lookup_with(
        KVCacheManager.get_computed_blocks, _extend_hit)
    KVCacheManager.free = free_with_fork
    KVCacheManager.pop_blocks_for_free = pop_for_free_with_fork
    adapter().copy_partial_hits()
