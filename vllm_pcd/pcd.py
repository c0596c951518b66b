"""One PCD request from schema to typed object: plan → engine → assemble.

Shared by the HTTP route and the offline API so both answer identically.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from vllm_pcd.assemble import FieldResult, assemble, field_result, to_json
from vllm_pcd.engine import Execution, run_offline, run_online
from vllm_pcd.plan import Plan, build_plan
from vllm_pcd.schema import Limits, SchemaSpec, parse_schema


@dataclass(frozen=True)
class PCDResult:
    object: dict[str, Any]
    fields: tuple[FieldResult, ...]
    plan: Plan
    execution: Execution
    plan_s: float
    mode: str = "token"

    @property
    def content(self) -> str:
        return to_json(self.object)

    def diagnostics(self) -> dict[str, Any]:
        ex = self.execution
        shared = len(self.plan.shared_ids)
        return {
            "mode": self.mode,
            "calibrated": False,
            "backbone_calls": ex.backbone_calls,
            "tokens": {
                "shared": shared,
                "branch": self.plan.branch_tokens,
                "ideal": shared + self.plan.branch_tokens,
                "computed": ex.tokens_computed,
            },
            "timings": {
                "plan_s": self.plan_s,
                "prefill_s": ex.prefill_s,
                "branches_s": ex.branches_s,
                "total_s": self.plan_s + ex.prefill_s + ex.branches_s,
            },
            "fields": {r.field.name: r.diagnostics() for r in self.fields},
        }


def _results(plan: Plan, execution: Execution) -> tuple[FieldResult, ...]:
    return tuple(
        field_result(fp.field, execution.code_logprobs(i, fp.code_ids),
                     {"codes": [c.strip() for c in fp.codes]})
        for i, fp in enumerate(plan.fields))


def finish(schema: SchemaSpec, plan: Plan, execution: Execution, plan_s: float) -> PCDResult:
    results = _results(plan, execution)
    return PCDResult(assemble(schema, results), results, plan, execution, plan_s)


def as_messages(text_or_messages: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(text_or_messages, str):
        return [{"role": "user", "content": text_or_messages}]
    return list(text_or_messages)


def constrained(llm: Any, text_or_messages: str | list[dict[str, Any]], schema: dict[str, Any],
                *, limits: Limits = Limits(), cache_salt: str | None = None,
                template_kwargs: dict[str, Any] | None = None) -> PCDResult:
    """Answer `schema` about a text (or a chat) with a `vllm.LLM`, by token-mode PCD."""
    start = time.perf_counter()
    spec = parse_schema(schema, limits)
    plan = build_plan(llm.get_tokenizer(), spec, as_messages(text_or_messages), limits,
                      template_kwargs)
    plan_s = time.perf_counter() - start
    execution = run_offline(llm, plan, branches_per_batch=limits.max_branches_per_batch,
                            cache_salt=cache_salt)
    return finish(spec, plan, execution, plan_s)


async def constrained_online(engine: Any, tokenizer: Any, messages: list[dict[str, Any]],
                             spec: SchemaSpec, *, limits: Limits,
                             template_kwargs: dict[str, Any] | None = None,
                             chat_template: str | None = None, request_id: str | None = None,
                             cache_salt: str | None = None) -> PCDResult:
    start = time.perf_counter()
    plan = build_plan(tokenizer, spec, messages, limits, template_kwargs, chat_template)
    plan_s = time.perf_counter() - start
    execution = await run_online(engine, plan, branches_per_batch=limits.max_branches_per_batch,
                                 request_id=request_id, cache_salt=cache_salt)
    return finish(spec, plan, execution, plan_s)
