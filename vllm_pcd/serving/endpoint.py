"""`vllm.endpoint_plugins` entry (where vLLM has no such group, its version adapter calls the
same hooks): PCD on vLLM's chat handler and the decision routes.

`init_state` (the API server, and `vllm run-batch`, which builds the same state) creates the
service and hands its chat answer (`chat`) to vLLM's chat handler, and its Responses answer
(`responses`, structured outputs only) to vLLM's Responses handler (`internals.handler`):
requests whose
`chat_template_kwargs` carry a PCD key are answered by PCD on every door that calls the
handler (the HTTP route, `/invocations`, run-batch); every other request goes, untouched, to
vLLM's own code. Every route also gets the guard (`guard`). Where the plugin is not active in
this process (not asked for, or a vLLM it was not written for), it attaches nothing and vLLM
serves as stock.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from argparse import Namespace
from typing import Any

from fastapi import FastAPI
from starlette.datastructures import State
from starlette.middleware import Middleware

from vllm_pcd import internals
from vllm_pcd.core.config import pcd_config
from vllm_pcd.core.plan import Options
from vllm_pcd.core.schema import Limits, parse_schema
from vllm_pcd.internals import handler
from vllm_pcd.pipeline import Call, answer_online
from vllm_pcd.serving import chat, decision_routes, responses
from vllm_pcd.serving.guard import ApiKeys, RequestGuard
from vllm_pcd.serving.service import PCDService, logger, profile_advice


class PCDEndpointPlugin:
    """The guard and the decision routes; PCD's chat answers are given at vLLM's handler."""

    name = "pcd"
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        if not internals.active():
            logger.warning("vllm-pcd attaches no route: its engine patches are not active in "
                           "this process (see the vllm-pcd line above)")
            return
        # Innermost: the guard runs after vLLM's own middleware (authentication first). A
        # stack that was already built (some versions' SageMaker bootstrap builds it) is
        # rebuilt.
        app.user_middleware.append(Middleware(RequestGuard))
        if app.middleware_stack is not None:
            app.middleware_stack = app.build_middleware_stack()

        decision_routes.attach(app)

    async def init_state(self, engine_client: Any, state: State, args: Namespace) -> None:
        if engine_client is None or not internals.active():
            return
        config = pcd_config(getattr(args, "additional_config", None))
        limits = Limits.from_mapping(config.get("limits"))
        max_model_len = state.vllm_config.model_config.max_model_len
        if limits.max_prompt_tokens >= max_model_len:  # leave room for the one output token
            limits = dataclasses.replace(limits, max_prompt_tokens=max_model_len - 1)
        if (advice := profile_advice(state.vllm_config, limits)) is not None:
            logger.warning("vllm-pcd runs slowly with these serving flags: %s", advice)
        state.pcd = PCDService(engine_client, state, limits,
                               structured_outputs=config.get("structured_outputs", False),
                               reasoning=bool(getattr(args, "reasoning_parser", None)),
                               queue_calls=_batch_runner(args), api_keys=ApiKeys(args))
        handler.install_chat_hook(functools.partial(chat.answer_chat, state.pcd))
        handler.install_responses_hook(functools.partial(responses.answer_responses, state.pcd))
        if state.pcd.unavailable is not None:
            logger.warning("vllm-pcd answers PCD requests with 501: %s", state.pcd.unavailable)
            return
        await _warm_up(state.pcd)
        logger.info("vllm-pcd ready on vLLM's chat handler (limits: %s)", limits)


def _batch_runner(args: Namespace) -> bool:
    """Whether this is `vllm run-batch`: the only entry point with an input file (it calls the
    API server's `init_app_state` itself, so only its command line tells)."""
    return getattr(args, "input_file", None) is not None


async def _warm_up(service: PCDService) -> None:
    """The first request asking for logprobs pays a multi-second torch.compile; pay it now."""
    schema = {"type": "object", "additionalProperties": False, "required": ["ready"],
              "properties": {"ready": {"type": "boolean"}}}
    start = time.perf_counter()
    for rank in range(service.engines):
        await answer_online(service.online(), parse_schema(schema, service.limits),
                            [{"role": "user", "content": "warm-up"}], Options(),
                            Call(chat_template=service.server_chat_template,
                                 cache_salt=f"pcd-warmup-{uuid.uuid4().hex}",
                                 data_parallel_rank=rank if service.engines > 1 else None))
    logger.info("vllm-pcd warm-up took %.2f s", time.perf_counter() - start)
