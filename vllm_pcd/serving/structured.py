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

import functools
import json
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from vllm_pcd.core.schema import (Limits, SchemaError, SchemaSpec, object_of, parse_schema, shown,
                                  to_json)
from vllm_pcd.core.plan import Options, raw_prefixes
from vllm_pcd.core.scoring import draw_values
from vllm_pcd.serving.errors import ErrorAnswer, client_fault
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

    schema: dict[str, Any]  # closed, as PCD parsed it
    spec: SchemaSpec
    options: Options
    choice: bool  # the reply is the chosen value's own text, not an object


def own_choice(kwargs: dict[str, Any]) -> bool | None:
    """The request's own opt-in (True) or opt-out (False), None where it makes none. The key
    is taken out of `kwargs`, so vLLM's path renders the request as the client meant it."""
    if OPT_IN not in kwargs:
        return None
    value = kwargs.pop(OPT_IN)
    if not isinstance(value, bool):
        raise SchemaError(f"chat_template_kwargs.{OPT_IN} must be a boolean, got {shown(value)}",
                          param=f"chat_template_kwargs.{OPT_IN}", rule="structured_outputs")
    return value


def opted_in(service: PCDService, request: Any) -> bool:
    """The request's own choice, else the server's."""
    own = own_choice(request.chat_template_kwargs or {})
    return service.structured_outputs if own is None else own


def handed_to_vllm(request: Any, service: PCDService, kwargs: dict[str, Any]) -> bool:
    """Whether the request asks something grammar decoding answers otherwise than PCD's one
    pass over the values (the same names on chat and Responses requests). `kwargs`: the
    template kwargs the request renders with."""
    return any(getattr(request, name, None) for name in _STOCK_WHEN) \
        or (getattr(request, "n", 1) or 1) != 1 or bool(getattr(request, "top_logprobs", None)) \
        or getattr(request, "add_generation_prompt", True) is False \
        or any(getattr(request, k, None) not in v for k, v in _NEUTRAL.items()) \
        or (service.reasoning and kwargs.get("enable_thinking") is not False)  # thinks first


def constraint_of(choice: Any, schema: Any, limits: Limits) -> Constraint | None:
    """The finite-choice constraint of a guided `choice` list or a JSON `schema`, or None where
    PCD cannot answer it exactly."""
    try:
        if choice is not None:
            if not isinstance(choice, list) or not choice:
                return None
            schema = {"type": "object", "additionalProperties": False,
                      "required": [CHOICE_FIELD],
                      "properties": {CHOICE_FIELD: {"type": "string", "enum": choice}}}
            spec = parse_schema(schema, limits)  # measured and bounded before the next check
            if raw_prefixes([o for o in spec.fields[0].options if isinstance(o, str)]):
                return None  # nothing after the reply would tell one choice from another
            return Constraint(schema, spec, Options(formulation="choice", layout="bare"), True)
        if isinstance(schema, dict):
            spec = parse_schema(schema, limits)
            if any(f.member for f in spec.fields):
                # The client's prompt asks for a list, which one yes/no branch per label
                # (`{"topics": {"sport":`) does not continue: measured worse than grammar
                # decoding there (README, "Accuracy, structured outputs and label sets"), so
                # vLLM's path answers.
                return None
            return Constraint(schema, spec, Options(layout="bare"), False)
    except SchemaError:
        return None
    return None


def requested(params: Any, extra: dict[str, Any], fmt_type: str | None, fmt_schema: Any
              ) -> tuple[Any, Any]:
    """(choice list, JSON schema) a reply is constrained to, either None; (None, None) for any
    other constraint (regex, grammar, a JSON object of any shape, tags). `params`: vLLM's
    `structured_outputs`; `extra`: the body's unknown keys (legacy `guided_*`); the format's
    type and schema (`response_format`, or the Responses API's `text.format`)."""
    others = [getattr(params, k, None) for k in ("regex", "grammar", "json_object",
                                                 "structural_tag", "whitespace_pattern")]
    if any(v not in (None, False) for v in others):
        return None, None
    choice = getattr(params, "choice", None) or extra.get("guided_choice")
    schema = getattr(params, "json", None) or extra.get("guided_json")
    if fmt_type == "json_schema":
        schema = fmt_schema
    elif fmt_type not in (None, "text"):
        return None, None
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return None, None
    return (choice, None) if choice is not None and schema is None else (None, schema)


def chat_constraint(request: Any, service: PCDService, kwargs: dict[str, Any]
                    ) -> Constraint | None:
    """A chat request's finite-choice constraint, or None for vLLM's path."""
    if handed_to_vllm(request, service, kwargs):
        return None
    fmt = getattr(request, "response_format", None)
    fmt_schema = getattr(getattr(fmt, "json_schema", None), "json_schema", None)
    return constraint_of(*requested(getattr(request, "structured_outputs", None),
                                    getattr(request, "model_extra", None) or {},
                                    getattr(fmt, "type", None), fmt_schema), service.limits)


def sampling_of(service: PCDService, request: Any) -> tuple[float, float, int | None]:
    """(temperature, top_p, seed) as vLLM's path would sample: the request's, else the
    server's generation defaults, else OpenAI's (1.0)."""
    defaults = getattr(service.serving_chat, "default_sampling_params", None) or {}
    temperature = request.temperature if request.temperature is not None \
        else defaults.get("temperature", 1.0)
    top_p = request.top_p if request.top_p is not None else defaults.get("top_p", 1.0)
    return float(temperature), float(top_p), request.seed


def sampling_refusal(make_params: Any) -> ErrorAnswer | None:
    """vLLM's own validation of the request's sampling options (`make_params` builds its
    SamplingParams), at the door before any work: what stock vLLM refuses, PCD refuses
    with the same 400."""
    try:
        make_params()
    except ValueError as err:
        return client_fault(err) or ErrorAnswer(HTTPStatus.BAD_REQUEST, shown(str(err)),
                                                getattr(err, "parameter", None))
    return None


LEGACY_KEYS = {"guided_choice": "structured_outputs.choice", "guided_json": "response_format"}


def legacy_refusal(request: Any) -> tuple[int, dict[str, Any]] | None:
    """A 400 for a legacy `guided_*` body that PCD hands to vLLM, which no longer reads those
    keys and would answer it unconstrained: the same body is then constrained on every path
    or refused, never free text depending on load. None for any other body."""
    used = [k for k in LEGACY_KEYS if k in (getattr(request, "model_extra", None) or {})]
    if not used:
        return None
    return 400, ErrorAnswer(
        HTTPStatus.BAD_REQUEST, f"{used[0]} is answered only where vllm-pcd scores it (a finite "
        "choice, no stream, log-probabilities or other grammar-only option, within PCD's "
        f"limits); this vLLM ignores {used[0]} otherwise: send {LEGACY_KEYS[used[0]]}",
        used[0]).body()


def shortest_reply(constraint: Constraint, encode: Any) -> int:
    """Tokens of the shortest reply PCD could write (each field's fewest-token value): a
    token limit below it goes to vLLM's path before any engine work."""
    if constraint.choice:
        return min(len(encode(choice)) for choice in constraint.spec.fields[0].options)
    values = [min(f.options, key=lambda v: len(encode(json.dumps(v, ensure_ascii=False))))
              for f in constraint.spec.fields]
    return len(encode(to_json(object_of(constraint.spec, values))))


def reply_text(constraint: Constraint, fields: Any, temperature: float, top_p: float,
               seed: int | None) -> str:
    """The reply as vLLM's path writes it: the drawn choice's text, or the compact object."""
    values = draw_values(fields, temperature, top_p, seed)
    return values[0] if constraint.choice else to_json(object_of(constraint.spec, values))


@dataclass(frozen=True)
class Answered:
    """The reply's text as vLLM's path would write it, with PCD's diagnostics."""

    content: str
    diagnostics: dict[str, Any]
    decisions: int


async def answer_value(service: PCDService, request: Any, constraint: Constraint,
                       messages: list[dict[str, str]], kwargs: dict[str, Any],
                       chat_template: str | None, limit: int | None, request_id: str
                       ) -> Answered | ErrorAnswer | None:
    """PCD's value for a structured-output request, drawn as vLLM's path would sample; None
    where vLLM's path should answer after all (a PCD limit or a full planning queue, or a
    value longer than `limit` tokens, which vLLM's path stops at with `length`)."""
    if limit is not None and limit <= await service.checked(
            shortest_reply, constraint, functools.partial(service.tokenizer.encode,
                                                          add_special_tokens=False)):
        return None  # no reply fits: decided before any engine work
    result = await service.run(messages, constraint.spec, constraint.options, kwargs,
                               chat_template=chat_template, cache_salt=request.cache_salt,
                               request_id=request_id, mode_label="structured")
    if isinstance(result, ErrorAnswer):
        return None if result.status.value in (400, 429) else result
    temperature, top_p, seed = sampling_of(service, request)
    content = reply_text(constraint, result.fields, temperature, top_p, seed)
    if limit is not None and await service.count_tokens(content) >= limit:
        return None
    diagnostics = result.diagnostics(service.reveals_cache)
    diagnostics["sampling"] = {"temperature": temperature, "top_p": top_p, "seed": seed}
    return Answered(content, diagnostics, len(constraint.spec.fields))


def opt_in_refusal(err: SchemaError) -> tuple[int, dict[str, Any]] | None:
    """A 400 for a junk opt-in value; None for any other error, which vLLM's path judges."""
    if err.param.startswith(f"chat_template_kwargs.{OPT_IN}"):
        return 400, ErrorAnswer(HTTPStatus.BAD_REQUEST, str(err), err.param).body()
    return None


async def answer_structured(service: PCDService, request: Any
                            ) -> tuple[int, dict[str, Any]] | None:
    """PCD's answer to a structured-output chat request as (HTTP status, OpenAI body), or None
    for vLLM's own path."""
    try:
        if not opted_in(service, request) or service.refusal(request.model) is not None:
            return None
        kwargs = service.template_kwargs(request.chat_template_kwargs)
        constraint = await service.checked(chat_constraint, request, service, kwargs)
        if constraint is None:
            return legacy_refusal(request)
        messages = plain_messages(request)
        chat_template = service.chat_template(request)
    except SchemaError as err:
        return opt_in_refusal(err)
    defaults = getattr(service.serving_chat, "default_sampling_params", None) or {}
    if (refused := sampling_refusal(lambda: request.to_sampling_params(1, defaults))):
        return refused.status.value, refused.body()
    request_id = f"chatcmpl-pcd-{uuid.uuid4().hex}"
    answered = await answer_value(service, request, constraint, messages, kwargs, chat_template,
                                  request.max_completion_tokens or request.max_tokens, request_id)
    if not isinstance(answered, Answered):
        return legacy_refusal(request) if answered is None \
            else (answered.status.value, answered.body())
    model = request.model or service.state.openai_serving_models.model_name()
    return 200, completion(request_id, model, answered.content, answered.diagnostics,
                           answered.decisions)
