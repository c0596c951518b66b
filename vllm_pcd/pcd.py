"""One PCD request from schema to typed object: plan → engine → assemble.

Shared by the HTTP route and the offline API so both answer identically.
"""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from vllm.logger import init_logger

from vllm_pcd import internals
from vllm_pcd.assemble import FieldResult, assemble, field_result, to_json
from vllm_pcd.engine import Execution, run_offline, run_online
from vllm_pcd.internals.lm_head import configured_route
from vllm_pcd.plan import DEFAULT_FORMULATION, FieldPlan, Plan, build_plan
from vllm_pcd.schema import Limits, SchemaError, SchemaSpec, parse_schema
from vllm_pcd.sequence import NORMALIZATIONS, SequenceFieldPlan, node_lookup

logger = init_logger("vllm.pcd")
# Planning (chat template, tokenizer passes) blocks for milliseconds to seconds: on the API
# server it runs here, one plan at a time, never on the event loop.
_PLANNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcd-plan")


@dataclass(frozen=True)
class PCDResult:
    object: dict[str, Any]
    fields: tuple[FieldResult, ...]
    plan: Plan
    execution: Execution
    plan_s: float
    projection_route: str | None = None  # the restricted LM head's route, when it is on

    @property
    def content(self) -> str:
        return to_json(self.object)

    def projection(self) -> dict[str, Any]:
        """What the worker's LM head did for this request, as measured by its outputs
        (`engine.probe_id`): how many engine requests it projected onto their allowed ids
        and, when any, the route it serves them with; `fallbacks` counts the requests that
        asked for the restricted head and got the full one."""
        measured = sum(b.restricted for b in self.execution.branches)
        asked = sum(b.asked_restricted for b in self.execution.branches)
        return {"route": self.projection_route if measured else None,
                "restricted_requests": measured, "fallbacks": asked - measured}

    def diagnostics(self) -> dict[str, Any]:
        ex = self.execution
        shared = len(self.plan.shared_ids)
        modes = {r.extra["mode"] for r in self.fields}
        return {
            "mode": modes.pop() if len(modes) == 1 else "mixed",
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
            "projection": self.projection(),
            "fields": {r.field.name: r.diagnostics() for r in self.fields},
        }


def _token_result(fp: FieldPlan, got: dict[int, float]) -> FieldResult:
    return field_result(fp.field, [got[t] for t in fp.code_ids],
                        {"mode": "token", "codes": [c.strip() for c in fp.codes]})


def _sequence_result(fp: SequenceFieldPlan, node_results: list[dict[int, float]],
                     normalization: str) -> FieldResult:
    sums = fp.candidate_logprobs(node_lookup(fp.nodes, node_results))
    if fp.mode == "token":  # unique prefixes: the joint probability is the score
        normalization = "sum"
    normalized = fp.scores(sums, normalization)
    per_candidate = [{"logprob_sum": total, "tokens": fp.value_tokens(i),
                      "normalized": normalized[i]} for i, total in enumerate(sums)]
    return field_result(fp.field, normalized,
                        {"mode": fp.mode, "normalization": normalization}, per_candidate)


def _results(plan: Plan, execution: Execution, normalization: str) -> tuple[FieldResult, ...]:
    by_field: dict[int, list[dict[int, float]]] = {}
    for scoring, report in zip(plan.scorings(), execution.branches):
        by_field.setdefault(scoring.field_index, []).append(report.logprobs)
    return tuple(
        _token_result(fp, by_field[i][0]) if isinstance(fp, FieldPlan)
        else _sequence_result(fp, by_field[i], normalization)
        for i, fp in enumerate(plan.fields))


def finish(schema: SchemaSpec, plan: Plan, execution: Execution, plan_s: float,
           normalization: str = "sum", projection_route: str | None = None) -> PCDResult:
    results = _results(plan, execution, normalization)
    return PCDResult(assemble(schema, results), results, plan, execution, plan_s,
                     projection_route)


def check_normalization(normalization: str) -> str:
    if normalization not in NORMALIZATIONS:
        raise SchemaError(f"pcd_normalization must be one of {list(NORMALIZATIONS)}",
                          param="pcd_normalization", rule="normalization")
    return normalization


def as_messages(text_or_messages: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(text_or_messages, str):
        return [{"role": "user", "content": text_or_messages}]
    return list(text_or_messages)


def constrained(llm: Any, text_or_messages: str | list[dict[str, Any]], schema: dict[str, Any],
                *, mode: str = "token", normalization: str = "sum",
                formulation: str = DEFAULT_FORMULATION, limits: Limits = Limits(),
                cache_salt: str | None = None,
                template_kwargs: dict[str, Any] | None = None) -> PCDResult:
    """Answer `schema` about a text (or a chat) with a `vllm.LLM` by PCD. `mode` is the
    default for fields without their own `x-pcd-mode`."""
    if not internals.active():
        logger.warning_once("vllm-pcd's engine patches are off in this process (set "
                            "VLLM_PLUGINS=pcd before creating the LLM): answers are the same, "
                            "computed without the KV fork, grouped admission or restricted head")
    start = time.perf_counter()
    spec = parse_schema(schema, limits)
    check_normalization(normalization)
    plan = build_plan(llm.get_tokenizer(), spec, as_messages(text_or_messages), limits,
                      template_kwargs, mode=mode, formulation=formulation)
    plan_s = time.perf_counter() - start
    execution = run_offline(llm, plan, branches_per_batch=limits.max_branches_per_batch,
                            cache_salt=cache_salt)
    return finish(spec, plan, execution, plan_s, normalization,
                  configured_route(llm.llm_engine.vllm_config))


async def constrained_online(engine: Any, tokenizer: Any, messages: list[dict[str, Any]],
                             spec: SchemaSpec, *, limits: Limits, mode: str = "token",
                             normalization: str = "sum",
                             formulation: str = DEFAULT_FORMULATION,
                             template_kwargs: dict[str, Any] | None = None,
                             chat_template: str | None = None, request_id: str | None = None,
                             cache_salt: str | None = None,
                             projection_route: str | None = None,
                             data_parallel_rank: int | None = None) -> PCDResult:
    start = time.perf_counter()
    plan = await asyncio.get_running_loop().run_in_executor(_PLANNER, functools.partial(
        build_plan, tokenizer, spec, messages, limits, template_kwargs, chat_template, mode,
        formulation))
    plan_s = time.perf_counter() - start
    execution = await run_online(engine, plan, branches_per_batch=limits.max_branches_per_batch,
                                 request_id=request_id, cache_salt=cache_salt,
                                 data_parallel_rank=data_parallel_rank)
    return finish(spec, plan, execution, plan_s, normalization, projection_route)
