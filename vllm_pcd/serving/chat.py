"""PCD's answer to a chat completion, at vLLM's chat handler (`internals.handler`): every door
that calls the handler (the HTTP route, `/invocations`, `vllm run-batch`) answers the same.

A request whose `chat_template_kwargs` carry a PCD key is PCD's: it is checked here (options
PCD cannot honour are refused, never ignored), answered by the service, and written as an
OpenAI chat completion with PCD's diagnostics beside it.
"""

from __future__ import annotations

import asyncio
import uuid
from http import HTTPStatus
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

from vllm_pcd.core.plan import Options
from vllm_pcd.core.schema import MODES, SchemaError, parse_schema
from vllm_pcd.serving import metrics
from vllm_pcd.serving.errors import ErrorAnswer
from vllm_pcd.serving.openai_shapes import completion, plain_messages
from vllm_pcd.serving.service import PCD_KEYS, PCDService
from vllm_pcd.serving.structured import answer_structured

# Chat-completion options that PCD cannot honour; refused rather than silently ignored (the
# answer's diagnostics carry the scores, not token log-probabilities or token ids).
_UNSUPPORTED = {"stream": True, "tools": None, "response_format": None, "structured_outputs": None,
                "documents": None, "logprobs": None, "prompt_logprobs": None, "echo": None,
                "return_token_ids": None, "return_tokens_as_token_ids": None}


def is_pcd_request(request: ChatCompletionRequest) -> bool:
    kwargs = request.chat_template_kwargs or {}
    return any(key in kwargs for key in PCD_KEYS)


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


async def answer_chat(service: PCDService, handler: Any, request: ChatCompletionRequest,
                      raw_request: Any = None) -> tuple[int, dict[str, Any]] | None:
    """vLLM's chat handler asks this first: PCD's answer as (HTTP status, OpenAI body), or
    None for a request that is not PCD's (a structured-output request may be: `structured`).
    Without the server's API key (a door vLLM leaves open, `/invocations`), a PCD body gets
    the 401 `/v1` gives, and a structured-output body vLLM's own answer."""
    if not is_pcd_request(request):
        if not service.api_keys.admit(raw_request):
            return None
        return await answer_structured(service, request)
    if not service.api_keys.admit(raw_request):
        return HTTPStatus.UNAUTHORIZED.value, ErrorAnswer(
            HTTPStatus.UNAUTHORIZED, "Unauthorized", kind="AuthenticationError").body()
    mode = str((request.chat_template_kwargs or {}).get("pcd_mode", "token"))
    mode = mode if mode in MODES else "invalid"
    try:
        status, body = await _answer(service, request, mode, raw_request)
    except asyncio.CancelledError:
        metrics.record_refusal(mode, "cancelled")
        raise
    if status >= 400:
        metrics.record_refusal(mode, "error" if status >= 500 else "rejected")
    return status, body


async def _answer(service: PCDService, request: ChatCompletionRequest, mode_label: str,
                  raw_request: Any) -> tuple[int, dict[str, Any]]:
    if (refused := service.refusal(request.model)) is not None:
        return refused.status.value, refused.body()
    kwargs = service.template_kwargs(request.chat_template_kwargs)
    try:
        _refuse_unsupported(request)
        options = Options.from_template_kwargs(kwargs)
        spec = await service.checked(parse_schema, kwargs.pop("pcd_schema", None),
                                     service.limits)
        messages = plain_messages(request)
        chat_template = service.chat_template(request)
    except SchemaError as err:
        return HTTPStatus.BAD_REQUEST.value, ErrorAnswer(HTTPStatus.BAD_REQUEST, str(err),
                                                         err.param).body()
    request_id = f"chatcmpl-pcd-{uuid.uuid4().hex}"
    result = await service.run(messages, spec, options, kwargs, chat_template=chat_template,
                               cache_salt=request.cache_salt, request_id=request_id,
                               mode_label=mode_label,
                               tenant=service.api_keys.tenant(raw_request, request.user))
    if isinstance(result, ErrorAnswer):
        return result.status.value, result.body()
    model = request.model or service.state.openai_serving_models.model_name()
    return 200, completion(request_id, model, result.content,
                           result.diagnostics(service.reveals_cache), len(spec.fields))
