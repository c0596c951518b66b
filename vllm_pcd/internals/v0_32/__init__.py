"""vLLM 0.32's side of `internals.version.VersionAdapter`: client faults are `VLLMClientError`
or `GracefulHTTPError` (admission control, with its own status); routes come through the
endpoint-plugin hook; vLLM copies a partial-block prefix hit on write itself (on CPU one
slice copy a block, `copies`); the prefix lookup also reports pinned blocks; the LM head's
forward takes `skip_gather`."""

from __future__ import annotations

import functools
from typing import Any, Callable

STATE_MODULES = ("vllm.entrypoints.launchers.api_server.entry",
                 "vllm.entrypoints.launchers.run_batch")


def client_error_types() -> tuple[type[BaseException], ...]:
    from vllm.exceptions import GracefulHTTPError, VLLMClientError

    return (VLLMClientError, GracefulHTTPError)


def error_response(err: BaseException) -> Any:
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    return create_error_response(err)


def client_error(message: str, param: str) -> Exception:
    return _refusal_class()(message, parameter=param)


@functools.cache
def _refusal_class() -> type[Exception]:
    from vllm.exceptions import VLLMValidationError

    class PCDRefusal(VLLMValidationError, ValueError):
        """vLLM's validation error, and a ValueError for the routes that catch those."""

    return PCDRefusal


def attach_routes(plugin: Any) -> None:
    """Nothing to do: vLLM calls the `vllm.endpoint_plugins` entry itself."""


def logits_forward(stock: Callable[..., Any], choose: Any) -> Callable[..., Any]:
    @functools.wraps(stock)
    def forward(self: Any, lm_head: Any, hidden_states: Any, embedding_bias: Any = None,
                skip_gather: bool = False) -> Any:
        return choose(self, lm_head, hidden_states, embedding_bias, skip_gather,
                      lambda h: stock(self, lm_head, h, embedding_bias, skip_gather))
    return forward


def fork_blocker(manager: Any) -> str | None:
    if manager.enable_kv_cache_events:
        return "KV cache events read block hashes"
    if manager.use_eagle or manager.coordinator.num_reprefillable_tokens:
        return "speculative decoding re-reads cached tokens"
    return None


def lookup_with(stock: Callable[..., Any], extend: Any) -> Callable[..., Any]:
    @functools.wraps(stock)
    def get_computed_blocks(self: Any, request: Any) -> tuple[Any, int, int]:
        blocks, hit, pinned = stock(self, request)
        blocks, hit = extend(self, request, blocks, hit, request.num_tokens - 1)
        return blocks, hit, pinned
    return get_computed_blocks


def lookup_allowed(manager: Any, request: Any) -> bool:
    return manager.prefix_cache_lookup_enabled(request)


def copy_partial_hits() -> None:
    """vLLM 0.32's full-attention manager swaps a partial hit's tail block for a private copy
    and its worker copies the KV (`kv_cache_block_copies`); a CPU worker's copy is PCD's
    (`copies`)."""
    from vllm_pcd.internals.v0_32 import copies

    copies.apply()
