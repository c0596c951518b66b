"""Field results → the typed JSON object, and each field's diagnostics.

A field's scores come from `scoring`; here they only choose the value and are reported.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Sequence

from vllm_pcd.core.decision import chosen
from vllm_pcd.core.schema import FieldSpec, SchemaSpec


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


def validate_object(schema: SchemaSpec, obj: dict[str, Any]) -> None:
    """The assembled object must satisfy the schema; a failure here is a bug, not bad input."""
    if list(obj) != list(dict.fromkeys(f.keys[0] for f in schema.fields)):
        raise AssertionError(f"keys {list(obj)} differ from the schema's fields")
    for f in schema.fields:
        value = value_at(obj, f)
        if f.kind == "boolean" and not isinstance(value, bool):
            raise AssertionError(f"{f.name}: {value!r} is not a boolean")
        if f.kind == "enum" and not any(_same(value, o) for o in f.options):
            raise AssertionError(f"{f.name}: {value!r} is not one of the enum values")


def _same(a: Any, b: Any) -> bool:
    """JSON equality: `1` is not `true`."""
    return type(a) is type(b) and a == b


MISSING = object()  # what `value_at` gives for a field the object does not hold


def value_at(obj: Any, field: FieldSpec) -> Any:
    """The field's value in an object of its schema (a label-set decision: whether its label
    is in the array), or MISSING."""
    *parents, last = field.keys
    for key in parents:
        if not isinstance(obj, dict) or key not in obj:
            return MISSING
        obj = obj[key]
    if field.member:
        return last in obj if isinstance(obj, list) else MISSING
    return obj[last] if isinstance(obj, dict) and last in obj else MISSING


def option_index(field: FieldSpec, value: Any) -> int | None:
    """Which option `value` is (by JSON equality), or None."""
    return next((i for i, o in enumerate(field.options) if _same(o, value)), None)


def assemble(schema: SchemaSpec, results: Sequence[FieldResult]) -> dict[str, Any]:
    """The object of each field's best value."""
    return object_of(schema, [r.value for r in results])


def object_of(schema: SchemaSpec, values: Sequence[Any]) -> dict[str, Any]:
    """The object holding one value per field (in schema order). Nested fields go under their
    keys; a label set lists the labels decided true, in its enum order."""
    obj: dict[str, Any] = {}
    for f, value in zip(schema.fields, values, strict=True):
        *parents, last = f.keys
        place = obj
        for key in parents[:-1] if f.member else parents:
            place = place.setdefault(key, {})
        if f.member:
            labels = place.setdefault(parents[-1], [])
            if value is True:
                labels.append(last)
        else:
            place[last] = value
    validate_object(schema, obj)
    return obj


def to_json(obj: dict[str, Any]) -> str:
    """Compact JSON, keys in schema order, unicode kept as is."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
