"""vLLM 0.24 has no `vllm.endpoint_plugins` group: PCD's route is attached by wrapping the API
server's app builder and state initialiser, which is what 0.32 does through its endpoint
plugin hooks (`PCDEndpointPlugin.attach_router`, `init_state`); `vllm run-batch` builds its
state with the same initialiser, imported by name. Only the API server process
has imported the module it patches; the engine and worker processes are left alone."""

from __future__ import annotations

import functools
import sys
from typing import Any

API_SERVER = "vllm.entrypoints.openai.api_server"
RUN_BATCH = "vllm.entrypoints.openai.run_batch"  # imported init_app_state by name


def apply() -> None:
    module = sys.modules.get(API_SERVER)
    if module is None:
        return
    from vllm_pcd.compat import require_methods
    from vllm_pcd.server import PCDEndpointPlugin

    require_methods(module, "build_app", "init_app_state", patch="app_v024")
    plugin = PCDEndpointPlugin()
    build_app, init_app_state = module.build_app, module.init_app_state

    @functools.wraps(build_app)
    def build_app_with_pcd(args: Any, *rest: Any, **kwargs: Any) -> Any:
        app = build_app(args, *rest, **kwargs)
        plugin.attach_router(app)
        return app

    @functools.wraps(init_app_state)
    async def init_app_state_with_pcd(engine_client: Any, state: Any, args: Any,
                                      *rest: Any, **kwargs: Any) -> None:
        await init_app_state(engine_client, state, args, *rest, **kwargs)
        await plugin.init_state(engine_client, state, args)

    module.build_app = build_app_with_pcd
    module.init_app_state = init_app_state_with_pcd
    batch = sys.modules.get(RUN_BATCH)
    if batch is not None and getattr(batch, "init_app_state", None) is init_app_state:
        batch.init_app_state = init_app_state_with_pcd
