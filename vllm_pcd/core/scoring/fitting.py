"""Fitted calibration maps: a field's option scores → probabilities a client can threshold.

A field's scores are the model's preference among its options, not the chance that it is
right: a small model is overconfident, and a layout can tilt every answer towards one label.
Fitted on labelled cases, two small maps correct that. `Temperature` (Guo et al., 2017)
rescales every score and keeps every answer. `OptionBias` adds one bias per option beside
the temperature, which also removes a label prior, so it may change answers. Both minimise
the labelled cases' log-loss, which is convex in their parameters; `choose` picks between
them by cross-validated calibration error and accuracy, never by the fit itself.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Sequence

from vllm_pcd.core.scoring.decision import Path, chosen
from vllm_pcd.core.scoring.scores import log_softmax

FLOOR = -100.0  # scores below this (options the head all but ruled out) count as this


class Row(NamedTuple):
    """One labelled field: its option scores, the gold index, and what the server answers
    from those scores (its resolved decision, with the paths and stepwise scores a greedy
    one reads), so held-out figures describe the answers a client gets."""

    scores: Sequence[float]
    gold: int
    decision: str = "most_probable"
    paths: tuple[Path, ...] = ()
    stepwise: tuple[float, ...] = ()


def _logits(scores: Sequence[float], inverse_t: float, bias: Sequence[float] = ()
            ) -> list[float]:
    """No bias (a temperature alone) serves fields of any number of options."""
    return [max(s, FLOOR) * inverse_t + b for s, b in zip(scores, bias or [0.0] * len(scores))]


@dataclass(frozen=True)
class Temperature:
    """Scores divided by one fitted temperature: confidence changes, answers do not."""

    method: ClassVar[str] = "temperature"
    is_identity: ClassVar[bool] = False
    temperature: float = 1.0

    def apply(self, scores: Sequence[float]) -> list[float]:
        return log_softmax(_logits(scores, 1 / self.temperature))

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "temperature": self.temperature}

    @classmethod
    def fit(cls, rows: Sequence[Row]) -> Temperature:
        inverse_t, _ = _minimise(rows, with_bias=False)
        return cls(1 / inverse_t)


@dataclass(frozen=True)
class OptionBias:
    """A temperature and one additive bias per option (vector scaling with a shared scale):
    the bias takes out what a layout or the options' own words add to every answer."""

    method: ClassVar[str] = "option_bias"
    is_identity: ClassVar[bool] = False
    temperature: float
    bias: tuple[float, ...]

    def apply(self, scores: Sequence[float]) -> list[float]:
        if len(scores) != len(self.bias):
            raise ValueError(f"{len(scores)} scores for a calibration of {len(self.bias)} options")
        return log_softmax(_logits(scores, 1 / self.temperature, self.bias))

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "temperature": self.temperature, "bias": list(self.bias)}

    @classmethod
    def fit(cls, rows: Sequence[Row]) -> OptionBias:
        inverse_t, bias = _minimise(rows, with_bias=True)
        return cls(1 / inverse_t, tuple(bias))


@dataclass(frozen=True)
class Identity:
    """No map: what a fitted method must beat."""

    method: ClassVar[str] = "none"
    is_identity: ClassVar[bool] = True  # scores unchanged: a greedy answer keeps its stepwise path

    def apply(self, scores: Sequence[float]) -> list[float]:
        return list(scores)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method}

    @classmethod
    def fit(cls, rows: Sequence[Row]) -> Identity:
        return cls()


Calibrator = Temperature | OptionBias | Identity
METHODS: dict[str, type[Calibrator]] = {c.method: c for c in (Identity, Temperature, OptionBias)}


def calibrator_from_dict(data: dict[str, Any]) -> Calibrator:
    method = data.get("method")
    if method == "temperature":
        return Temperature(float(data["temperature"]))
    if method == "option_bias":
        return OptionBias(float(data["temperature"]), tuple(float(b) for b in data["bias"]))
    if method == "none":
        return Identity()
    raise ValueError(f"unknown calibration method {method!r}")


# The biases' ridge: with few cases of a label, its bias would otherwise run off.
RIDGE = 1e-2


def _loss(rows: Sequence[Row], inverse_t: float, bias: Sequence[float]
          ) -> tuple[float, float, list[float]]:
    """Mean log-loss plus the ridge, and its gradient in (1/T, bias)."""
    loss, grad_t, grad_b = 0.0, 0.0, [0.0] * len(bias)
    for scores, gold, *_ in rows:
        logp = log_softmax(_logits(scores, inverse_t, bias))
        loss -= logp[gold]
        for i, (s, lp) in enumerate(zip(scores, logp)):
            residual = math.exp(lp) - (i == gold)
            grad_t += residual * max(s, FLOOR)
            if bias:
                grad_b[i] += residual
    n = len(rows)
    ridge = RIDGE * sum(b * b for b in bias) / 2
    return (loss / n + ridge, grad_t / n,
            [g / n + RIDGE * b for g, b in zip(grad_b, bias)])


def _minimise(rows: Sequence[Row], with_bias: bool, steps: int = 300
              ) -> tuple[float, list[float]]:
    """Gradient descent with a backtracking line search; 1/T stays positive."""
    if not rows:
        raise ValueError("nothing to fit: no labelled cases")
    inverse_t, bias = 1.0, [0.0] * len(rows[0][0]) if with_bias else []
    loss, grad_t, grad_b = _loss(rows, inverse_t, bias)
    step = 1.0
    for _ in range(steps):
        norm = grad_t * grad_t + sum(g * g for g in grad_b)
        if norm < 1e-12:
            break
        while step > 1e-10:
            t_new = max(inverse_t - step * grad_t, 1e-3)
            b_new = [b - step * g for b, g in zip(bias, grad_b)]
            new_loss, new_t, new_b = _loss(rows, t_new, b_new)
            if new_loss <= loss - 1e-4 * step * norm:
                inverse_t, bias, loss, grad_t, grad_b = t_new, b_new, new_loss, new_t, new_b
                step *= 2
                break
            step /= 2
        else:
            break
    return inverse_t, bias


def reliability(points: Sequence[tuple[float, bool]], bins: int = 10
                ) -> list[dict[str, float]]:
    """Equal-width confidence bins: count, mean confidence and accuracy of each non-empty one."""
    rows = []
    for k in range(bins):
        low, high = k / bins, (k + 1) / bins
        inside = [(p, ok) for p, ok in points if low <= p < high or (k == bins - 1 and p == 1)]
        if inside:
            rows.append({"low": low, "high": high, "count": len(inside),
                         "confidence": sum(p for p, _ in inside) / len(inside),
                         "accuracy": sum(ok for _, ok in inside) / len(inside)})
    return rows


def expected_calibration_error(points: Sequence[tuple[float, bool]], bins: int = 10
                               ) -> float | None:
    """Count-weighted gap between confidence and accuracy over the reliability bins."""
    if not points:
        return None
    return sum(r["count"] * abs(r["confidence"] - r["accuracy"])
               for r in reliability(points, bins)) / len(points)


def stepwise_kept(calibrator: Calibrator, stepwise: Sequence[float]) -> Sequence[float]:
    """The decoder's stepwise scores a greedy answer still reads after the map: only a map
    that leaves the scores as they are keeps them (the others are not calibrated)."""
    return stepwise if calibrator.is_identity else ()


def answer_points(calibrator: Calibrator, rows: Sequence[Row]) -> list[tuple[float, bool]]:
    """(probability of the answer given, was it right) per row, after the map: the answer the
    server gives under the row's decision."""
    out = []
    for row in rows:
        mapped = calibrator.apply(row.scores)
        best = chosen(row.decision, mapped, stepwise_kept(calibrator, row.stepwise), row.paths)
        out.append((math.exp(mapped[best]), best == row.gold))
    return out


def balanced_accuracy(calibrator: Calibrator, rows: Sequence[Row]) -> float | None:
    """The mean over gold options of their recall: what a label prior cannot raise."""
    recalls: dict[int, list[bool]] = {}
    for row, (_, ok) in zip(rows, answer_points(calibrator, rows)):
        recalls.setdefault(row.gold, []).append(ok)
    return sum(sum(r) / len(r) for r in recalls.values()) / len(recalls) if recalls else None


def halves(count: int, seed: int) -> tuple[list[int], list[int]]:
    """A seeded split of `count` items into two halves (indices)."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return sorted(order[:count // 2]), sorted(order[count // 2:])


def folds(count: int, k: int, seed: int) -> list[list[int]]:
    """A seeded split of `count` items into `k` test folds of near-equal size (indices)."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return [sorted(order[i::k]) for i in range(k)]


# Cross-validation folds for the choice of method: with two, each estimate rests on half the
# fitting cases and a noisy ECE picks the richer map where it does not hold up.
FOLDS = 5


@dataclass(frozen=True)
class Choice:
    method: str
    cross_validated: dict[str, dict[str, float | None]]  # method → ECE, accuracy


# What a profile's method is chosen for: `ece`, probabilities a client can threshold (the
# lowest cross-validated ECE among methods that keep no map's accuracy); `accuracy`, answers
# (the highest cross-validated accuracy, then the lowest ECE), for a client who takes the
# answer and would rather a label prior be undone at some cost in calibration.
OBJECTIVES = ("ece", "accuracy")


def choose(fields: Sequence[Sequence[Row]], seed: int,
           methods: Sequence[str] = ("none", "temperature", "option_bias"),
           objective: str = "ece") -> Choice:
    """The method `objective` prefers by k-fold cross-validation over all fields (each field
    fitted on its own)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}: one of {', '.join(OBJECTIVES)}")
    scores: dict[str, dict[str, float | None]] = {}
    for method in methods:
        points = []
        for rows in fields:
            k = min(FOLDS, len(rows))
            for test in folds(len(rows), k, seed):
                held = set(test)
                calibrator = METHODS[method].fit([r for i, r in enumerate(rows) if i not in held])
                points += answer_points(calibrator, [rows[i] for i in test])
        scores[method] = {"ece": expected_calibration_error(points),
                          "accuracy": sum(ok for _, ok in points) / len(points)}
    if objective == "accuracy":
        return Choice(min(methods, key=lambda m: (-scores[m]["accuracy"], scores[m]["ece"])),
                      scores)
    floor = scores["none"]["accuracy"] if "none" in scores else 0.0
    allowed = [m for m in methods if scores[m]["accuracy"] >= floor]
    return Choice(min(allowed, key=lambda m: scores[m]["ece"]), scores)
