"""The methods that reach the model through other doors than PCD's chat completion: stock
vLLM's completions API (PCD's branches rebuilt as requests, vLLM's letter reads, the floor)
and the decision route `/v1/systemone`, answered by PCD or by vLLM."""

from __future__ import annotations

import asyncio
from typing import Any

import openai

from benchmarks.client import Client, Outcome, Task, Unsupported, complete, computed, error_text
from benchmarks.letter_reads import letter_prompts
from vllm_pcd.core.scoring import RequestReport, assemble, field_results
from vllm_pcd.core.plan import Plan


async def per_field(client: Client, task: Task, salt: str) -> Outcome:
    """PCD's computation rebuilt from stock vLLM features: warm the shared prefix with one
    request, then every branch PCD plans (one per token-mode field) as its own concurrent
    request asking for the log-probabilities of exactly the tokens PCD scores there."""
    plan = task.plan
    warm = await complete(client, list(plan.shared_ids), salt)
    replies = await asyncio.gather(*(
        complete(client, [*plan.shared_ids, *s.suffix_ids], salt, logprobs=1,
                  extra_body={"logprob_token_ids": list(s.token_ids),
                              "return_tokens_as_token_ids": True})
        for s in plan.scorings))
    tops = [reply.choices[0].logprobs.top_logprobs[0] for reply in replies]
    if any(f"token_id:{t}" not in top for s, top in zip(plan.scorings, tops) for t in s.token_ids):
        return Outcome("unsupported: this vLLM's completions API ignores logprob_token_ids")
    reports = [RequestReport(0, 0, None, {t: top[f"token_id:{t}"] for t in s.token_ids})
               for s, top in zip(plan.scorings, tops)]
    obj = assemble(task.spec, field_results(plan, reports, "sum"))  # PCD's own scoring
    counts = [computed(r.usage) for r in (warm, *replies)]
    return Outcome("ok", obj, tokens_computed=None if None in counts else sum(counts))


def systemone_question(spec_field: Any, raw: dict[str, Any]) -> dict[str, Any]:
    instructions = raw.get("description") or spec_field.name
    if spec_field.kind == "boolean":
        return {"type": "noul", "instructions": instructions}
    return {"type": "choice", "instructions": instructions,
            "criteria": {o: None for o in spec_field.options}}


async def decision_route(client: Client, task: Task, salt: str, by_pcd: bool) -> Outcome:
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
            raise Unsupported(error_text(err)) from err
        raise
    answers = resp["answers"]
    obj = {f.name: (answers[f.name]["noul"] >= 0.5 if f.kind == "boolean"
                    else answers[f.name]["choice"]) for f in task.spec.fields}
    diag = resp.get("pcd")
    return Outcome("ok", obj, tokens_computed=diag["tokens"]["computed"] if diag else None,
                   backbone_calls=diag["backbone_calls"] if diag else None)


async def pcd_systemone(client: Client, task: Task, salt: str) -> Outcome:
    """vLLM's structured-decisions request shape, answered by PCD."""
    return await decision_route(client, task, salt, by_pcd=True)


async def vllm_systemone(client: Client, task: Task, salt: str) -> Outcome:
    """The same request answered by vLLM's own handler (a few Qwen3-family models only): one
    1-token read per question, with its own prompt and letter codes."""
    return await decision_route(client, task, salt, by_pcd=False)


async def vllm_letters(client: Client, task: Task, salt: str) -> Outcome:
    """vLLM's `/v1/systemone` read (one request per question, letter or yes/no labels),
    rebuilt on the completions API for any model (`letter_reads`)."""
    try:
        prompts = list(letter_prompts(task.tokenizer, task.messages, task.spec))
    except ValueError as err:
        raise Unsupported(str(err)) from err
    replies = await asyncio.gather(*(
        complete(client, ids, salt, logprobs=1,
                  extra_body={"logprob_token_ids": labels, "return_tokens_as_token_ids": True})
        for ids, labels in prompts))
    obj = {}
    for f, (_, labels), reply in zip(task.spec.fields, prompts, replies):
        top = reply.choices[0].logprobs.top_logprobs[0]
        scores = [top[f"token_id:{t}"] for t in labels]
        obj[f.name] = f.options[scores.index(max(scores))]
    counts = [computed(r.usage) for r in replies]
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
    reply = await complete(client, floor_ids(task.plan), salt)
    return Outcome("ok", None, tokens_computed=computed(reply.usage), backbone_calls=1)
