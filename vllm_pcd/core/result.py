"""A PCD call's answer: the typed object, each field's result, and what it cost.

`CallRounds` is the one round rule of a call, for one document or many, without I/O: what
the next round plans (a conditioned field waits for the values it reads; a content-free prior
rides along with the first round), what of it the engine runs (a cached prior is not run),
and, once every document is complete, the answers. The offline and the online path drive it
alike. `finish` turns a document's rounds into its answer: every field scored (`scoring`),
calibrated against a prior or by a fitted profile when one is given, assembled into the
object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from vllm_pcd.core.schema import SchemaSpec, to_json
from vllm_pcd.core.scoring import (Execution, FieldResult, PendingPrior, Prior, PriorCache,
                                   assemble, calibrate, content_free_messages, field_results)
from vllm_pcd.core.plan import Answered, Options, Plan, read_values
from vllm_pcd.core.profiles import Profile

Conversation = list[dict[str, Any]]


@dataclass(frozen=True)
class Round:
    """One round of a call (a conditioned call has several): its plan, what the engine
    reported, and its fields' results."""

    plan: Plan
    execution: Execution
    fields: tuple[FieldResult, ...]

    @classmethod
    def scored(cls, plan: Plan, execution: Execution, options: Options) -> Round:
        return cls(plan, execution, field_results(plan, execution.branches,
                                                  options.normalization, options.decision))


@dataclass
class Rounds:
    """One document's rounds as they are scored, and what the next one reads: another round
    while the last plan leaves fields for later."""

    options: Options
    done: list[Round] = field(default_factory=list)

    def add(self, plan: Plan, execution: Execution) -> None:
        self.done.append(Round.scored(plan, execution, self.options))

    @property
    def complete(self) -> bool:
        return bool(self.done) and not self.done[-1].plan.leaves

    @property
    def answered(self) -> Answered:
        """What the rounds so far settled: the next round's plan reads it."""
        out = Answered()
        for round_ in self.done:
            out = out.then(round_.plan, round_.fields)
        return out


@dataclass(frozen=True)
class Ask:
    """One plan the next round needs: a document's (`document`, its position) at `round`,
    or the content-free prior of `prior` (a key of `CallRounds`)."""

    conversation: Conversation
    answered: Answered
    document: int | None = None
    round: int = 0
    prior: str | None = None

    @property
    def suffix(self) -> str:
        """What tells this ask's engine requests from the call's first ones."""
        return "-prior" if self.prior is not None else f"-r{self.round}" if self.round else ""


class CallRounds:
    """Every document's rounds in one PCD call, driven without I/O by the offline and the
    online path alike::

        while not call.complete:
            plans = [plan(ask) for ask in call.asks()]
            call.add(execute(call.to_run(plans)))
        answers = call.answers(spec, ...)

    Under content-free calibration the first round also asks one prior per distinct
    content-free conversation (the documents' system turns); a prior found in `priors` is not
    run again."""

    def __init__(self, options: Options, conversations: Sequence[Conversation],
                 priors: PriorCache, cache_salt: str | None = None):
        self.options = options
        self.conversations = list(conversations)
        self.documents = [Rounds(options) for _ in self.conversations]
        self._priors, self._salt = priors, cache_salt
        self._empty_of = [json.dumps(content_free_messages(c), sort_keys=True)
                          for c in self.conversations] \
            if options.calibration == "content_free" else []
        self._pending: dict[str, PendingPrior] = {}
        self._resolved: dict[str, Prior] = {}
        self._asked: list[Ask] = []
        self._running: list[tuple[Ask, Plan]] = []

    @property
    def complete(self) -> bool:
        return all(d.complete for d in self.documents)

    def asks(self) -> list[Ask]:
        """The next round's plans to build, documents first."""
        if not self.documents[0].done:
            self._asked = [Ask(c, Answered(), k) for k, c in enumerate(self.conversations)]
            self._asked += [Ask(json.loads(key), Answered(), prior=key)
                            for key in dict.fromkeys(self._empty_of)]
        else:
            self._asked = [Ask(self.conversations[k], d.answered, k, len(d.done))
                           for k, d in enumerate(self.documents) if not d.complete]
        return self._asked

    def to_run(self, plans: Sequence[Plan]) -> list[tuple[Ask, Plan]]:
        """Given the plans of `asks()` in order, what the engine runs this round."""
        if len(plans) != len(self._asked):
            raise ValueError(f"{len(self._asked)} asks, {len(plans)} plans")
        self._running = []
        for ask, plan in zip(self._asked, plans):
            if ask.prior is not None:
                pending = self._priors.pending(plan, self.options.normalization, self._salt)
                self._pending[ask.prior] = pending
                if pending.cached is not None:
                    self._resolved[ask.prior] = pending.resolve()
                    continue
            self._running.append((ask, plan))
        return self._running

    def add(self, executions: Sequence[Execution]) -> None:
        """The engine's reports of `to_run`'s plans, in order."""
        if len(executions) != len(self._running):
            raise ValueError(f"{len(self._running)} plans run, {len(executions)} reports")
        for (ask, plan), execution in zip(self._running, executions):
            if ask.prior is not None:
                self._resolved[ask.prior] = self._pending[ask.prior].resolve(execution)
            else:
                self.documents[ask.document].add(plan, execution)
        self._asked, self._running = [], []

    def answers(self, spec: SchemaSpec, plan_s: float, projection_route: str | None = None,
                profile: Profile | None = None) -> list[PCDResult]:
        """Each document's answer, calibrated by its prior where one was asked, else by
        `profile`; `plan_s` is the planning time per document."""
        if not self.complete:
            raise ValueError("a document still has rounds to run")
        priors = [self._resolved[key] for key in self._empty_of] or [None] * len(self.documents)
        return [finish(spec, d.done, plan_s, projection_route, prior,
                       read_values(spec, self.options.joint, d.answered.values), profile)
                for d, prior in zip(self.documents, priors)]


@dataclass(frozen=True)
class PCDResult:
    object: dict[str, Any]
    fields: tuple[FieldResult, ...]  # in schema order
    rounds: tuple[Round, ...]
    plan_s: float
    projection_route: str | None = None  # the restricted LM head's route, when it is on
    calibration: dict[str, Any] | None = None  # how the scores were calibrated, if they were
    conditioned: dict[str, dict[str, Any]] | None = None  # field → the values it read

    @property
    def plan(self) -> Plan:
        """The first round's plan: the whole call's, unless fields are conditioned."""
        return self.rounds[0].plan

    @property
    def execution(self) -> Execution:
        return self.rounds[0].execution

    @property
    def content(self) -> str:
        return to_json(self.object)

    def projection(self) -> dict[str, Any]:
        """What the worker's LM head did for this request, as measured by its outputs
        (`engine.probe_id`): how many engine requests it projected onto their allowed ids
        and, when any, the route it serves them with; `fallbacks` counts the requests that
        asked for the restricted head and got the full one."""
        branches = [b for r in self.rounds for b in r.execution.branches]
        measured = sum(b.restricted for b in branches)
        asked = sum(b.asked_restricted for b in branches)
        return {"route": self.projection_route if measured else None,
                "restricted_requests": measured, "fallbacks": asked - measured}

    def diagnostics(self, reveal_cache: bool = True) -> dict[str, Any]:
        """`reveal_cache` False leaves out what tells a cache hit (tokens computed, context
        and prior cached, and the engine's measured times, which a cached context shortens),
        as vLLM does without --enable-prompt-tokens-details."""
        diagnostics = self._diagnostics()
        if not reveal_cache:
            for key in ("computed", "context_cached"):
                diagnostics["tokens"].pop(key)
            diagnostics["timings"] = {"plan_s": diagnostics["timings"]["plan_s"]}
            for key in ("prior_cached", "prior_tokens_computed"):
                (diagnostics["calibration"] or {}).pop(key, None)
        return diagnostics

    def _diagnostics(self) -> dict[str, Any]:
        executions = [r.execution for r in self.rounds]
        calls = [ex.backbone_calls for ex in executions]
        shared = len(self.plan.shared_ids)
        ideal = sum(r.plan.ideal_tokens for r in self.rounds)
        modes = {r.extra["mode"] for r in self.fields}
        prefill_s = sum(ex.prefill_s for ex in executions)
        branches_s = sum(ex.branches_s for ex in executions)
        fields = {r.field.name: r.diagnostics() for r in self.fields}
        for name, read in (self.conditioned or {}).items():
            fields[name]["conditioned_on"] = read
        return {
            "mode": modes.pop() if len(modes) == 1 else "mixed",
            # a batch estimate still warming up says so, and leaves the scores as they were
            "calibrated": self.calibration is not None and self.calibration.get("applied", True),
            "calibration": self.calibration,
            "backbone_calls": None if None in calls else sum(calls),
            **({"rounds": [[f.field.name for f in r.fields] for r in self.rounds]}
               if len(self.rounds) > 1 else {}),
            "tokens": {
                "shared": shared,
                "branch": ideal - shared,
                "ideal": ideal,
                "computed": sum(ex.tokens_computed for ex in executions),
                # shared-context tokens earlier requests had computed (the prefix cache)
                "context_cached": self.execution.prefill.cached_tokens,
            },
            "timings": {
                "plan_s": self.plan_s,
                "prefill_s": prefill_s,
                "branches_s": branches_s,
                "total_s": self.plan_s + prefill_s + branches_s,
            },
            "projection": self.projection(),
            "fields": fields,
        }


def finish(schema: SchemaSpec, rounds: Sequence[Round], plan_s: float,
           projection_route: str | None = None, prior: Prior | None = None,
           conditioned: dict[str, dict[str, Any]] | None = None,
           profile: Profile | None = None) -> PCDResult:
    by_name = {r.field.name: r for round_ in rounds for r in round_.fields}
    results = tuple(by_name[f.name] for f in schema.fields)
    calibration = None
    if prior is not None:
        results = calibrate(results, prior.fields)
        calibration = {"method": "content_free", "prior_cached": prior.cached,
                       "prior_tokens_computed": prior.tokens_computed} \
            if prior.method == "content_free" else {"method": prior.method, "applied": True,
                                                    "documents": prior.documents}
    elif profile is not None:
        results = profile.apply(results)
        calibration = profile.diagnostics()
    return PCDResult(assemble(schema, results), results, tuple(rounds), plan_s,
                     projection_route, calibration, conditioned or None)
