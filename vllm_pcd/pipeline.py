"""One PCD call from schema to typed object: plan (core) → engine → result (core).

Shared by the offline API (`constrained`, a `vllm.LLM`) and the API server (`answer_online`,
its `EngineClient`), so both answer identically: both drive the same round rule
(`core.result.CallRounds`, which also asks a content-free prior where one is needed), and
both read fitted calibration profiles from `additional_config.pcd.calibration_profiles`
(`profiles_of`). They differ only in how plans are made and run: a batch of documents at
once offline, one document awaited online.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence

from vllm.logger import init_logger

from vllm_pcd import internals
from vllm_pcd.core.scoring import PriorCache, RunningPriors, batch_prior, too_few
from vllm_pcd.core.plan import KEYS, Answered, Options, Plan, build_plan, common_prefix
from vllm_pcd.core.config import pcd_config
from vllm_pcd.core.profiles import ProfileBook, matches_model, read_profiles
from vllm_pcd.core.result import Ask, CallRounds, PCDResult, finish
from vllm_pcd.core.schema import Limits, SchemaError, SchemaSpec, parse_schema
from vllm_pcd.engine import kv_room, run_offline, run_online
from vllm_pcd.internals.lm_head import configured_route

logger = init_logger("vllm.pcd")
PRIORS = PriorCache()


PROFILES_KEY = "calibration_profiles"  # under additional_config.pcd


def profiles_of(vllm_config: Any) -> ProfileBook:
    """The calibration profiles this engine's configuration names (a path or a list of
    paths) that were fitted on the model it serves; the others are left out, with a log
    line. A file that cannot be read as profiles stops the start: serving uncalibrated
    where an operator asked for calibration would go unnoticed."""
    paths = pcd_config(getattr(vllm_config, "additional_config", None)).get(PROFILES_KEY)
    if not paths:
        return ProfileBook()
    paths = [paths] if isinstance(paths, str) else list(paths)
    return _load_profiles(tuple(str(p) for p in paths), _model_names(vllm_config))


def _model_names(vllm_config: Any) -> tuple[str, ...]:
    model = vllm_config.model_config
    served = getattr(model, "served_model_name", None) or ()
    return (model.model, *([served] if isinstance(served, str) else served))


@functools.lru_cache(maxsize=8)
def _load_profiles(paths: tuple[str, ...], names: tuple[str, ...]) -> ProfileBook:
    kept = []
    for path in paths:
        try:
            profiles = read_profiles(path)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"additional_config.pcd.{PROFILES_KEY}: {path}: {err}") from err
        for profile in profiles:
            if matches_model(profile, names):
                kept.append(profile)
            else:
                logger.warning("vllm-pcd ignores a calibration profile in %s: fitted on %s, "
                               "this server serves %s", path, profile.model, names[0])
    logger.info("vllm-pcd loaded %d calibration profile(s)", len(kept))
    return ProfileBook(kept)


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

    async def run(self, work: Any, *args: Any, **kwargs: Any) -> Any:
        """A short tokenizer pass (no planning) on the same thread."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, functools.partial(work, *args, **kwargs))

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

Conversation = str | list[dict[str, Any]]
# Documents submitted to the engine together by the batch API at most (fewer where the KV
# cache holds fewer); more wait for the next batch.
DOCUMENTS_PER_CALL = 256


def as_messages(text_or_messages: Conversation) -> list[dict[str, Any]]:
    if isinstance(text_or_messages, str):
        return [{"role": "user", "content": text_or_messages}]
    return list(text_or_messages)


def _is_many(documents: Any) -> bool:
    """A list of texts or of conversations (a conversation itself is a list of dicts)."""
    return isinstance(documents, (list, tuple)) and bool(documents) \
        and all(isinstance(d, (str, list, tuple)) for d in documents)


def batches(documents: Sequence[Conversation], plan_of: Callable[[Any], Plan],
            room: tuple[int, int] | None, fields: int
            ) -> Iterator[tuple[list[Conversation], list[Plan], float]]:
    """The documents in the batches submitted together, each with its plans and planning
    time per document: up to DOCUMENTS_PER_CALL, and no more than `room` (KV blocks, block
    size; None: unknown) holds at once, later rounds of conditioned fields included. Past
    that, the engine evicts cached contexts whose branches have not run yet, and they are
    computed again (×2 the tokens at 256 documents of 32 fields in a 2 GiB cache)."""
    docs: list[Conversation] = []
    plans: list[Plan] = []
    used, plan_s = 0, 0.0
    for doc in documents:
        start = time.perf_counter()
        plan = plan_of(as_messages(doc))
        planned = time.perf_counter() - start
        need = _blocks(plan, plans[0] if plans else None, room, fields)
        if plans and (len(plans) == DOCUMENTS_PER_CALL
                      or (room is not None and used + need > room[0])):
            yield docs, plans, plan_s / len(plans)
            docs, plans, used, plan_s = [], [], 0, 0.0
            need = _blocks(plan, None, room, fields)
        docs.append(doc)
        plans.append(plan)
        used += need
        plan_s += planned
    if plans:
        yield docs, plans, plan_s / len(plans)


def _blocks(plan: Plan, first: Plan | None, room: tuple[int, int] | None, fields: int) -> int:
    """A document's KV blocks beside the batch's `first`, whose leading context blocks it
    shares (a schema-first layout's field list); a conditioned call's later rounds are
    counted at its first round's blocks per field."""
    if room is None:
        return 0
    size = room[1]
    held = 0 if first is None else common_prefix(first.shared_ids, plan.shared_ids)
    context, requests = plan.kv_blocks(size, held)
    later = 0
    if plan.leaves and plan.fields:
        later = math.ceil(requests * (fields - len(plan.fields)) / len(plan.fields))
    return context + requests + later


def constrained(llm: Any, documents: Conversation | Sequence[Conversation],
                schema: dict[str, Any], options: Options | None = None, *,
                limits: Limits = Limits(), cache_salt: str | None = None,
                template_kwargs: dict[str, Any] | None = None,
                **option_values: Any) -> PCDResult | list[PCDResult]:
    """Answer `schema` about a text (or a chat) with a `vllm.LLM` by PCD; given a list of
    them, answer each, submitting as many documents at once as the KV cache holds (`batches`)
    so vLLM batches them. The options (`core.plan.Options`) come whole or as keywords
    (`mode="sequence"`); the content-free prior is computed alongside the first documents
    that need it and cached."""
    if not internals.active():
        logger.warning_once("vllm-pcd's engine patches are off in this process (set "
                            "VLLM_PLUGINS=pcd before creating the LLM): answers are the same, "
                            "computed without the KV fork, grouped admission or restricted head")
    if options is not None and option_values:
        raise TypeError("give the options whole or as keywords, not both")
    options = options or Options.of(option_values)
    many = _is_many(documents)
    spec = parse_schema(schema, limits)
    route = configured_route(llm.llm_engine.vllm_config)
    profile = None if options.calibration == "batch" \
        else profiles_of(llm.llm_engine.vllm_config).find(spec, options)

    def plan_of(messages: list[dict[str, Any]], so_far: Answered = Answered()) -> Plan:
        return build_plan(llm.get_tokenizer(), spec, messages, options, limits, template_kwargs,
                          answered=so_far)

    results = []
    todo = list(documents) if many else [documents]
    for docs, plans, plan_s in batches(todo, plan_of, kv_room(llm), len(spec.fields)):
        call = CallRounds(options, [as_messages(doc) for doc in docs], PRIORS, cache_salt)
        first = dict(enumerate(plans))  # the first round's document plans, made by `batches`
        while not call.complete:
            start = time.perf_counter()
            now = [first.pop(ask.document) if ask.document in first
                   else plan_of(ask.conversation, ask.answered) for ask in call.asks()]
            plan_s += (time.perf_counter() - start) / len(plans)
            call.add(run_offline(llm, [plan for _, plan in call.to_run(now)],
                                 branches_per_batch=limits.max_branches_per_batch,
                                 cache_salt=cache_salt))
        results += call.answers(spec, plan_s, route, profile)
    if options.calibration == "batch":
        results = calibrated_by_batch(spec, results, route)
    return results if many else results[0]


def calibrated_by_batch(spec: SchemaSpec, results: list[PCDResult], route: str | None
                        ) -> list[PCDResult]:
    """Every document's scores divided by the call's own per-field mean (`batch_calibration`);
    a call of too few documents stays uncalibrated and says so."""
    prior = batch_prior([r.fields for r in results])
    if prior is None:
        return [replace(r, calibration=too_few(len(results))) for r in results]
    return [finish(spec, r.rounds, r.plan_s, route, prior) for r in results]


@dataclass(frozen=True)
class Online:
    """What every online call runs on: the server's engine, PCD's tokenizer, the limits, the
    restricted LM head's route (for the diagnostics), the operator's calibration profiles and
    the server's running batch estimates."""

    engine: Any
    tokenizer: Any
    limits: Limits
    projection_route: str | None = None
    profiles: ProfileBook = ProfileBook()
    batch_priors: RunningPriors | None = None


@dataclass(frozen=True)
class Call:
    """One online call's own settings, beside its schema, messages and options."""

    template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    request_id: str | None = None
    cache_salt: str | None = None
    data_parallel_rank: int | None = None
    # whose running batch estimate the call reads and feeds (`pcd_calibration: "batch"`)
    tenant: str | None = None


async def answer_online(online: Online, spec: SchemaSpec, messages: list[dict[str, Any]],
                        options: Options, call: Call = Call()) -> PCDResult:
    """On a prior's cache miss its engine requests run beside the document's, in the same
    engine steps. Conditioned fields take later rounds, one after another."""
    limits = online.limits
    if options.calibration == "batch" and (online.batch_priors is None or call.tenant is None):
        raise SchemaError("pcd_calibration batch divides out the mean of a batch of documents: "
                          "this door keeps no running estimate; ask it of the chat door or of "
                          "the offline API with a list of documents",
                          param=KEYS["calibration"], rule="calibration")

    def plan_of(conversation: list[dict[str, Any]], so_far: Answered = Answered()) -> Any:
        return PLANNER.plan(limits.max_queued_plans,
                            functools.partial(build_plan, answered=so_far), online.tokenizer,
                            spec, conversation, options, limits, call.template_kwargs,
                            call.chat_template)

    def execute(ask: Ask, plan: Plan) -> Any:
        return run_online(online.engine, plan, branches_per_batch=limits.max_branches_per_batch,
                          request_id=call.request_id and f"{call.request_id}{ask.suffix}",
                          cache_salt=call.cache_salt, data_parallel_rank=call.data_parallel_rank)

    async def execute_all(run: list[tuple[Ask, Plan]]) -> list[Any]:
        """A round's plans (a document's, and its prior's on a cache miss) in the same
        engine steps."""
        if len(run) == 1:
            return [await execute(*run[0])]
        async with asyncio.TaskGroup() as group:  # one failing cancels (aborts) the others
            tasks = [group.create_task(execute(ask, plan)) for ask, plan in run]
        return [task.result() for task in tasks]

    rounds = CallRounds(options, [messages], PRIORS, call.cache_salt)
    plan_s = 0.0
    while not rounds.complete:
        start = time.perf_counter()
        plans = [await plan_of(ask.conversation, ask.answered) for ask in rounds.asks()]
        plan_s += time.perf_counter() - start
        rounds.add(await execute_all(rounds.to_run(plans)))
    if options.calibration == "batch":  # the running estimate is read after the rounds
        plain, = rounds.answers(spec, plan_s, online.projection_route)
        return by_running_batch(online, spec, plain, options, call)
    answer, = rounds.answers(spec, plan_s, online.projection_route,
                             online.profiles.find(spec, options))
    return answer


def by_running_batch(online: Online, spec: SchemaSpec, plain: PCDResult, options: Options,
                     call: Call) -> PCDResult:
    """The document feeds its tenant's running estimate for this schema and options, then is
    calibrated by it; while the estimate is younger than MIN_DOCUMENTS the answer stays
    uncalibrated and says so."""
    size, prior = online.batch_priors.observe((call.tenant, spec, options), plain.fields)
    if prior is None:
        return replace(plain, calibration={**too_few(size), "estimate": "running"})
    done = finish(spec, plain.rounds, plain.plan_s, online.projection_route, prior,
                  plain.conditioned)
    return replace(done, calibration={**done.calibration, "estimate": "running"})
