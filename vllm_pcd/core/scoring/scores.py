"""Where a field's score is computed: the engine's log-probabilities → one score per option.

Every field plan is a `FieldScorer`: it answers `score(reports, normalization)` (one token per
option: `token_field`; each option's tokens summed over a trie: `trie.trie_field`) with the
functions below: renormalise over the options, normalise a value's length, report the mass
outside the options, divide out a content-free prior. Scores are log-probabilities over the
allowed options: a model's preference among them, not the chance that it is right.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Protocol, Sequence

from vllm_pcd.core.scoring.field_result import FieldResult
from vllm_pcd.core.scoring.decision import resolved
from vllm_pcd.core.scoring.execution import RequestReport
from vllm_pcd.core.schema import FieldSpec


class FieldScorer(Protocol):
    """A field's plan, as scoring sees it: its decision mode and its score from its reports."""

    @property
    def mode(self) -> str: ...

    def score(self, reports: Sequence[RequestReport], normalization: str) -> FieldResult: ...


class ScoringRequest(Protocol):
    """One engine request of a plan: the field it scores and the tokens it reads and asks."""

    @property
    def field_index(self) -> int: ...

    @property
    def suffix_ids(self) -> tuple[int, ...]: ...

    @property
    def token_ids(self) -> tuple[int, ...]: ...


class ScoredPlan(Protocol):
    """A plan, as scoring sees it: a shared context, its fields and their requests."""

    @property
    def shared_ids(self) -> tuple[int, ...]: ...

    @property
    def fields(self) -> Sequence[FieldScorer]: ...

    @property
    def scorings(self) -> Sequence[ScoringRequest]: ...


def log_sum_exp(values: Sequence[float]) -> float:
    top = max(values)
    if top == -math.inf:
        raise ValueError("every candidate scored -inf")
    return top + math.log(sum(math.exp(v - top) for v in values))


def log_softmax(values: Sequence[float]) -> list[float]:
    total = log_sum_exp(values)
    return [v - total for v in values]


def field_result(field: FieldSpec, raw_logprobs: Sequence[float],
                 extra: dict[str, Any] | None = None,
                 candidate_extra: Sequence[dict[str, Any]] = (),
                 paths: Sequence[tuple[int, ...]] = (),
                 stepwise: Sequence[float] = ()) -> FieldResult:
    """Engine log-probabilities renormalised over the field's options."""
    if len(raw_logprobs) != len(field.options):
        raise ValueError(f"{field.name}: {len(raw_logprobs)} scores for "
                         f"{len(field.options)} options")
    return FieldResult(field, tuple(log_softmax(raw_logprobs)), dict(extra or {}),
                       tuple(candidate_extra), tuple(paths), tuple(stepwise))


def total(logprob_sum: float, tokens: int) -> float:
    """A value's joint log-probability: long values pay for every token."""
    return logprob_sum


def per_token(logprob_sum: float, tokens: int) -> float:
    """The mean log-probability of a value's tokens: no penalty for length."""
    return logprob_sum / tokens


NORMALIZATIONS: dict[str, Callable[[float, int], float]] = {"sum": total, "mean": per_token}


def vocabulary_extra(reports: Sequence[RequestReport], first: RequestReport, allowed: set[int],
                     option_logprobs: Sequence[float]) -> dict[str, Any]:
    """Where the field was scored on the full LM head: the probability its options hold over
    the whole vocabulary (`label_mass`), and whether the greedy first token is one of them.
    On the restricted head both are trivially 1 and true, so they are left out."""
    if any(r.asked_restricted for r in reports):
        return {}
    return {"label_mass": sum(math.exp(lp) for lp in option_logprobs),
            "argmax_is_label": first.sampled in allowed}


def token_field(field: FieldSpec, codes: Sequence[str], code_ids: Sequence[int],
                report: RequestReport) -> FieldResult:
    """One next-token distribution: each option's code token, renormalised."""
    raw = [report.logprobs[t] for t in code_ids]
    return field_result(field, raw, {"mode": "token", "codes": [c.strip() for c in codes],
                                     **vocabulary_extra([report], report, set(code_ids), raw)})


def sequence_field(field: FieldSpec, mode: str, sums: Sequence[float], tokens: Sequence[int],
                   normalization: str, reports: Sequence[RequestReport], first: RequestReport,
                   allowed: set[int], paths: Sequence[tuple[int, ...]],
                   stepwise: Sequence[float]) -> FieldResult:
    """Each option's summed token log-probabilities (`sums`, over `tokens` tokens), length
    normalised, renormalised. `paths` (the options' tokens) and `stepwise` (their sums with
    each token renormalised among the values' tokens there) serve a greedy decision. Scored
    up to unique prefixes (token mode) the joint probability is the score, whatever the
    normalization asked."""
    normalization = "sum" if mode == "token" else normalization
    normalize = NORMALIZATIONS[normalization]
    normalized = [normalize(s, n) for s, n in zip(sums, tokens)]
    per_candidate = [{"logprob_sum": s, "tokens": n, "normalized": v}
                     for s, n, v in zip(sums, tokens, normalized)]
    return field_result(field, normalized,
                        {"mode": mode, "normalization": normalization,
                         **vocabulary_extra(reports, first, allowed, sums)}, per_candidate,
                        paths, stepwise)


CALIBRATIONS = ("none", "content_free", "batch")


def calibrate(results: Sequence[FieldResult], prior: Sequence[FieldResult]
              ) -> tuple[FieldResult, ...]:
    """Content-free calibration: each field's scores minus its prior's (the same schema asked
    about no document), renormalised; the uncalibrated score and the prior stay in each
    candidate's diagnostics."""
    out = []
    for result, empty in zip(results, prior):
        scores = log_softmax([s - e for s, e in zip(result.scores, empty.scores)])
        extra = result.candidate_extra or tuple({} for _ in result.scores)
        out.append(result.recalibrated(scores, [
            {**more, "uncalibrated_score": raw, "prior_score": base}
            for more, raw, base in zip(extra, result.scores, empty.scores)]))
    return tuple(out)


def field_results(plan: ScoredPlan, branches: Sequence[RequestReport], normalization: str,
                  decision: str = "most_probable") -> tuple[FieldResult, ...]:
    """Every field of `plan` scored from its scorings' reports, in order, each choosing its
    value by `decision` (`decision.resolved` for its mode)."""
    by_field: dict[int, list[RequestReport]] = {}
    for scoring, report in zip(plan.scorings, branches):
        by_field.setdefault(scoring.field_index, []).append(report)
    return tuple(replace(fp.score(by_field.get(i, []), normalization),
                         decision=resolved(decision, fp.mode))
                 for i, fp in enumerate(plan.fields))
