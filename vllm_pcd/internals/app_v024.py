"""vLLM 0.24 has no `vllm.endpoint_plugins` group: PCD's routes are attached by wrapping the
API server's app builder, which is what 0.32 does through its endpoint plugin hook
(`attach_router`); its state is initialised by `entry_points`. Only the API server process
has imported the module it patches; the engine and worker processes are left alone."""

from __future__ import annotations

import functools
import sys
from typing import Any

from vllm_pcd.compat import require_methods

API_SERVER = "vllm.entrypoints.openai.api_server"


def apply(plugin: Any) -> None:
    module = sys.modules.get(API_SERVER)
    if module is None:
        return
    require_methods(module, "build_app", patch="app_v024")
    build_app = module.build_app

    @functools.wraps(build_app)
    def build_app_with_pcd(args: Any, *rest: Any, **kwargs: Any) -> Any:
        app = build_app(args, *rest, **kwargs)
        plugin.attach_router(app)
        return app

    module.build_app = build_app_with_pcd
