"""vLLM 0.33's side of `internals.version.VersionAdapter`: 0.32's, except the prefix lookup.

0.33's scheduler passes `get_computed_blocks` the longest hit it allows (an output connector
may bound it; None means all but the last prompt token), positionally. The fork's extended
hit must stay within it as the ordinary hit does. Everything else the 0.32 adapter touches
reads the same in the 0.33.0 wheel's sources (`python -m vllm_pcd.targets --wheel …`). No
CPU build of 0.33 exists: nothing here has served a request on this machine (README).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from vllm_pcd.internals.v0_32 import (STATE_MODULES, attach_routes, client_error,
                                      client_error_types, copy_partial_hits, error_response,
                                      fork_blocker, logits_forward, lookup_allowed)

__all__ = ["STATE_MODULES", "TARGET_PARAMETERS", "attach_routes", "client_error",
           "client_error_types", "copy_partial_hits", "error_response", "fork_blocker",
           "logits_forward", "lookup_allowed", "lookup_with"]

_ARG = "POSITIONAL_OR_KEYWORD"
TARGET_PARAMETERS = {
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager.get_computed_blocks"):
        (("self", _ARG), ("request", _ARG), ("max_cache_hit_length", _ARG)),
}


def lookup_with(stock: Callable[..., Any], extend: Any) -> Callable[..., Any]:
    @functools.wraps(stock)
    def get_computed_blocks(self: Any, request: Any, max_cache_hit_length: int | None = None
                            ) -> tuple[Any, int, int]:
        blocks, hit, boundary = stock(self, request, max_cache_hit_length)
        limit = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
        blocks, hit = extend(self, request, blocks, hit, limit)
        return blocks, hit, boundary
    return get_computed_blocks
