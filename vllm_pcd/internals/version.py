"""What differs between the supported vLLMs, behind one small interface.

Each supported version has a package `vllm_pcd.internals.v0_XX` that implements
`VersionAdapter`; `compat` names the one for the running vLLM, and `adapter()` imports it
once. Every other module under `internals` is written against vLLM code that the supported
versions share, and asks the adapter where they part.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, Protocol

from vllm_pcd.compat import adapter_name

# The LM head's forward, given this call's arguments: (processor, lm_head, hidden_states,
# embedding_bias, skip_gather, stock) where `stock(hidden)` runs vLLM's own forward on
# `hidden` with the call's other arguments.
ChooseLogits = Callable[[Any, Any, Any, Any, bool, Callable[[Any], Any]], Any]
# The fork's lookup: (manager, request, blocks, hit, limit) → (blocks, hit) with the cached
# partial tail block the ordinary full-block hit reaches, the hit at most `limit` tokens.
ExtendHit = Callable[[Any, Any, Any, int, int], tuple[Any, int]]


class VersionAdapter(Protocol):
    # Modules that hold `init_app_state` under that name (API server, `vllm run-batch`).
    STATE_MODULES: tuple[str, ...]

    def client_error_types(self) -> tuple[type[BaseException], ...]:
        """The engine errors a request caused (vLLM answers them with a 4xx)."""

    def error_response(self, err: BaseException) -> Any:
        """vLLM's own `ErrorResponse` for `err` (its `.error` has code, message, param, type)."""

    def client_error(self, message: str, param: str) -> Exception:
        """The validation error vLLM's routes answer with a 400."""

    def attach_routes(self, plugin: Any) -> None:
        """Where vLLM runs no endpoint-plugin hook: call `plugin.attach_router(app)` on the
        API server's app (in the API server's process only)."""

    def logits_forward(self, stock: Callable[..., Any], choose: ChooseLogits
                       ) -> Callable[..., Any]:
        """`LogitsProcessor.forward` with this version's signature, answered by `choose`."""

    def fork_blocker(self, manager: Any) -> str | None:
        """Why this engine's KV cache manager cannot take the fork, for the features only this
        version has (speculative re-reads, KV events); None when none applies."""

    def lookup_with(self, stock: Callable[..., Any], extend: ExtendHit) -> Callable[..., Any]:
        """`KVCacheManager.get_computed_blocks` with this version's result shape, its hit
        extended by `extend`."""

    def lookup_allowed(self, manager: Any, request: Any) -> bool:
        """Whether the request may read the prefix cache at all."""

    def copy_partial_hits(self) -> None:
        """Make a prefix hit that ends inside a block give the request a private copy of that
        block (the worker copies its KV before the step's forward); nothing where vLLM does
        it itself."""


@functools.cache
def adapter() -> VersionAdapter:
    return importlib.import_module(f"vllm_pcd.internals.{adapter_name()}")  # type: ignore
