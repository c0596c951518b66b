"""One PCD request from schema to typed object: plan → engine → assemble.

Shared by the HTTP route and the offline API so both answer identically.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

from vllm.logger import init_logger

from vllm_pcd import internals
from vllm_pcd.assemble import FieldResult, assemble, field_result, to_json
from vllm_pcd.calibration import (DEFAULT_CALIBRATION, PriorCache, calibrate, check_calibration,
                                  content_free_messages, prior_key)
from vllm_pcd.engine import Execution, RequestReport, run_offline, run_online
from vllm_pcd.internals.lm_head import configured_route
from vllm_pcd.plan import DEFAULT_FORMULATION, DEFAULT_LAYOUT, FieldPlan, Plan, build_plan
from vllm_pcd.schema import Limits, SchemaError, SchemaSpec, parse_schema
from vllm_pcd.sequence import NORMALIZATIONS, SequenceFieldPlan, node_lookup

logger = init_logger("vllm.pcd")


class Overloaded(Exception):
    """More PCD calls wait for planning than `limits.max_queued_plans`: refused (HTTP 429)."""


class Planner:
    """Planning (chat template, tokenizer passes) blocks for milliseconds: on the API server
    it runs on one thread of its own, never on the event loop. Its queue is bounded (a call
    past the bound is refused at once), and a caller that gives up (timeout, disconnect)
    takes its work out of the queue, or stops it between continuations if it has begun."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcd-plan")
        self.waiting = 0

    async def plan(self, bound: int, build: Any, *args: Any) -> Plan:
        if self.waiting >= bound:
            raise Overloaded(f"{self.waiting} PCD calls are waiting for planning "
                             f"(limits.max_queued_plans = {bound}); retry later")
        self.waiting += 1
        stop = threading.Event()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._pool, functools.partial(build, *args, cancelled=stop.is_set))
        finally:
            stop.set()
            self.waiting -= 1


PLANNER = Planner()


@dataclass(frozen=True)
class PCDResult:
    object: dict[str, Any]
    fields: tuple[FieldResult, ...]
    plan: Plan
    execution: Execution
    plan_s: float
    projection_route: str | None = None  # the restricted LM head's route, when it is on
    calibration: dict[str, Any] | None = None  # how the scores were calibrated, if they were

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

    def diagnostics(self, reveal_cache: bool = True) -> dict[str, Any]:
        """`reveal_cache` False leaves out what tells a cache hit (tokens computed, context
        and prior cached), as vLLM does without --enable-prompt-tokens-details."""
        diagnostics = self._diagnostics()
        if not reveal_cache:
            for key in ("computed", "context_cached"):
                diagnostics["tokens"].pop(key)
            for key in ("prior_cached", "prior_tokens_computed"):
                (diagnostics["calibration"] or {}).pop(key, None)
        return diagnostics

    def _diagnostics(self) -> dict[str, Any]:
        ex = self.execution
        shared = len(self.plan.shared_ids)
        modes = {r.extra["mode"] for r in self.fields}
        return {
            "mode": modes.pop() if len(modes) == 1 else "mixed",
            "calibrated": self.calibration is not None,
            "calibration": self.calibration,
            "backbone_calls": ex.backbone_calls,
            "tokens": {
                "shared": shared,
                "branch": self.plan.branch_tokens,
                "ideal": shared + self.plan.branch_tokens,
                "computed": ex.tokens_computed,
                # shared-context tokens earlier requests had computed (the prefix cache)
                "context_cached": ex.prefill.cached_tokens,
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


def _vocabulary_extra(reports: Sequence[RequestReport], first: RequestReport, allowed: set[int],
                      option_logprobs: Sequence[float]) -> dict[str, Any]:
    """Where the field was scored on the full LM head: the probability its options hold over
    the whole vocabulary (`label_mass`), and whether the greedy first token is one of them.
    On the restricted head both are trivially 1 and true, so they are left out."""
    if any(r.asked_restricted for r in reports):
        return {}
    return {"label_mass": sum(math.exp(lp) for lp in option_logprobs),
            "argmax_is_label": first.sampled in allowed}


def _token_result(fp: FieldPlan, report: RequestReport) -> FieldResult:
    raw = [report.logprobs[t] for t in fp.code_ids]
    return field_result(fp.field, raw,
                        {"mode": "token", "codes": [c.strip() for c in fp.codes],
                         **_vocabulary_extra([report], report, set(fp.code_ids), raw)})


def _sequence_result(fp: SequenceFieldPlan, reports: list[RequestReport],
                     normalization: str) -> FieldResult:
    sums = fp.candidate_logprobs(node_lookup(fp.nodes, [r.logprobs for r in reports]))
    if fp.mode == "token":  # unique prefixes: the joint probability is the score
        normalization = "sum"
    normalized = fp.scores(sums, normalization)
    per_candidate = [{"logprob_sum": total, "tokens": fp.value_tokens(i),
                      "normalized": normalized[i]} for i, total in enumerate(sums)]
    # the first scored position: the nodes with the shortest prefix (one request per chunk)
    root = min(len(n.prefix) for n in fp.nodes)
    first = [n for n in fp.nodes if len(n.prefix) == root]
    allowed = {t for n in first for t in n.children}
    return field_result(fp.field, normalized,
                        {"mode": fp.mode, "normalization": normalization,
                         **_vocabulary_extra(reports, reports[fp.nodes.index(first[0])],
                                             allowed, sums)},
                        per_candidate)


def _results(plan: Plan, execution: Execution, normalization: str) -> tuple[FieldResult, ...]:
    by_field: dict[int, list[RequestReport]] = {}
    for scoring, report in zip(plan.scorings(), execution.branches):
        by_field.setdefault(scoring.field_index, []).append(report)
    return tuple(
        _token_result(fp, by_field[i][0]) if isinstance(fp, FieldPlan)
        else _sequence_result(fp, by_field[i], normalization)
        for i, fp in enumerate(plan.fields))


def finish(schema: SchemaSpec, plan: Plan, execution: Execution, plan_s: float,
           normalization: str = "sum", projection_route: str | None = None,
           prior: Prior | None = None) -> PCDResult:
    results = _results(plan, execution, normalization)
    calibration = None
    if prior is not None:
        results = calibrate(results, prior.fields)
        calibration = {"method": "content_free", "prior_cached": prior.cached,
                       "prior_tokens_computed": prior.tokens_computed}
    return PCDResult(assemble(schema, results), results, plan, execution, plan_s,
                     projection_route, calibration)


@dataclass(frozen=True)
class Prior:
    """A schema's content-free scores, and what obtaining them cost this request."""

    fields: tuple[FieldResult, ...]
    cached: bool
    tokens_computed: int


PRIORS = PriorCache()


def _prior(plan: Plan, execution: Execution, normalization: str, key: Any) -> Prior:
    fields = _results(plan, execution, normalization)
    PRIORS.put(key, fields)
    return Prior(fields, False, execution.tokens_computed)


def check_normalization(normalization: str) -> str:
    if normalization not in NORMALIZATIONS:
        raise SchemaError(f"pcd_normalization must be one of {list(NORMALIZATIONS)}",
                          param="pcd_normalization", rule="normalization")
    return normalization


Conversation = str | list[dict[str, Any]]
# Documents submitted to the engine together by the batch API; more wait for the next call.
DOCUMENTS_PER_CALL = 256


def as_messages(text_or_messages: Conversation) -> list[dict[str, Any]]:
    if isinstance(text_or_messages, str):
        return [{"role": "user", "content": text_or_messages}]
    return list(text_or_messages)


def _is_many(documents: Any) -> bool:
    """A list of texts or of conversations (a conversation itself is a list of dicts)."""
    return isinstance(documents, (list, tuple)) and bool(documents) \
        and all(isinstance(d, (str, list, tuple)) for d in documents)


def constrained(llm: Any, documents: Conversation | Sequence[Conversation],
                schema: dict[str, Any], *, mode: str = "token", normalization: str = "sum",
                formulation: str = DEFAULT_FORMULATION, layout: str = DEFAULT_LAYOUT,
                calibration: str = DEFAULT_CALIBRATION, limits: Limits = Limits(),
                cache_salt: str | None = None, template_kwargs: dict[str, Any] | None = None,
                full_vocabulary: bool = False) -> PCDResult | list[PCDResult]:
    """Answer `schema` about a text (or a chat) with a `vllm.LLM` by PCD; given a list of
    them, answer each, submitting up to DOCUMENTS_PER_CALL documents to the engine at once so
    vLLM batches them. `mode` is the default for fields without their own `x-pcd-mode`;
    `calibration="content_free"` divides out the schema's content-free prior, computed
    alongside the first documents and cached; `full_vocabulary` keeps the stock LM head, so
    each field also reports its options' mass over the whole vocabulary."""
    if not internals.active():
        logger.warning_once("vllm-pcd's engine patches are off in this process (set "
                            "VLLM_PLUGINS=pcd before creating the LLM): answers are the same, "
                            "computed without the KV fork, grouped admission or restricted head")
    many = _is_many(documents)
    spec = parse_schema(schema, limits)
    check_normalization(normalization)
    check_calibration(calibration)
    route = configured_route(llm.llm_engine.vllm_config)

    def plan_of(messages: list[dict[str, Any]]) -> Plan:
        return build_plan(llm.get_tokenizer(), spec, messages, limits, template_kwargs,
                          mode=mode, formulation=formulation, layout=layout)

    results = []
    todo = list(documents) if many else [documents]
    for at in range(0, len(todo), DOCUMENTS_PER_CALL):
        start = time.perf_counter()
        plans = [plan_of(as_messages(doc)) for doc in todo[at:at + DOCUMENTS_PER_CALL]]
        plan_s = (time.perf_counter() - start) / len(plans)
        # One prior per distinct content-free conversation (the documents' system turns).
        empties = [content_free_messages(as_messages(doc)) for doc in todo[at:at + len(plans)]]
        wanted: dict[str, Any] = {}
        if calibration == "content_free":
            for empty in empties:
                wanted.setdefault(json.dumps(empty, sort_keys=True), empty)
        prior_plans = {text: plan_of(empty) for text, empty in wanted.items()}
        keys = {text: prior_key(plan, normalization, cache_salt)
                for text, plan in prior_plans.items()}
        priors = {text: Prior(cached, True, 0) for text, key in keys.items()
                  if (cached := PRIORS.get(key)) is not None}
        missing = [text for text in prior_plans if text not in priors]
        executions = run_offline(llm, plans + [prior_plans[t] for t in missing],
                                 branches_per_batch=limits.max_branches_per_batch,
                                 cache_salt=cache_salt, full_vocabulary=full_vocabulary)
        for text, execution in zip(missing, executions[len(plans):]):
            priors[text] = _prior(prior_plans[text], execution, normalization, keys[text])
        results += [finish(spec, plan, execution, plan_s, normalization, route,
                           priors.get(json.dumps(empty, sort_keys=True)))
                    for plan, execution, empty in zip(plans, executions, empties)]
    return results if many else results[0]


async def constrained_online(engine: Any, tokenizer: Any, messages: list[dict[str, Any]],
                             spec: SchemaSpec, *, limits: Limits, mode: str = "token",
                             normalization: str = "sum",
                             formulation: str = DEFAULT_FORMULATION,
                             layout: str = DEFAULT_LAYOUT,
                             calibration: str = DEFAULT_CALIBRATION,
                             template_kwargs: dict[str, Any] | None = None,
                             chat_template: str | None = None, request_id: str | None = None,
                             cache_salt: str | None = None,
                             projection_route: str | None = None,
                             data_parallel_rank: int | None = None,
                             full_vocabulary: bool = False) -> PCDResult:
    """On a prior's cache miss its engine requests run beside the document's, in the same
    engine steps. `full_vocabulary` keeps the stock LM head, so each field also reports the
    mass its options hold over the whole vocabulary."""
    def plan_of(conversation: list[dict[str, Any]]) -> Any:
        return PLANNER.plan(limits.max_queued_plans, build_plan, tokenizer, spec, conversation,
                            limits, template_kwargs, chat_template, mode, formulation, layout)

    def execute(plan: Plan, rid: str | None) -> Any:
        return run_online(engine, plan, branches_per_batch=limits.max_branches_per_batch,
                          request_id=rid, cache_salt=cache_salt,
                          data_parallel_rank=data_parallel_rank, full_vocabulary=full_vocabulary)

    start = time.perf_counter()
    plan = await plan_of(messages)
    plan_s = time.perf_counter() - start
    prior = execution = None
    if check_calibration(calibration) == "content_free":
        prior_plan = await plan_of(content_free_messages(messages))
        key = prior_key(prior_plan, normalization, cache_salt)
        if (cached := PRIORS.get(key)) is not None:
            prior = Prior(cached, True, 0)
        else:
            async with asyncio.TaskGroup() as group:  # one failing cancels (aborts) the other
                document = group.create_task(execute(plan, request_id))
                empty = group.create_task(execute(prior_plan, request_id and f"{request_id}-prior"))
            prior = _prior(prior_plan, empty.result(), normalization, key)
            execution = document.result()
    if execution is None:
        execution = await execute(plan, request_id)
    return finish(spec, plan, execution, plan_s, normalization, projection_route, prior)
