"""One PCD chat completion on the API server: request checks, the call, and its answer.

Every part of a request is a client's: whatever it holds, the client gets a 2xx or a 4xx
naming the problem, and only a fault of the server or the engine is a 5xx. The work before
the engine (template, tokenizer passes) runs off the event loop, on a tokenizer of its own.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Iterator

from fastapi.responses import JSONResponse
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.logger import init_logger

from vllm_pcd import metrics
from vllm_pcd.calibration import DEFAULT_CALIBRATION, check_calibration
from vllm_pcd.internals.lm_head import configured_route
from vllm_pcd.pcd import Overloaded, PCDResult, check_normalization, constrained_online
from vllm_pcd.plan import DEFAULT_FORMULATION, DEFAULT_LAYOUT, check_conversation
from vllm_pcd.schema import MODES, Limits, SchemaError, SchemaSpec, parse_schema, shown

logger = init_logger("vllm.pcd.server")

PCD_KEYS = ("pcd_schema", "pcd_mode", "pcd_normalization", "pcd_formulation", "pcd_layout",
            "pcd_calibration")
# Chat-completion options that PCD cannot honour; refused rather than silently ignored.
_UNSUPPORTED = {"stream": True, "tools": None, "response_format": None, "structured_outputs": None}
# Log-probabilities are what PCD adds up; these modes return something else.
_LOGIT_MODES = ("raw_logits", "processed_logits")


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


def client_fault(err: BaseException) -> JSONResponse | None:
    """vLLM's own answer for an engine refusal the request caused (validation, admission
    control): the same 4xx or 429 its routes give. None for a server fault."""
    from vllm_pcd.internals.errors import client_error_types, vllm_error_response

    cause = next((e for e in _causes(err) if isinstance(e, client_error_types())), None)
    if cause is None:
        return None
    error = vllm_error_response(cause)
    return error_response(HTTPStatus(error.code), error.message, param=error.param,
                          kind=error.type)


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
                if part.get("type") != "text" or not isinstance(part.get("text", ""), str):
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
    if request.add_generation_prompt is False or request.continue_final_message:
        raise SchemaError("PCD answers in a new assistant turn: add_generation_prompt must stay "
                          "true and continue_final_message false", param="add_generation_prompt",
                          rule="unsupported_option")


def off_reason(vllm_config: Any) -> str | None:
    """Why this server's engine cannot give PCD correct scores; None when it can."""
    mode = str(vllm_config.model_config.logprobs_mode)
    if mode in _LOGIT_MODES:
        return (f"--logprobs-mode {mode} returns logits, and PCD adds log-probabilities; "
                "serve with raw_logprobs (the default) or processed_logprobs")
    return None


def profile_advice(vllm_config: Any, limits: Limits) -> str | None:
    """The serving flags that would make PCD run at a fraction of its speed, and what to
    change (FlagOS's release runs `--no-enable-prefix-caching --max-num-seqs 1`); None when
    there are none."""
    advice = []
    if not vllm_config.cache_config.enable_prefix_caching:
        advice.append("drop --no-enable-prefix-caching (without it every branch recomputes the "
                      "whole shared context)")
    seqs = vllm_config.scheduler_config.max_num_seqs
    if seqs <= limits.max_branches_per_batch:
        advice.append(f"raise --max-num-seqs from {seqs} to at least "
                      f"{limits.max_branches_per_batch + 1} (a call's branches run together, "
                      "at most max_branches_per_batch at a time, beside its context)")
    return "; ".join(advice) or None


def _private_tokenizer(engine: Any) -> Any:
    """A copy for PCD's planning thread, so it never shares a Rust tokenizer's borrow with
    vLLM's own tokenization thread."""
    tokenizer = engine.get_tokenizer()
    try:
        return copy.deepcopy(tokenizer)
    except Exception as err:  # a tokenizer class that cannot be copied: share it
        logger.warning("vllm-pcd plans on vLLM's own tokenizer (%s cannot be copied: %s)",
                       type(tokenizer).__name__, err)
        return tokenizer


class PCDService:
    """Per-server state: the engine, its tokenizer, the configured limits and the chat
    template settings of vLLM's own chat route (default kwargs, whether a request may bring
    its own template)."""

    def __init__(self, engine: Any, state: Any, limits: Limits):
        self.engine = engine
        self.state = state
        self.limits = limits
        self.tokenizer = _private_tokenizer(engine)
        self.projection_route = configured_route(state.vllm_config)
        self.unavailable = off_reason(state.vllm_config)
        parallel = state.vllm_config.parallel_config
        self.engines = (parallel.data_parallel_size_local if parallel.local_engines_only
                        else parallel.data_parallel_size)
        self._next_engine = itertools.count()

    @property
    def serving_chat(self) -> Any:
        return getattr(self.state, "openai_serving_chat", None)

    def chat_template(self, request: ChatCompletionRequest) -> str:
        """The request's own template only where the server trusts request templates."""
        if request.chat_template is not None:
            if not getattr(self.serving_chat, "trust_request_chat_template", False):
                raise SchemaError("Chat template is passed with request, but "
                                  "--trust-request-chat-template is not set. Refused request "
                                  "with untrusted chat template.", param="chat_template",
                                  rule="chat_template")
            return request.chat_template
        return self.server_chat_template

    @property
    def server_chat_template(self) -> str | None:
        """`--chat-template`, or None for the model's own."""
        return getattr(self.serving_chat, "chat_template", None)

    def template_kwargs(self, given: dict[str, Any] | None) -> dict[str, Any]:
        """`--default-chat-template-kwargs` under the request's own, as vLLM's route merges
        them (a null template variable leaves the default)."""
        defaults = getattr(self.serving_chat, "default_chat_template_kwargs", None) or {}
        kept = {k: v for k, v in (given or {}).items()
                if v is not None or k in PCD_KEYS}  # a null PCD option is refused, not unset
        return {**defaults, **kept}

    def data_parallel_rank(self) -> int | None:
        """One engine for every request of a PCD call (its KV and its admission groups live
        there); calls take the engines in turn."""
        return next(self._next_engine) % self.engines if self.engines > 1 else None

    def model_error(self, model: str | None) -> JSONResponse | None:
        models = self.state.openai_serving_models
        if model and not models.is_base_model(model):
            return error_response(HTTPStatus.NOT_FOUND,
                                  f"The model `{shown(model)}` does not exist.",
                                  param="model", kind="NotFoundError")
        return None

    @property
    def reveals_cache(self) -> bool:
        """vLLM's rule: cache hits are reported only with --enable-prompt-tokens-details
        (without a cache_salt they tell one tenant what another sent)."""
        return bool(getattr(self.serving_chat, "enable_prompt_tokens_details", False))

    async def answer_chat(self, handler: Any, request: ChatCompletionRequest
                          ) -> tuple[int, dict[str, Any]] | None:
        """vLLM's chat handler asks this first (`internals.handler`): PCD's answer as (HTTP
        status, OpenAI body), or None for a request that is not PCD's."""
        if not is_pcd_request(request):
            return None
        response = await self.answer(request)
        return response.status_code, json.loads(response.body)

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
        if (refused := self.refusal(request.model)) is not None:
            return refused
        kwargs = self.template_kwargs(request.chat_template_kwargs)
        try:
            _refuse_unsupported(request)
            options = pcd_options(kwargs)
            spec = parse_schema(kwargs.pop("pcd_schema", None), self.limits)
            messages = plain_messages(request)
            chat_template = self.chat_template(request)
        except SchemaError as err:
            return error_response(HTTPStatus.BAD_REQUEST, str(err), param=err.param)
        request_id = f"chatcmpl-pcd-{uuid.uuid4().hex}"
        result = await self.run(messages, spec, options, kwargs, chat_template=chat_template,
                                cache_salt=request.cache_salt, request_id=request_id,
                                mode_label=mode_label)
        if isinstance(result, JSONResponse):
            return result
        diagnostics = result.diagnostics(self.reveals_cache)
        return JSONResponse(content=completion(request_id, request.model or
                                               self.state.openai_serving_models.model_name(),
                                               result.content, diagnostics, len(spec.fields)))

    def refusal(self, model: str | None) -> JSONResponse | None:
        """501 where PCD is off on this server, 404 for a model it does not serve."""
        if self.unavailable is not None:
            return error_response(HTTPStatus.NOT_IMPLEMENTED, f"PCD is off on this server: "
                                  f"{self.unavailable}", kind="NotImplementedError")
        return self.model_error(model)

    async def run(self, messages: list[dict[str, Any]], spec: SchemaSpec, options: PCDOptions,
                  template_kwargs: dict[str, Any], *, chat_template: str | None,
                  cache_salt: str | None, request_id: str, mode_label: str,
                  full_vocabulary: bool = False) -> PCDResult | JSONResponse:
        """The PCD call every route makes, bounded by `limits.max_request_seconds`: its result,
        or the error response (4xx for what the request caused, 504, 500 for our faults)."""
        start = time.perf_counter()
        bound = self.limits.max_request_seconds
        try:
            check_conversation(messages, self.limits)  # before it waits for the planner
            async with asyncio.timeout(bound):
                result = await constrained_online(
                    self.engine, self.tokenizer, messages, spec, limits=self.limits,
                    mode=options.mode, normalization=options.normalization,
                    formulation=options.formulation, layout=options.layout,
                    calibration=options.calibration, template_kwargs=template_kwargs,
                    chat_template=chat_template, request_id=request_id, cache_salt=cache_salt,
                    projection_route=self.projection_route,
                    data_parallel_rank=self.data_parallel_rank(),
                    full_vocabulary=full_vocabulary)
        except SchemaError as err:  # limits that depend on the tokenized prompt
            return error_response(HTTPStatus.BAD_REQUEST, str(err), param=err.param)
        except Overloaded as err:
            return error_response(HTTPStatus.TOO_MANY_REQUESTS, str(err),
                                  kind="TooManyRequestsError")
        except TimeoutError:
            logger.warning("PCD request %s aborted after its %d s bound", request_id, bound)
            return error_response(HTTPStatus.GATEWAY_TIMEOUT,
                                  f"PCD request did not finish within {bound} s "
                                  "(limits.max_request_seconds); its engine work was aborted",
                                  kind="TimeoutError")
        except Exception as err:
            if (refused := client_fault(err)) is not None:
                return refused
            logger.exception("PCD request %s failed", request_id)  # fails this request only
            return error_response(HTTPStatus.INTERNAL_SERVER_ERROR,
                                  fault_message(err, request_id), kind="InternalServerError")
        diagnostics = result.diagnostics()
        metrics.record_answer(mode_label, len(spec.fields), spec.total_candidates,
                              diagnostics["tokens"]["computed"], time.perf_counter() - start,
                              diagnostics["projection"])
        return result


@dataclass(frozen=True)
class PCDOptions:
    """The `pcd_*` options of a request, checked."""

    mode: str = "token"
    normalization: str = "sum"
    formulation: str = DEFAULT_FORMULATION
    layout: str = DEFAULT_LAYOUT
    calibration: str = DEFAULT_CALIBRATION


def pcd_options(kwargs: dict[str, Any]) -> PCDOptions:
    """Pops and checks the PCD options (not `pcd_schema`) from chat-template kwargs."""
    mode = kwargs.pop("pcd_mode", "token")
    if mode not in MODES:
        raise SchemaError(f"pcd_mode must be one of {list(MODES)}, got {shown(mode)}",
                          param="pcd_mode", rule="mode")
    return PCDOptions(mode, check_normalization(kwargs.pop("pcd_normalization", "sum")),
                      kwargs.pop("pcd_formulation", DEFAULT_FORMULATION),
                      kwargs.pop("pcd_layout", DEFAULT_LAYOUT),
                      check_calibration(kwargs.pop("pcd_calibration", DEFAULT_CALIBRATION)))


def completion(request_id: str, model: str, content: str, diagnostics: dict[str, Any],
               decisions: int) -> dict[str, Any]:
    """An OpenAI chat completion carrying the object, with PCD's diagnostics beside it."""
    prompt_tokens = diagnostics["tokens"]["ideal"]
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": decisions,
                             "total_tokens": prompt_tokens + decisions}
    if "computed" in diagnostics["tokens"]:  # cache hits revealed on this server
        usage["prompt_tokens_details"] = {
            "cached_tokens": prompt_tokens - min(prompt_tokens, diagnostics["tokens"]["computed"])}
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": None,
            "finish_reason": "stop",
        }],
        "usage": usage,
        "pcd": diagnostics,
    }
