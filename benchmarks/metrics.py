"""Pure metric functions for the evaluation: no I/O, no server, so they can be unit-tested.

A case is a (schema, expected, predicted) triple over a flat bool/enum JSON schema. A method
that produced no object (an error, unparsable output) predicts None; its fields count as
wrong in the accuracies and it is left out of the answer-distribution shares, which describe
what a method answers when it answers.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence


class Case(NamedTuple):
    schema: dict[str, Any]
    expected: dict[str, Any]
    predicted: dict[str, Any] | None


def field_kind(spec: dict[str, Any]) -> str:
    return "boolean" if spec.get("type") == "boolean" else "enum"


def is_schema_valid(schema: dict[str, Any], obj: Any) -> bool:
    """Exactly the schema's keys, each a boolean or one of its enum values."""
    properties = schema["properties"]
    if not isinstance(obj, dict) or set(obj) != set(properties):
        return False
    for name, spec in properties.items():
        value = obj[name]
        if field_kind(spec) == "boolean":
            if not isinstance(value, bool):
                return False
        elif isinstance(value, bool) or value not in spec["enum"]:
            return False
    return True


def _same(gold: Any, got: Any) -> bool:
    # `1 == True` in Python; a boolean answer must be a JSON boolean to count.
    return type(gold) is type(got) and gold == got


def field_hits(cases: Sequence[Case], kind: str | None = None) -> list[bool]:
    """One entry per gold field (of `kind`, if given): did the prediction match it?"""
    hits = []
    for case in cases:
        for name, spec in case.schema["properties"].items():
            if kind is not None and field_kind(spec) != kind:
                continue
            got = case.predicted.get(name) if isinstance(case.predicted, dict) else None
            hits.append(_same(case.expected[name], got))
    return hits


def share(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def field_accuracy(cases: Sequence[Case], kind: str | None = None) -> float | None:
    return share(field_hits(cases, kind))


def exact_accuracy(cases: Sequence[Case]) -> float | None:
    return share([all(field_hits([case])) for case in cases])


def valid_rate(cases: Sequence[Case]) -> float | None:
    return share([is_schema_valid(case.schema, case.predicted) for case in cases])


def _answers(cases: Sequence[Case], kind: str, gold: bool) -> list[tuple[dict, Any]]:
    """(field spec, answer) for every field of `kind` that has an answer."""
    out = []
    for case in cases:
        obj = case.expected if gold else case.predicted
        if not isinstance(obj, dict):
            continue
        for name, spec in case.schema["properties"].items():
            if field_kind(spec) == kind and name in obj:
                out.append((spec, obj[name]))
    return out


def true_share(cases: Sequence[Case], gold: bool = False) -> float | None:
    """Share of boolean answers that are `true` (of the gold answers if `gold`)."""
    return share([value is True for _, value in _answers(cases, "boolean", gold)])


def first_option_share(cases: Sequence[Case], gold: bool = False) -> float | None:
    """Share of enum answers that are the field's first listed value: a position bias probe."""
    return share([value == spec["enum"][0] for spec, value in _answers(cases, "enum", gold)])


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


def p90(values: Sequence[float]) -> float | None:
    return percentile(values, 90)
