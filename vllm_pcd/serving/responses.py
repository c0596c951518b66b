"""The Responses API's structured outputs (`/v1/responses` with `text.format` json_schema, or
vLLM's `structured_outputs`), answered by PCD as `structured` answers chat requests.

The same opt-in (server option, or `chat_template_kwargs.pcd_structured_outputs`) and the same
hand-offs apply, plus what only this API has: a stored or background response, a previous
response to continue, tool or reasoning items in the input, a reasoning effort, output
log-probabilities. The reply is a `response` object whose one message holds the value's
text, with PCD's diagnostics beside it (`pcd`), so the SDK's `responses.parse()` gets its
typed object.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from openai.types.responses import ResponseOutputMessage, ResponseOutputText
from vllm.entrypoints.openai.responses.protocol import ResponsesResponse

from vllm_pcd.core.schema import SchemaError
from vllm_pcd.serving.service import PCDService
from vllm_pcd.serving.structured import (Answered, answer_value, constraint_of, handed_to_vllm,
                                         legacy_refusal, opt_in_refusal, opted_in, requested,
                                         sampling_refusal)

_TEXT_PARTS = ("input_text", "output_text", "text")
_ROLES = ("system", "developer", "user", "assistant")


def _stock_only(handler: Any, request: Any) -> bool:
    """What only vLLM's path keeps: stored or background responses, a conversation held by
    the server, tools' or the model's own items, thinking, output log-probabilities."""
    stored = bool(request.store) and bool(getattr(handler, "enable_store", False))
    return stored or bool(request.background) or bool(request.stream) \
        or request.previous_response_id is not None \
        or bool(getattr(request, "previous_input_messages", None)) \
        or request.prompt is not None or request.reasoning is not None \
        or bool(getattr(request, "enable_response_messages", False)) \
        or request.is_include_output_logprobs() or bool(request.ignore_eos)


def input_messages(request: Any) -> list[dict[str, str]] | None:
    """`instructions` and `input` as text turns, or None where an item is not a plain text
    message (tool calls and outputs, reasoning, images: vLLM's path renders those)."""
    messages = [{"role": "system", "content": request.instructions}] \
        if request.instructions else []
    if isinstance(request.input, str):
        return messages + [{"role": "user", "content": request.input}]
    for item in request.input:
        item = item if isinstance(item, dict) else item.model_dump(exclude_none=True)
        if item.get("type", "message") != "message" or item.get("role") not in _ROLES:
            return None
        content = item.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") in _TEXT_PARTS
                       and isinstance(p.get("text"), str) for p in content):
                return None
            content = "\n".join(p["text"] for p in content)
        if not isinstance(content, str):
            return None
        messages.append({"role": item["role"], "content": content})
    if messages and messages[-1]["role"] == "assistant":
        return None  # vLLM continues that message instead of starting a new one
    return messages


def _format(request: Any) -> tuple[str | None, Any]:
    fmt = getattr(request.text, "format", None) if request.text is not None else None
    return getattr(fmt, "type", None), getattr(fmt, "schema_", None)


async def answer_responses(service: PCDService, handler: Any, request: Any,
                           raw_request: Any = None) -> tuple[int, dict[str, Any]] | None:
    """PCD's answer to a Responses request as (HTTP status, response body), or None for
    vLLM's own path."""
    try:
        if not opted_in(service, request) or service.refusal(request.model) is not None \
                or not service.api_keys.admit(raw_request):
            return None
        kwargs = service.template_kwargs(request.chat_template_kwargs)
        if _stock_only(handler, request) or handed_to_vllm(request, service, kwargs):
            return legacy_refusal(request)
        extra = getattr(request, "model_extra", None) or {}
        constraint = await service.checked(
            constraint_of, *requested(request.structured_outputs, extra, *_format(request)),
            service.limits)
        messages = input_messages(request) if constraint is not None else None
        if messages is None:
            return legacy_refusal(request)
    except SchemaError as err:
        return opt_in_refusal(err)
    defaults = getattr(handler, "default_sampling_params", None)
    if (refused := sampling_refusal(lambda: request.to_sampling_params(1, defaults))):
        return refused.status.value, refused.body()
    # The engine's ids are PCD's own: a client's `request_id` names only the response, so no
    # two calls share admission groups or gates, and no client can abort another's requests.
    request_id = f"resp_pcd_{uuid.uuid4().hex}"
    answered = await answer_value(service, request, constraint, messages, kwargs,
                                  getattr(handler, "chat_template", None),
                                  request.max_output_tokens, request_id)
    if not isinstance(answered, Answered):
        return legacy_refusal(request) if answered is None \
            else (answered.status.value, answered.body())
    return 200, _response(handler, request, answered)


def _response(handler: Any, request: Any, answered: Answered) -> dict[str, Any]:
    """vLLM's own response object for this request (its echoed settings included), holding
    one completed message with the value's text, and PCD's diagnostics."""
    tokens = answered.diagnostics["tokens"]
    room = max(1, handler.model_config.max_model_len - tokens["ideal"])
    sampling = request.to_sampling_params(request.max_output_tokens or room,
                                          getattr(handler, "default_sampling_params", None))
    text = ResponseOutputText(type="output_text", text=answered.content, annotations=[])
    message = ResponseOutputMessage(id=f"msg_{uuid.uuid4().hex}", type="message",
                                    role="assistant", status="completed", content=[text])
    response = ResponsesResponse.from_request(
        request, sampling, model_name=request.model or handler.models.model_name(),
        created_time=int(time.time()), output=[message], status="completed")
    body = response.model_dump(mode="json", exclude_none=True, by_alias=True)
    cached = tokens["ideal"] - min(tokens["ideal"], tokens.get("computed", tokens["ideal"]))
    body["usage"] = {"input_tokens": tokens["ideal"], "output_tokens": answered.decisions,
                     "total_tokens": tokens["ideal"] + answered.decisions,
                     "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
                     "output_tokens_details": {"reasoning_tokens": 0}}
    body["pcd"] = answered.diagnostics
    return body
