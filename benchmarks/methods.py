"""Every method the benchmarks compare, as an HTTP client against one running server.

All methods see the same conversation and the same field list, so differences come from how
each one computes, not from what it is asked. Each call runs under its own fresh `cache_salt`,
so no method ever starts from KV blocks another call (or an earlier repetition) left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import openai

from benchmarks.letter_reads import letter_prompts
from vllm_pcd.models import fast_dtype
from vllm_pcd.core.assemble import assemble
from vllm_pcd.core.execution import RequestReport
from vllm_pcd.core.options import Options
from vllm_pcd.core.plan import Plan, build_plan
from vllm_pcd.core.prompt import (DEFAULT_FORMULATION, DEFAULT_LAYOUT, instruction_text,
                                  with_instruction)
from vllm_pcd.core.schema import SchemaSpec, parse_schema
from vllm_pcd.core.scoring import field_results

# The flags every benchmark server runs with: the dtype this CPU serves fastest (bf16 only
# where it is native), cached-token counts in `usage` (the client-side token accounting needs
# them) and the grammar backend for AR JSON.
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}
# PCD answers vLLM's structured-output idioms there too (`serving.structured`); AR JSON, vLLM's
# own grammar decoding, opts out per request (GRAMMAR_DECODING).
PCD_CONFIG = {"structured_outputs": True}
SERVER_ARGS = ("--dtype", fast_dtype(), "--enable-prompt-tokens-details",
               "--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS),
               "--additional-config", json.dumps({"pcd": PCD_CONFIG}))
GRAMMAR_DECODING = {"chat_template_kwargs": {"pcd_structured_outputs": False}}


class Unsupported(Exception):
    """The server cannot run this method; reported, never fatal."""


@dataclass(frozen=True)
class Task:
    """One question set: the conversation, the schema, and the token plan PCD computes."""

    messages: list[dict[str, Any]]
    schema: dict[str, Any]
    spec: SchemaSpec
    plan: Plan
    layout: str = DEFAULT_LAYOUT  # where every method puts the field list
    tokenizer: Any = field(default=None, repr=False)  # for methods that write their own prompt


def make_task(tokenizer: Any, schema: dict[str, Any], messages: list[dict[str, Any]],
              layout: str = DEFAULT_LAYOUT) -> Task:
    spec = parse_schema(schema)
    return Task(messages, schema, spec, build_plan(tokenizer, spec, messages,
                                                   Options(layout=layout)),
                layout, tokenizer)


def load_tokenizer(model: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model))


@dataclass
class Outcome:
    """What one call of one method gave. `None` means not observable from the client."""

    status: str  # "ok", "unsupported: …" or "error: …"
    object: dict[str, Any] | None = None
    latency_s: float | None = None
    tokens_computed: int | None = None
    backbone_calls: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Client:
    """One OpenAI-compatible server: the async client plus the served model's name."""

    def __init__(self, url: str, timeout_s: float = 600):
        self.api = openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1",
                                      api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"),
                                      max_retries=0, timeout=timeout_s)
        self.model: str | None = None

    async def connect(self) -> "Client":
        self.model = (await self.api.models.list()).data[0].id
        return self

    async def close(self) -> None:
        await self.api.close()


def _computed(usage: Any) -> int | None:
    """Prompt tokens the engine did not find in its prefix cache (needs
    --enable-prompt-tokens-details; None when the server does not report them)."""
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None)
    return None if cached is None else usage.prompt_tokens - cached


def _error_text(err: openai.APIStatusError) -> str:
    body = err.body if isinstance(err.body, dict) else {}
    body = body.get("error", body) if isinstance(body.get("error"), dict) else body
    return f"HTTP {err.status_code}: {body.get('message') or err.message}"


async def pcd(client: Client, task: Task, salt: str, mode: str = "token",
              formulation: str = DEFAULT_FORMULATION, calibration: str = "none",
              joint: bool = False, decision: str = "auto") -> Outcome:
    options = {"pcd_schema": task.schema, "pcd_mode": mode, "pcd_formulation": formulation,
               "pcd_layout": task.layout, "pcd_calibration": calibration, "pcd_joint": joint,
               "pcd_decision": decision}
    try:
        resp = await client.api.chat.completions.create(
            model=client.model, messages=task.messages, temperature=0,
            extra_body={"chat_template_kwargs": options, "cache_salt": salt})
    except openai.BadRequestError as err:
        if mode == "token":
            raise
        raise Unsupported(_error_text(err)) from err
    diag = resp.model_extra["pcd"]
    scores = {name: [c["score"] for c in f["candidates"]] for name, f in diag["fields"].items()}
    return Outcome("ok", json.loads(resp.choices[0].message.content),
                   tokens_computed=diag["tokens"]["computed"],
                   backbone_calls=diag["backbone_calls"],
                   extra={"tokens": diag["tokens"], "scores": scores})


async def pcd_sequence(client: Client, task: Task, salt: str) -> Outcome:
    return await pcd(client, task, salt, mode="sequence")


async def pcd_token_codes(client: Client, task: Task, salt: str) -> Outcome:
    """Token mode with per-field questions and letter codes (the per-field scoring prompt)."""
    return await pcd(client, task, salt, formulation="codes")


async def pcd_token_json_next(client: Client, task: Task, salt: str) -> Outcome:
    """Token mode, every value whole and then the character that follows it in the object."""
    return await pcd(client, task, salt, formulation="json_next")


async def pcd_token_json_tight(client: Client, task: Task, salt: str) -> Outcome:
    """Token mode, values as compact JSON writes them (`{"name":true`), unique prefixes."""
    return await pcd(client, task, salt, formulation="json_tight")


async def pcd_token_cf(client: Client, task: Task, salt: str) -> Outcome:
    """Token mode with content-free calibration (under a fresh salt its prior is computed in
    the same engine steps as the document, so it costs tokens, not latency)."""
    return await pcd(client, task, salt, calibration="content_free")


async def pcd_token_json(client: Client, task: Task, salt: str) -> Outcome:
    """Token mode, enum values up to their unique prefix, booleans whole plus a newline."""
    return await pcd(client, task, salt, formulation="json")


async def pcd_token_joint(client: Client, task: Task, salt: str) -> Outcome:
    """Token mode with every field reading the values chosen before it (`pcd_joint`)."""
    return await pcd(client, task, salt, joint=True)


async def pcd_token_most_probable(client: Client, task: Task, salt: str) -> Outcome:
    """Token mode, each value the most probable one (`pcd_decision`; the default is the
    constrained decoder's greedy path)."""
    return await pcd(client, task, salt, decision="most_probable")


def ar_instruction(spec: SchemaSpec, layout: str = DEFAULT_LAYOUT) -> str:
    """PCD's own field list, values written as JSON, under the JSON formulation's header; a
    label set is one line naming its labels, as the object writes it (a list)."""
    label_sets: dict[tuple[str, ...], list[Any]] = {}
    for f in spec.fields:
        if f.member:
            label_sets.setdefault(f.keys[:-1], [f]).append(f.keys[-1])
    lines = [instruction_text([(f, None) for f in spec.fields if not f.member], "json", layout)]
    for keys, (first, *labels) in label_sets.items():
        about = f" ({first.description})" if first.description else ""
        lines.append(f"- {'.'.join(keys)}{about}: a list of any of "
                     + ", ".join(json.dumps(label) for label in labels))
    return "\n".join(lines)


def grammar_schema(schema: Any) -> Any:
    """The schema without `uniqueItems`, which vLLM's xgrammar backend refuses: the grammar
    still holds a label set's items to its labels (a repeated label is then counted invalid
    by `metrics.is_schema_valid`, and right when the set is)."""
    if isinstance(schema, dict):
        return {k: grammar_schema(v) for k, v in schema.items() if k != "uniqueItems"}
    if isinstance(schema, list):
        return [grammar_schema(v) for v in schema]
    return schema


def ar_max_tokens(task: Task) -> int:
    # Generous: the grammar ends the object (and the request) long before this.
    return 32 + sum(24 + max(len(str(o)) for o in f.options) for f in task.spec.fields)


async def ar_json(client: Client, task: Task, salt: str) -> Outcome:
    """Ordinary autoregressive decoding under vLLM's JSON-schema grammar."""
    return await structured(client, task, salt, "response_format", pcd=False)


async def pcd_response_format(client: Client, task: Task, salt: str) -> Outcome:
    """AR JSON's very request, answered by PCD (`serving.structured`)."""
    return await structured(client, task, salt, "response_format", pcd=True)


async def pcd_guided_choice(client: Client, task: Task, salt: str) -> Outcome:
    return await structured(client, task, salt, "choice", pcd=True)


async def vllm_guided_choice(client: Client, task: Task, salt: str) -> Outcome:
    return await structured(client, task, salt, "choice", pcd=False)


async def structured(client: Client, task: Task, salt: str, idiom: str, pcd: bool) -> Outcome:
    """vLLM's own structured-output idioms (a strict `response_format` schema, or guided
    choice for a one-field task) on the conversation with the field list, answered by PCD or,
    with the request's opt-out, by vLLM's grammar decoding."""
    extra: dict[str, Any] = {"cache_salt": salt, **({} if pcd else GRAMMAR_DECODING)}
    schema = task.schema if pcd else grammar_schema(task.schema)
    constraint: dict[str, Any] = {"response_format": {
        "type": "json_schema", "json_schema": {"name": "answer", "schema": schema,
                                               "strict": True}}}
    if idiom == "choice":
        options = task.spec.fields[0].options
        if len(task.spec.fields) != 1 or not all(isinstance(o, str) for o in options):
            raise Unsupported("guided choice answers one field of strings")
        extra["structured_outputs"], constraint = {"choice": list(options)}, {}
    resp = await client.api.chat.completions.create(
        model=client.model, temperature=0, max_tokens=ar_max_tokens(task), extra_body=extra,
        messages=with_instruction(task.messages, ar_instruction(task.spec, task.layout),
                                  task.layout, [f.name for f in task.spec.fields]),
        **constraint)
    text = resp.choices[0].message.content or ""
    try:
        obj = {task.spec.fields[0].name: text} if idiom == "choice" else json.loads(text)
    except json.JSONDecodeError:
        obj = None
    if (diag := (resp.model_extra or {}).get("pcd")) is not None:
        return Outcome("ok", obj, tokens_computed=diag["tokens"]["computed"],
                       backbone_calls=diag["backbone_calls"], extra={"tokens": diag["tokens"]})
    if pcd:
        raise Unsupported("the server's vLLM path answered it (PCD structured outputs off)")
    usage = resp.usage
    prompt = _computed(usage)
    # One forward pass per generated token: the prefill yields the first, each decode step one.
    return Outcome("ok", obj,
                   tokens_computed=None if prompt is None else prompt + usage.completion_tokens - 1,
                   backbone_calls=usage.completion_tokens,
                   extra={"completion_tokens": usage.completion_tokens})


async def _complete(client: Client, ids: list[int], salt: str,
                    extra_body: dict[str, Any] | None = None, **options: Any) -> Any:
    """One token after a token-id prompt: the completions API applies no chat template."""
    return await client.api.completions.create(
        model=client.model, prompt=ids, max_tokens=1, temperature=0,
        extra_body={"cache_salt": salt, **(extra_body or {})}, **options)


async def per_field(client: Client, task: Task, salt: str) -> Outcome:
    """PCD's computation rebuilt from stock vLLM features: warm the shared prefix with one
    request, then every branch PCD plans (one per token-mode field) as its own concurrent
    request asking for the log-probabilities of exactly the tokens PCD scores there."""
    plan = task.plan
    warm = await _complete(client, list(plan.shared_ids), salt)
    replies = await asyncio.gather(*(
        _complete(client, [*plan.shared_ids, *s.suffix_ids], salt, logprobs=1,
                  extra_body={"logprob_token_ids": list(s.token_ids),
                              "return_tokens_as_token_ids": True})
        for s in plan.scorings))
    tops = [reply.choices[0].logprobs.top_logprobs[0] for reply in replies]
    if any(f"token_id:{t}" not in top for s, top in zip(plan.scorings, tops) for t in s.token_ids):
        return Outcome("unsupported: this vLLM's completions API ignores logprob_token_ids")
    reports = [RequestReport(0, 0, None, {t: top[f"token_id:{t}"] for t in s.token_ids})
               for s, top in zip(plan.scorings, tops)]
    obj = assemble(task.spec, field_results(plan, reports, "sum"))  # PCD's own scoring
    counts = [_computed(r.usage) for r in (warm, *replies)]
    return Outcome("ok", obj, tokens_computed=None if None in counts else sum(counts))


def systemone_question(spec_field: Any, raw: dict[str, Any]) -> dict[str, Any]:
    instructions = raw.get("description") or spec_field.name
    if spec_field.kind == "boolean":
        return {"type": "noul", "instructions": instructions}
    return {"type": "choice", "instructions": instructions,
            "criteria": {o: None for o in spec_field.options}}


async def _decision(client: Client, task: Task, salt: str, by_pcd: bool) -> Outcome:
    """One `/v1/systemone` request: the system turns as its instructions, the rest as its
    state, a question per field."""
    system = [m["content"] for m in task.messages if m["role"] == "system"]
    payload = {
        "model": client.model,
        "state": "\n\n".join(m["content"] for m in task.messages if m["role"] != "system"),
        "questions": {f.name: systemone_question(f, task.schema["properties"][f.name])
                      for f in task.spec.fields},
        "cache_salt": salt,
        **({"instructions": "\n\n".join(system)} if system else {}),
        **({"chat_template_kwargs": {"pcd_layout": task.layout}} if by_pcd else {"pcd": False}),
    }
    try:
        resp = await client.api.post("/systemone", body=payload, cast_to=object)
    except openai.APIStatusError as err:
        if err.status_code in (400, 404, 405, 501):
            raise Unsupported(_error_text(err)) from err
        raise
    answers = resp["answers"]
    obj = {f.name: (answers[f.name]["noul"] >= 0.5 if f.kind == "boolean"
                    else answers[f.name]["choice"]) for f in task.spec.fields}
    diag = resp.get("pcd")
    return Outcome("ok", obj, tokens_computed=diag["tokens"]["computed"] if diag else None,
                   backbone_calls=diag["backbone_calls"] if diag else None)


async def pcd_systemone(client: Client, task: Task, salt: str) -> Outcome:
    """vLLM's structured-decisions request shape, answered by PCD."""
    return await _decision(client, task, salt, by_pcd=True)


async def vllm_systemone(client: Client, task: Task, salt: str) -> Outcome:
    """The same request answered by vLLM's own handler (a few Qwen3-family models only): one
    1-token read per question, with its own prompt and letter codes."""
    return await _decision(client, task, salt, by_pcd=False)


async def vllm_letters(client: Client, task: Task, salt: str) -> Outcome:
    """vLLM's `/v1/systemone` read (one request per question, letter or yes/no labels),
    rebuilt on the completions API for any model (`letter_reads`)."""
    try:
        prompts = list(letter_prompts(task.tokenizer, task.messages, task.spec))
    except ValueError as err:
        raise Unsupported(str(err)) from err
    replies = await asyncio.gather(*(
        _complete(client, ids, salt, logprobs=1,
                  extra_body={"logprob_token_ids": labels, "return_tokens_as_token_ids": True})
        for ids, labels in prompts))
    obj = {}
    for f, (_, labels), reply in zip(task.spec.fields, prompts, replies):
        top = reply.choices[0].logprobs.top_logprobs[0]
        scores = [top[f"token_id:{t}"] for t in labels]
        obj[f.name] = f.options[scores.index(max(scores))]
    counts = [_computed(r.usage) for r in replies]
    return Outcome("ok", obj, tokens_computed=None if None in counts else sum(counts))


def floor_ids(plan: Plan) -> list[int]:
    """The shared context, then every distinct branch position once (a token several branches
    share, as in a value trie, counts once): `len == tokens.ideal` of the PCD diagnostics."""
    ids, seen = list(plan.shared_ids), set()
    for s in plan.scorings:
        for j, token in enumerate(s.suffix_ids):
            if (s.field_index, s.suffix_ids[:j + 1]) not in seen:
                seen.add((s.field_index, s.suffix_ids[:j + 1]))
                ids.append(token)
    return ids


async def floor(client: Client, task: Task, salt: str) -> Outcome:
    """The least any method must compute: one prefill over the shared context and every
    branch position, once each. It answers nothing."""
    reply = await _complete(client, floor_ids(task.plan), salt)
    return Outcome("ok", None, tokens_computed=_computed(reply.usage), backbone_calls=1)


METHODS: dict[str, Callable[[Client, Task, str], Awaitable[Outcome]]] = {
    "pcd_token": pcd,
    "pcd_sequence": pcd_sequence,
    "pcd_token_codes": pcd_token_codes,
    "pcd_token_json_next": pcd_token_json_next,
    "pcd_token_json": pcd_token_json,
    "pcd_token_json_tight": pcd_token_json_tight,
    "pcd_token_cf": pcd_token_cf,
    "pcd_token_joint": pcd_token_joint,
    "pcd_token_most_probable": pcd_token_most_probable,
    "ar_json": ar_json,
    "pcd_response_format": pcd_response_format,
    "pcd_guided_choice": pcd_guided_choice,
    "vllm_guided_choice": vllm_guided_choice,
    "per_field": per_field,
    "pcd_systemone": pcd_systemone,
    "vllm_systemone": vllm_systemone,
    "vllm_letters": vllm_letters,
    "floor": floor,
}
ANSWERING = ("pcd_token", "pcd_sequence", "pcd_token_codes", "pcd_token_json_next",
             "pcd_token_json", "pcd_token_json_tight", "pcd_token_cf", "pcd_token_joint",
             "pcd_token_most_probable", "ar_json", "pcd_response_format", "pcd_guided_choice", "vllm_guided_choice",
             "per_field", "pcd_systemone", "vllm_systemone", "vllm_letters")


async def run_method(name: str, client: Client, task: Task, salt: str | None = None) -> Outcome:
    """One timed call under `salt` (default: a fresh one, so it reuses no KV blocks of other
    calls); failures become the outcome's status."""
    start = time.perf_counter()
    try:
        outcome = await METHODS[name](client, task, salt or f"bench-{uuid.uuid4().hex}")
    except Unsupported as err:
        return Outcome(f"unsupported: {err}")
    except Exception as err:  # one failed call must not end a long benchmark
        detail = _error_text(err) if isinstance(err, openai.APIStatusError) else repr(err)
        return Outcome(f"error: {detail}")
    outcome.latency_s = time.perf_counter() - start
    return outcome
