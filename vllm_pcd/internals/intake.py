"""The engine core checks every request's PCD tag as it arrives.

`EngineCore.preprocess_add_request` runs in the engine's input thread; vLLM turns an
exception there into an error for that request alone (the engine keeps serving). So a forged
or malformed tag (`tags.check`) fails its request there, before the scheduler sees it, and a
verified one is attached to the scheduler's `Request` as `pcd_tags` for the other patches.

Runs in: the engine core process (its input thread).
Changes: `EngineCore.preprocess_add_request` verifies the tag and attaches it to the
  scheduler's request.
Remove when: vLLM carries verified per-request plugin data from the API server into the
  scheduler.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_pcd.compat import require_methods
from vllm_pcd.internals.tags import Tags, check


def tags_of(request: Any) -> Tags | None:
    """The verified tags of a scheduler request (None when it carries none)."""
    return getattr(request, "pcd_tags", None)


def apply() -> None:
    from vllm.v1.engine.core import EngineCore

    require_methods(EngineCore, "preprocess_add_request", patch="intake")
    preprocess = EngineCore.preprocess_add_request

    @functools.wraps(preprocess)
    def preprocess_checked(self: Any, request: Any) -> Any:
        params = request.sampling_params
        tags = check(params.extra_args if params is not None else None)
        req, wave = preprocess(self, request)
        req.pcd_tags = tags
        return req, wave

    EngineCore.preprocess_add_request = preprocess_checked
