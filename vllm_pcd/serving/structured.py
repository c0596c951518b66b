"""vLLM's own structured-output idioms, answered by PCD where it answers them exactly.

Most clients that classify text already send vLLM's guided choice (`structured_outputs.choice`,
`guided_choice` in older clients) or a `response_format` JSON schema, and get token-by-token
grammar decoding at AR JSON's cost. Where the server opts in
(`--additional-config '{"pcd": {"structured_outputs": true}}'`) or the request does
(`chat_template_kwargs.pcd_structured_outputs`, which also opts out), PCD answers such a
request when its constraint is a finite choice and it asks nothing that grammar decoding would
answer otherwise (a stream, several choices, log-probabilities, stop strings, a thinking
phase). The model reads the conversation as the client sent it (the `bare` layout), and the
reply is what vLLM's would be: the choice's own text, or the compact object. Everything else
goes to vLLM's own path untouched.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from vllm_pcd.core.assemble import object_of, to_json
from vllm_pcd.core.options import Options
from vllm_pcd.core.plan import raw_prefixes
from vllm_pcd.core.sampling import draw_values
from vllm_pcd.core.schema import SchemaError, SchemaSpec, parse_schema, shown
from vllm_pcd.serving.errors import ErrorAnswer
from vllm_pcd.serving.openai_shapes import completion, plain_messages
from vllm_pcd.serving.service import PCDService

OPT_IN = "pcd_structured_outputs"
CHOICE_FIELD = "choice"
# What grammar decoding would answer differently from PCD's one pass over the values.
_STOCK_WHEN = {"stream": "a stream", "logprobs": "log-probabilities", "tools": "tools",
               "stop": "stop strings", "stop_token_ids": "stop tokens",
               "prompt_logprobs": "prompt log-probabilities", "use_beam_search": "beam search",
               "continue_final_message": "a continued message", "echo": "an echo",
               "logit_bias": "logit biases", "allowed_token_ids": "allowed tokens",
               "bad_words": "bad words", "min_tokens": "a minimum length"}
# Token-level sampling controls, and the value at which each changes nothing.
_NEUTRAL = {"frequency_penalty": (None, 0.0), "presence_penalty": (None, 0.0),
            "repetition_penalty": (None, 1.0), "top_k": (None, 0, -1), "min_p": (None, 0.0)}


@dataclass(frozen=True)
class Constraint:
    """A structured-output request as PCD answers it: its schema and how it is posed."""

    spec: SchemaSpec
    options: Options
    choice: bool  # the reply is the chosen value's own text, not an object


def opted_in(service: PCDService, request: Any) -> bool:
    """The request's own choice, else the server's; the key is taken out of the template
    kwargs either way, so vLLM's path renders the request as the client meant it."""
    kwargs = request.chat_template_kwargs or {}
    if OPT_IN not in kwargs:
        return service.structured_outputs
    value = kwargs.pop(OPT_IN)
    if not isinstance(value, bool):
        raise SchemaError(f"chat_template_kwargs.{OPT_IN} must be a boolean, got {shown(value)}",
                          param=f"chat_template_kwargs.{OPT_IN}", rule="structured_outputs")
    return value


def constraint_of(request: Any, service: PCDService, kwargs: dict[str, Any]
                  ) -> Constraint | None:
    """The request's finite-choice constraint, or None where vLLM's path should answer it
    (no constraint, one PCD cannot answer exactly, or options PCD would answer otherwise).
    `kwargs`: the template kwargs the request renders with."""
    if any(getattr(request, name, None) for name in _STOCK_WHEN) or (request.n or 1) != 1 \
            or getattr(request, "top_logprobs", None) or request.add_generation_prompt is False \
            or any(getattr(request, k, None) not in v for k, v in _NEUTRAL.items()):
        return None
    if service.reasoning and kwargs.get("enable_thinking") is not False:
        return None  # vLLM would let the model think before the constrained answer
    choice, schema = _constraint(request)
    try:
        if choice is not None:
            if not isinstance(choice, list) or not choice or raw_prefixes(
                    [c for c in choice if isinstance(c, str)]):
                return None  # nothing after the reply would tell one choice from another
            spec = parse_schema({"type": "object", "additionalProperties": False,
                                 "required": [CHOICE_FIELD],
                                 "properties": {CHOICE_FIELD: {"type": "string", "enum": choice}}},
                                service.limits)
            return Constraint(spec, Options(formulation="choice", layout="bare"), True)
        if schema is not None:
            return Constraint(parse_schema(schema, service.limits), Options(layout="bare"), False)
    except SchemaError:
        return None
    return None


def _constraint(request: Any) -> tuple[Any, Any]:
    """(choice list, JSON schema) the request constrains its reply to, either None; (None,
    None) for any other constraint (regex, grammar, a JSON object of any shape, tags)."""
    params = getattr(request, "structured_outputs", None)
    extra = getattr(request, "model_extra", None) or {}
    fmt = getattr(request, "response_format", None)
    others = [getattr(params, k, None) for k in ("regex", "grammar", "json_object",
                                                 "structural_tag", "whitespace_pattern")]
    if any(v not in (None, False) for v in others):
        return None, None
    choice = getattr(params, "choice", None) or extra.get("guided_choice")
    schema = getattr(params, "json", None) or extra.get("guided_json")
    if fmt is not None and getattr(fmt, "type", None) == "json_schema":
        schema = getattr(fmt.json_schema, "json_schema", None)
    elif fmt is not None and getattr(fmt, "type", None) != "text":
        return None, None
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return None, None
    return (choice, None) if choice is not None and schema is None else (None, schema)


def sampling_of(service: PCDService, request: Any) -> tuple[float, float, int | None]:
    """(temperature, top_p, seed) as vLLM's path would sample: the request's, else the
    server's generation defaults, else OpenAI's (1.0)."""
    defaults = getattr(service.serving_chat, "default_sampling_params", None) or {}
    temperature = request.temperature if request.temperature is not None \
        else defaults.get("temperature", 1.0)
    top_p = request.top_p if request.top_p is not None else defaults.get("top_p", 1.0)
    return float(temperature), float(top_p), request.seed


async def answer_structured(service: PCDService, request: Any
                            ) -> tuple[int, dict[str, Any]] | None:
    """PCD's answer to a structured-output request as (HTTP status, OpenAI body), or None
    for vLLM's own path."""
    try:
        if not opted_in(service, request) or service.refusal(request.model) is not None:
            return None
        kwargs = service.template_kwargs(request.chat_template_kwargs)
        constraint = constraint_of(request, service, kwargs)
        if constraint is None:
            return None
        messages = plain_messages(request)
        chat_template = service.chat_template(request)
    except SchemaError as err:
        if err.param.startswith(f"chat_template_kwargs.{OPT_IN}"):
            return 400, ErrorAnswer(HTTPStatus.BAD_REQUEST, str(err), err.param).body()
        return None  # content or a template PCD does not take: vLLM's path judges it
    request_id = f"chatcmpl-pcd-{uuid.uuid4().hex}"
    result = await service.run(messages, constraint.spec, constraint.options, kwargs,
                               chat_template=chat_template, cache_salt=request.cache_salt,
                               request_id=request_id, mode_label="structured")
    if isinstance(result, ErrorAnswer):
        # a PCD limit or a full planning queue: vLLM's path can still answer it
        return None if result.status.value in (400, 429) else (result.status.value, result.body())
    temperature, top_p, seed = sampling_of(service, request)
    values = draw_values(result.fields, temperature, top_p, seed)
    content = values[0] if constraint.choice else to_json(object_of(constraint.spec, values))
    limit = request.max_completion_tokens or request.max_tokens
    if limit is not None and await service.count_tokens(content) >= limit:
        return None  # vLLM's path stops it at max_tokens, finish_reason "length"
    diagnostics = result.diagnostics(service.reveals_cache)
    diagnostics["sampling"] = {"temperature": temperature, "top_p": top_p, "seed": seed}
    model = request.model or service.state.openai_serving_models.model_name()
    return 200, completion(request_id, model, content, diagnostics, len(constraint.spec.fields))
