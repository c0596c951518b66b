"""vLLM 0.24's side of `internals.version.VersionAdapter` (FlagOS hosts): a request's faults
are re-raised as the `ValueError`s they are; there is no `vllm.endpoint_plugins` group, so
the routes are attached by wrapping the API server's app builder; vLLM shares only full KV
blocks, so the fork's partial-hit copy-on-write is the adapter's own (`cow`); the prefix
lookup returns no pinned count; the LM head's forward has no `skip_gather`."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from vllm_pcd.compat import require_methods

API_SERVER = "vllm.entrypoints.openai.api_server"
STATE_MODULES = (API_SERVER, "vllm.entrypoints.openai.run_batch")


def client_error_types() -> tuple[type[BaseException], ...]:
    return (ValueError,)


def error_response(err: BaseException) -> Any:
    from vllm.entrypoints.serve.utils.error_response import create_error_response

    return create_error_response(err)


class _Refusal(ValueError):
    """vLLM 0.24 validates with plain ValueErrors."""


def client_error(message: str, param: str) -> Exception:
    return _Refusal(message)


def attach_routes(plugin: Any) -> None:
    """Only the API server process has imported the module patched here; the engine and
    worker processes are left alone."""
    module = sys.modules.get(API_SERVER)
    if module is None:
        return
    require_methods(module, "build_app", patch="routes")
    build_app = module.build_app

    @functools.wraps(build_app)
    def build_app_with_pcd(args: Any, *rest: Any, **kwargs: Any) -> Any:
        app = build_app(args, *rest, **kwargs)
        plugin.attach_router(app)
        return app

    module.build_app = build_app_with_pcd


def logits_forward(stock: Callable[..., Any], choose: Any) -> Callable[..., Any]:
    @functools.wraps(stock)
    def forward(self: Any, lm_head: Any, hidden_states: Any, embedding_bias: Any = None) -> Any:
        return choose(self, lm_head, hidden_states, embedding_bias, False,
                      lambda h: stock(self, lm_head, h, embedding_bias))
    return forward


def fork_blocker(manager: Any) -> str | None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():  # the adapter's copy knows CPU attention's KV layout
        return "vLLM 0.24's fork copy is built for CPU hosts (FlagOS)"
    if manager.block_pool.enable_kv_cache_events:
        return "KV cache events read block hashes"
    if manager.use_eagle:
        return "speculative decoding re-reads cached tokens"
    return None


def lookup_with(stock: Callable[..., Any], extend: Any) -> Callable[..., Any]:
    @functools.wraps(stock)
    def get_computed_blocks(self: Any, request: Any) -> tuple[Any, int]:
        blocks, hit = stock(self, request)
        return extend(self, request, blocks, hit, request.num_tokens - 1)
    return get_computed_blocks


def lookup_allowed(manager: Any, request: Any) -> bool:
    return manager.enable_caching and not request.skip_reading_prefix_cache


def copy_partial_hits() -> None:
    from vllm_pcd.internals.v0_24 import cow

    cow.apply()
