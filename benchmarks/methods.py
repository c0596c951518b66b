"""Every method the benchmarks compare, as an HTTP client against one running server: PCD's
chat completion and vLLM's structured-output idioms here, the other doors in `route_methods`.

All methods see the same conversation and the same field list, so differences come from how
each one computes, not from what it is asked. Each call runs under its own fresh `cache_salt`,
so no method ever starts from KV blocks another call (or an earlier repetition) left behind.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Awaitable, Callable

import openai

from benchmarks.client import Client, Outcome, Task, Unsupported, computed, error_text
from benchmarks.route_methods import (floor, pcd_systemone, per_field, vllm_letters,
                                      vllm_systemone)
from vllm_pcd.core.plan import (DEFAULT_FORMULATION, DEFAULT_LAYOUT, Formulation, Layout,
                                instruction_text)
from vllm_pcd.core.schema import SchemaSpec
from vllm_pcd.models import fast_dtype

# The flags every benchmark server runs with: the dtype this CPU serves fastest (bf16 only
# where it is native), cached-token counts in `usage` (the client-side token accounting needs
# them) and the grammar backend for AR JSON.
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}
# PCD answers vLLM's structured-output idioms there too (`serving.structured`); AR JSON, vLLM's
# own grammar decoding, opts out per request (GRAMMAR_DECODING).
PCD_CONFIG = {"structured_outputs": True}


def server_args(pcd_config: dict[str, Any] | None = None, dtype: str | None = None
                ) -> tuple[str, ...]:
    """The benchmark server's flags, `pcd_config` merged into PCD's part of the one
    `--additional-config` (vLLM keeps only the last of a repeated flag), `dtype` in place of
    the fast one."""
    return ("--dtype", dtype or fast_dtype(), "--enable-prompt-tokens-details",
            "--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS),
            "--additional-config", json.dumps({"pcd": {**PCD_CONFIG, **(pcd_config or {})}}))


SERVER_ARGS = server_args()
GRAMMAR_DECODING = {"chat_template_kwargs": {"pcd_structured_outputs": False}}


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
        raise Unsupported(error_text(err)) from err
    diag = resp.model_extra["pcd"]
    scores = {name: [c["score"] for c in f["candidates"]] for name, f in diag["fields"].items()}
    return Outcome("ok", json.loads(resp.choices[0].message.content),
                   tokens_computed=diag["tokens"]["computed"],
                   backbone_calls=diag["backbone_calls"],
                   extra={"tokens": diag["tokens"], "scores": scores,
                          "projection": diag["projection"]})


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
    lines = [instruction_text([(f, None) for f in spec.fields if not f.member],
                              Formulation.named("json"), Layout.named(layout))]
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
        messages=Layout.named(task.layout).with_instruction(
            task.messages, ar_instruction(task.spec, task.layout),
            [f.name for f in task.spec.fields]),
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
    prompt = computed(usage)
    # One forward pass per generated token: the prefill yields the first, each decode step one.
    return Outcome("ok", obj,
                   tokens_computed=None if prompt is None else prompt + usage.completion_tokens - 1,
                   backbone_calls=usage.completion_tokens,
                   extra={"completion_tokens": usage.completion_tokens})


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
# Every method but the floor returns an object to grade.
ANSWERING = tuple(name for name in METHODS if name != "floor")


async def run_method(name: str, client: Client, task: Task, salt: str | None = None) -> Outcome:
    """One timed call under `salt` (default: a fresh one, so it reuses no KV blocks of other
    calls); failures become the outcome's status."""
    start = time.perf_counter()
    try:
        outcome = await METHODS[name](client, task, salt or f"bench-{uuid.uuid4().hex}")
    except Unsupported as err:
        return Outcome(f"unsupported: {err}")
    except Exception as err:  # one failed call must not end a long benchmark
        detail = error_text(err) if isinstance(err, openai.APIStatusError) else repr(err)
        return Outcome(f"error: {detail}")
    outcome.latency_s = time.perf_counter() - start
    return outcome
