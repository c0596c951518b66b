"""`vllm.endpoint_plugins` entry (vLLM 0.32; on 0.24 `internals.app_v024` calls the same
hooks): PCD on `POST /v1/chat/completions`.

Requests whose `chat_template_kwargs` carry `pcd_schema` are answered by PCD (`service`);
every other request goes, untouched, to vLLM's own chat-completions handler. Every route
also gets the guard that keeps clients off PCD's engine channel (`guard`). Where the
plugin is not active in this process (not asked for, or a vLLM it was not written for), it
attaches nothing and vLLM serves as stock.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from argparse import Namespace
from http import HTTPStatus
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute
from starlette.datastructures import State
from starlette.middleware import Middleware
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.serve.utils.api_utils import validate_json_request, with_cancellation

from vllm_pcd import decision_routes, internals
from vllm_pcd.guard import RequestGuard
from vllm_pcd.pcd import constrained_online
from vllm_pcd.schema import Limits, parse_schema
from vllm_pcd.service import (PCDService, error_response, is_pcd_request, logger,
                              profile_advice)

CHAT_PATH = "/v1/chat/completions"


def _is_chat_post(route: Any) -> bool:
    return isinstance(route, APIRoute) and route.path == CHAT_PATH and route.methods == {"POST"}


def _stock_chat_endpoint(app: FastAPI):
    """vLLM's own chat handler, which PCD's route replaces and delegates to."""
    for route in app.routes:
        if _is_chat_post(route):
            return route.endpoint
    raise RuntimeError(f"vLLM registered no POST {CHAT_PATH}; vllm-pcd cannot attach")


class PCDEndpointPlugin:
    """Overrides POST /v1/chat/completions; delegates every non-PCD request to vLLM."""

    name = "pcd"
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        if not internals.active():
            logger.warning("vllm-pcd attaches no route: its engine patches are not active in "
                           "this process (see the vllm-pcd line above)")
            return
        stock = _stock_chat_endpoint(app)
        # Innermost: the guard runs after vLLM's own middleware (authentication first). A
        # stack that was already built (vLLM 0.24's SageMaker bootstrap builds it) is rebuilt.
        app.user_middleware.append(Middleware(RequestGuard))
        if app.middleware_stack is not None:
            app.middleware_stack = app.build_middleware_stack()

        @with_cancellation
        async def answer_pcd(request: ChatCompletionRequest, raw_request: Request):
            service: PCDService | None = getattr(raw_request.app.state, "pcd", None)
            if service is None:
                return error_response(HTTPStatus.SERVICE_UNAVAILABLE, "PCD is not initialised",
                                      kind="ServiceUnavailableError")
            return await service.answer(request)

        async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request):
            if is_pcd_request(request):
                return await answer_pcd(request, raw_request)
            return await stock(request, raw_request)

        app.router.routes[:] = [r for r in app.router.routes if not _is_chat_post(r)]
        app.add_api_route(CHAT_PATH, create_chat_completion, methods=["POST"],
                          dependencies=[Depends(validate_json_request)])
        decision_routes.attach(app)

    async def init_state(self, engine_client: Any, state: State, args: Namespace) -> None:
        if engine_client is None or not internals.active():
            return
        limits = Limits.from_mapping(_pcd_config(args).get("limits"))
        max_model_len = state.vllm_config.model_config.max_model_len
        if limits.max_prompt_tokens >= max_model_len:  # leave room for the one output token
            limits = dataclasses.replace(limits, max_prompt_tokens=max_model_len - 1)
        if (advice := profile_advice(state.vllm_config, limits)) is not None:
            logger.warning("vllm-pcd runs slowly with these serving flags: %s", advice)
        state.pcd = PCDService(engine_client, state, limits)
        if state.pcd.unavailable is not None:
            logger.warning("vllm-pcd answers PCD requests with 501: %s", state.pcd.unavailable)
            return
        await _warm_up(state.pcd)
        logger.info("vllm-pcd ready on %s (limits: %s)", CHAT_PATH, limits)


def _pcd_config(args: Namespace) -> dict[str, Any]:
    """`--additional-config '{"pcd": {"limits": {...}}}'`."""
    extra = getattr(args, "additional_config", None) or {}
    if isinstance(extra, str):
        extra = json.loads(extra)
    config = extra.get("pcd", {})
    if not isinstance(config, dict):
        raise ValueError("additional_config.pcd must be an object")
    return config


async def _warm_up(service: PCDService) -> None:
    """The first request asking for logprobs pays a multi-second torch.compile; pay it now."""
    schema = {"type": "object", "additionalProperties": False, "required": ["ready"],
              "properties": {"ready": {"type": "boolean"}}}
    start = time.perf_counter()
    for rank in range(service.engines):
        await constrained_online(service.engine, service.tokenizer,
                                 [{"role": "user", "content": "warm-up"}],
                                 parse_schema(schema, service.limits), limits=service.limits,
                                 chat_template=getattr(service.serving_chat, "chat_template", None),
                                 cache_salt=f"pcd-warmup-{uuid.uuid4().hex}",
                                 data_parallel_rank=rank if service.engines > 1 else None)
    logger.info("vllm-pcd warm-up took %.2f s", time.perf_counter() - start)
