"""A field's result: its scores over the options, the value they choose, and its diagnostics.

The scores come from `scores`; here they only choose the value and are reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Sequence

from vllm_pcd.core.scoring.decision import chosen
from vllm_pcd.core.schema import FieldSpec, SchemaSpec, object_of


@dataclass(frozen=True)
class FieldResult:
    field: FieldSpec
    scores: tuple[float, ...]  # log-probability of each option over the allowed set
    extra: dict[str, Any] = field(default_factory=dict)  # mode-specific diagnostics
    candidate_extra: tuple[dict[str, Any], ...] = ()     # per option, likewise
    paths: tuple[tuple[int, ...], ...] = ()  # each option's tokens, where it has several
    # each option's log-probability as a constrained decoder writes it (`recalibrated` drops it)
    stepwise: tuple[float, ...] = ()
    decision: str = "most_probable"   # how the value is chosen (`decision.DECISIONS`)

    @cached_property
    def best_index(self) -> int:
        """Read by the value, its margin and the diagnostics: decided once (a greedy walk over
        the options' paths is not free at 32 fields)."""
        return chosen(self.decision, self.scores, self.stepwise, self.paths)

    def recalibrated(self, scores: Sequence[float], candidate_extra: Sequence[dict[str, Any]],
                     stepwise: Sequence[float] = ()) -> FieldResult:
        """The result under calibrated scores. The decoder's stepwise scores are not
        calibrated, so they go (a greedy choice then follows the calibrated scores) unless the
        map left the scores as they were and the caller keeps them."""
        return replace(self, scores=tuple(scores), stepwise=tuple(stepwise),
                       candidate_extra=tuple(candidate_extra))

    @property
    def value(self) -> Any:
        return self.field.options[self.best_index]

    @property
    def margin(self) -> float | None:
        """Log-probability gap between the chosen option and the best other one (negative
        where a greedy decision chose a less probable value)."""
        if len(self.scores) < 2:
            return None
        best = self.best_index
        return self.scores[best] - max(s for i, s in enumerate(self.scores) if i != best)

    def diagnostics(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "candidates": [
                {"value": option, "score": score, "probability": math.exp(score),
                 **({"stepwise_score": self.stepwise[i]} if self.stepwise else {}), **more}
                for i, (option, score, more) in enumerate(zip(
                    self.field.options, self.scores,
                    self.candidate_extra or [{}] * len(self.scores)))
            ],
            "margin": self.margin,
            **({"decision": self.decision} if self.decision != "most_probable" else {}),
            **self.extra,
        }


def assemble(schema: SchemaSpec, results: Sequence[FieldResult]) -> dict[str, Any]:
    """The object of each field's best value."""
    return object_of(schema, [r.value for r in results])
