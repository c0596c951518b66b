"""`vllm.endpoint_plugins` entry: PCD on `POST /v1/chat/completions`.

Requests whose `chat_template_kwargs` carry `pcd_schema` are answered by PCD; every other
request goes, untouched, to vLLM's own chat-completions handler.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
import uuid
from argparse import Namespace
from http import HTTPStatus
from typing import Any, Iterator

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.datastructures import State
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.serve.utils.api_utils import validate_json_request, with_cancellation
from vllm.logger import init_logger

from vllm_pcd import metrics
from vllm_pcd.compat import check_vllm_version
from vllm_pcd.internals.lm_head import configured_route
from vllm_pcd.pcd import check_normalization, constrained_online
from vllm_pcd.plan import DEFAULT_FORMULATION
from vllm_pcd.schema import MODES, Limits, SchemaError, parse_schema, shown

# Under "vllm" so the messages go where vLLM's own do, at its level.
logger = init_logger("vllm.pcd.server")

CHAT_PATH = "/v1/chat/completions"
PCD_KEYS = ("pcd_schema", "pcd_mode", "pcd_normalization", "pcd_formulation")
# Chat-completion options that PCD cannot honour; refused rather than silently ignored.
_UNSUPPORTED = {"stream": True, "tools": None, "response_format": None, "structured_outputs": None}


def error_response(status: HTTPStatus, message: str, *, param: str | None = None,
                   kind: str = "BadRequestError") -> JSONResponse:
    """OpenAI's error format, as vLLM's own routes answer."""
    return JSONResponse(status_code=status.value, content={
        "error": {"message": message, "type": kind, "param": param, "code": status.value}})


def _causes(err: BaseException | None) -> Iterator[BaseException]:
    """The error, then what caused it: into a TaskGroup's group (its first failure) and along
    `raise ... from`."""
    while err is not None:
        if isinstance(err, BaseExceptionGroup):
            err = err.exceptions[0]
            continue
        yield err
        err = err.__cause__


def fault_message(err: BaseException, request_id: str) -> str:
    """What failed, for the client: vLLM wraps a request's failure in an EngineGenerateError
    without a message, so its causes are named too (bounded), and the request id finds the
    traceback in the server log."""
    named = [f"{type(e).__name__}: {shown(str(e))}" if str(e) else type(e).__name__
             for e in itertools.islice(_causes(err), 3)]
    return (f"PCD inference failed ({'; caused by '.join(named)}); see the server log for "
            f"{request_id}")


def is_pcd_request(request: ChatCompletionRequest) -> bool:
    kwargs = request.chat_template_kwargs or {}
    return any(key in kwargs for key in PCD_KEYS)


def plain_messages(request: ChatCompletionRequest) -> list[dict[str, str]]:
    """OpenAI messages → role/content strings; only text content is meaningful to PCD."""
    messages = []
    for i, message in enumerate(request.messages):
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                part = dict(part)
                if part.get("type") != "text":
                    raise SchemaError(f"messages[{i}]: only text content is supported with "
                                      f"pcd_schema, got {shown(part.get('type'))}",
                                      param=f"messages[{i}].content", rule="content")
                parts.append(part.get("text", ""))
            content = "\n".join(parts)
        if not isinstance(content, str):
            raise SchemaError(f"messages[{i}]: content must be text", param=f"messages[{i}]",
                              rule="content")
        messages.append({"role": str(message.get("role")), "content": content})
    return messages


def _refuse_unsupported(request: ChatCompletionRequest) -> None:
    for name, bad in _UNSUPPORTED.items():
        value = getattr(request, name, None)
        if (value is True) if bad is True else bool(value):
            raise SchemaError(f"{name} cannot be combined with pcd_schema", param=name,
                              rule="unsupported_option")
    if (request.n or 1) != 1:
        raise SchemaError("n must be 1 with pcd_schema", param="n", rule="unsupported_option")


class PCDService:
    """Per-server state: the engine, its tokenizer and the configured limits."""

    def __init__(self, engine: Any, state: State, limits: Limits):
        self.engine = engine
        self.state = state
        self.limits = limits
        self.projection_route = configured_route(state.vllm_config)

    def chat_template(self) -> str | None:
        serving_chat = getattr(self.state, "openai_serving_chat", None)
        return getattr(serving_chat, "chat_template", None)

    def model_error(self, request: ChatCompletionRequest) -> JSONResponse | None:
        models = self.state.openai_serving_models
        if request.model and not models.is_base_model(request.model):
            return error_response(HTTPStatus.NOT_FOUND,
                                  f"The model `{shown(request.model)}` does not exist.",
                                  param="model", kind="NotFoundError")
        return None

    async def answer(self, request: ChatCompletionRequest) -> JSONResponse:
        mode = str((request.chat_template_kwargs or {}).get("pcd_mode", "token"))
        mode = mode if mode in MODES else "invalid"
        try:
            response = await self._answer(request, mode)
        except asyncio.CancelledError:
            metrics.record_refusal(mode, "cancelled")
            raise
        if response.status_code >= 400:
            metrics.record_refusal(mode, "error" if response.status_code >= 500 else "rejected")
        return response

    async def _answer(self, request: ChatCompletionRequest, mode_label: str) -> JSONResponse:
        start = time.perf_counter()
        if (refused := self.model_error(request)) is not None:
            return refused
        kwargs = dict(request.chat_template_kwargs or {})
        try:
            _refuse_unsupported(request)
            mode = kwargs.pop("pcd_mode", "token")
            if mode not in MODES:
                raise SchemaError(f"pcd_mode must be one of {list(MODES)}, got {shown(mode)}",
                                  param="pcd_mode", rule="mode")
            normalization = check_normalization(kwargs.pop("pcd_normalization", "sum"))
            formulation = kwargs.pop("pcd_formulation", DEFAULT_FORMULATION)
            spec = parse_schema(kwargs.pop("pcd_schema", None), self.limits)
            messages = plain_messages(request)
        except SchemaError as err:
            return error_response(HTTPStatus.BAD_REQUEST, str(err), param=err.param)
        request_id = f"chatcmpl-pcd-{uuid.uuid4().hex}"
        try:
            result = await constrained_online(
                self.engine, self.engine.get_tokenizer(), messages, spec, limits=self.limits,
                mode=mode, normalization=normalization, formulation=formulation,
                template_kwargs=kwargs,
                chat_template=self.chat_template(), request_id=request_id,
                cache_salt=request.cache_salt, projection_route=self.projection_route)
        except SchemaError as err:  # limits that depend on the tokenized prompt
            return error_response(HTTPStatus.BAD_REQUEST, str(err), param=err.param)
        except Exception as err:  # an engine fault fails this request only
            logger.exception("PCD request %s failed", request_id)
            return error_response(HTTPStatus.INTERNAL_SERVER_ERROR,
                                  fault_message(err, request_id), kind="InternalServerError")
        diagnostics = result.diagnostics()
        metrics.record_answer(mode_label, len(spec.fields), spec.total_candidates,
                              diagnostics["tokens"]["computed"], time.perf_counter() - start)
        prompt_tokens = diagnostics["tokens"]["ideal"]
        completion_tokens = len(spec.fields)
        return JSONResponse(content={
            "id": request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model or self.state.openai_serving_models.model_name(),
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": result.content},
                "logprobs": None,
                "finish_reason": "stop",
            }],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {
                    "cached_tokens": prompt_tokens - min(prompt_tokens,
                                                         diagnostics["tokens"]["computed"])},
            },
            "pcd": diagnostics,
        })


def _stock_chat_endpoint(app: FastAPI):
    for route in app.routes:
        if isinstance(route, APIRoute) and route.path == CHAT_PATH and "POST" in route.methods:
            return route.endpoint
    raise RuntimeError(f"vLLM registered no POST {CHAT_PATH}; vllm-pcd cannot attach")


class PCDEndpointPlugin:
    """Overrides POST /v1/chat/completions; delegates every non-PCD request to vLLM."""

    name = "pcd"
    required_tasks = ("generate",)

    def __init__(self) -> None:
        check_vllm_version()

    def attach_router(self, app: FastAPI) -> None:
        stock = _stock_chat_endpoint(app)

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

        app.add_api_route(CHAT_PATH, create_chat_completion, methods=["POST"],
                          dependencies=[Depends(validate_json_request)])

    async def init_state(self, engine_client: Any, state: State, args: Namespace) -> None:
        if engine_client is None:
            return
        limits = Limits.from_mapping(_pcd_config(args).get("limits"))
        max_model_len = state.vllm_config.model_config.max_model_len
        if limits.max_prompt_tokens >= max_model_len:  # leave room for the one output token
            limits = dataclasses.replace(limits, max_prompt_tokens=max_model_len - 1)
        state.pcd = PCDService(engine_client, state, limits)
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
    await constrained_online(service.engine, service.engine.get_tokenizer(),
                             [{"role": "user", "content": "warm-up"}],
                             parse_schema(schema, service.limits), limits=service.limits,
                             chat_template=service.chat_template(),
                             cache_salt=f"pcd-warmup-{uuid.uuid4().hex}")
    logger.info("vllm-pcd warm-up took %.2f s", time.perf_counter() - start)
