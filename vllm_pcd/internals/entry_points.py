"""Where PCD's serving layer is attached to vLLM's entry points, in the processes that run one.

- Every entry point that serves chat builds its serving state with `init_app_state`: the API
  server, and `vllm run-batch`, which imports it by name and runs no endpoint plugins on
  either version. Each module holding it is wrapped so that PCD's `init_state` runs after it
  wherever no plugin hook ran it: the batch runner's chat handler then answers PCD as the
  server's does. vLLM loads general plugins while it builds its command line, after the
  API server's module is imported and before the batch runner's imports the name.
- Where vLLM has no `vllm.endpoint_plugins` group, the version's adapter attaches the routes
  (`internals.version`).
The plugin (`attach_router`, `init_state`) comes from the entry layer, which calls `attach`;
nothing here imports it.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from vllm_pcd.internals.version import adapter


def _loaded() -> list[Any]:
    return [m for name in adapter().STATE_MODULES
            if (m := sys.modules.get(name)) is not None and hasattr(m, "init_app_state")]


def loaded() -> bool:
    """Whether this process runs an entry point PCD attaches to (not an engine process)."""
    return bool(_loaded())


_attached = False


def attach(plugin: Any) -> None:
    """Idempotent, like the plugin entry that calls it."""
    global _attached
    if _attached:
        return
    _attached = True
    for module in _loaded():
        module.init_app_state = with_plugin_state(module.init_app_state, plugin)
    adapter().attach_routes(plugin)


def with_plugin_state(init_app_state: Any, plugin: Any) -> Any:
    """`init_app_state`, then the plugin's `init_state` where no plugin hook ran it."""
    if getattr(init_app_state, "__pcd__", False):
        return init_app_state

    @functools.wraps(init_app_state)
    async def init_app_state_with_pcd(engine_client: Any, state: Any, args: Any,
                                      *rest: Any, **kwargs: Any) -> None:
        await init_app_state(engine_client, state, args, *rest, **kwargs)
        if getattr(state, "pcd", None) is None:
            await plugin.init_state(engine_client, state, args)

    init_app_state_with_pcd.__pcd__ = True
    return init_app_state_with_pcd
