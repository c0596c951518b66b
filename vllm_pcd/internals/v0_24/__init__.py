"""vLLM 0.24's side of `internals.version.VersionAdapter` (FlagOS hosts): a request's faults
are re-raised as the `ValueError`s they are; there is no `vllm.endpoint_plugins` group, so
the routes are attached by wrapping the API server's app builder; only full KV blocks are
shared (no partial-hit copy-on-write), so the fork is off; the LM head's forward has no
`skip_gather`."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from vllm_pcd.compat import require_methods

API_SERVER = "vllm.entrypoints.openai.api_server"
STATE_MODULES = (API_SERVER, "vllm.entrypoints.openai.run_batch")
FORK_OFF = ("vLLM 0.24 shares only full KV blocks (no partial-hit copy-on-write): each "
            "branch recomputes the context's partially filled last block")


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
