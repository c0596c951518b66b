"""Pure metric functions for the evaluation: no I/O, no server, so they can be unit-tested.

A case is a (schema, expected, predicted) triple over a flat JSON schema of booleans, enums
and label sets (unique arrays of enum strings, right when the set is right). A method
that produced no object (an error, unparsable output) predicts None; its fields count as
wrong in the accuracies and it is left out of the answer-distribution shares, which describe
what a method answers when it answers.
"""

from __future__ import annotations

import math
import random
from typing import Any, NamedTuple, Sequence


class Case(NamedTuple):
    schema: dict[str, Any]
    expected: dict[str, Any]
    predicted: dict[str, Any] | None


def field_kind(spec: dict[str, Any]) -> str:
    if spec.get("type") == "array":
        return "labels"
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
        elif field_kind(spec) == "labels":
            if not isinstance(value, list) or len(set(map(str, value))) != len(value) \
                    or any(v not in spec["items"]["enum"] for v in value):
                return False
        elif isinstance(value, bool) or value not in spec["enum"]:
            return False
    return True


def _same(gold: Any, got: Any) -> bool:
    # `1 == True` in Python; a boolean answer must be a JSON boolean to count. A label set is
    # right when it names the same labels, in any order.
    if isinstance(gold, list) and isinstance(got, list):
        return all(isinstance(v, str) for v in got) and set(gold) == set(got)
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


def balanced_accuracy(cases: Sequence[Case]) -> float | None:
    """The mean, over every (field, gold label), of that label's recall: a method that
    answers by a label prior (always `true`, always the first option) scores 1/labels here,
    however the sample's labels are mixed."""
    recalls: dict[tuple[str, str], list[bool]] = {}
    for case in cases:
        for name, spec in case.schema["properties"].items():
            gold = case.expected[name]
            got = case.predicted.get(name) if isinstance(case.predicted, dict) else None
            recalls.setdefault((name, gold_label(spec, gold)), []).append(_same(gold, got))
    return share([share(hits) for hits in recalls.values()]) if recalls else None


def gold_label(spec: dict[str, Any], gold: Any) -> str:
    """The class a gold answer counts in: an enum's by its position among the options (a
    task whose options differ per case is balanced over positions), any other by value."""
    options = spec.get("enum") or []
    return f"option {options.index(gold)}" if gold in options else repr(gold)


def label_accuracy(cases: Sequence[Case]) -> float | None:
    """Of every label of every label-set field, the share whose membership the prediction
    gets right (None without label sets): partial credit beside the whole-set accuracy."""
    hits = []
    for case in cases:
        for name, spec in case.schema["properties"].items():
            if field_kind(spec) != "labels":
                continue
            got = case.predicted.get(name) if isinstance(case.predicted, dict) else None
            for label in spec["items"]["enum"]:
                hits.append(isinstance(got, list)
                            and (label in case.expected[name]) == (label in got))
    return share(hits)


def label_balanced(cases: Sequence[dict[str, Any]], limit: int | None, seed: int
                   ) -> list[dict[str, Any]]:
    """Up to `limit` cases (all, without one) with as many of each gold answer of the first
    field as the rarest has, drawn with `seed`: a sample whose label mix cannot reward a
    prior. An enum's gold counts by its position among the options, so a task whose options
    differ per case is balanced over the positions a prior would favour."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for case in cases:
        first, spec = next(iter(case["schema"]["properties"].items()))
        by_label.setdefault(gold_label(spec, case["expected"][first]), []).append(case)
    per_label = min(len(group) for group in by_label.values())
    if limit:
        per_label = min(per_label, limit // len(by_label))
    rng = random.Random(seed)
    return [c for label in sorted(by_label) for c in rng.sample(by_label[label], per_label)]


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


def case_hits(case: Case) -> tuple[int, int]:
    """(fields right, fields) of one case."""
    hits = field_hits([case])
    return sum(hits), len(hits)


def paired_bootstrap(a: Sequence[Case], b: Sequence[Case], *, exact: bool = False,
                     rounds: int = 2000, seed: int = 0) -> dict[str, float]:
    """Field (or exact-object) accuracy of `a` minus `b` on the same cases, with a 95%
    percentile interval from resampling cases (fields of one case stay together)."""
    if len(a) != len(b) or not a:
        raise ValueError("paired cases are needed")
    pairs = [((all(field_hits([x])), 1), (all(field_hits([y])), 1)) if exact
             else (case_hits(x), case_hits(y)) for x, y in zip(a, b)]

    def diff(sample: Sequence[tuple[tuple[int, int], tuple[int, int]]]) -> float:
        fields = sum(p[0][1] for p in sample)
        return (sum(p[0][0] for p in sample) - sum(p[1][0] for p in sample)) / fields

    rng = random.Random(seed)
    draws = sorted(diff([rng.choice(pairs) for _ in pairs]) for _ in range(rounds))
    return {"difference": diff(pairs), "low": percentile(draws, 2.5),
            "high": percentile(draws, 97.5)}


def confidences(cases: Sequence[Case], scores: Sequence[dict[str, list[float]] | None]
                ) -> list[tuple[float, bool]]:
    """(probability of the answer given, was it right) per field, from per-option
    log-probabilities in schema order (booleans: true, false); a label set gives one point
    per label, from its yes/no decision (scored as `<field>.<label>`). The answer is the one
    the object gives, which a greedy decision may take from below the most probable value."""
    out = []
    for case, per_field in zip(cases, scores):
        if not per_field or not isinstance(case.predicted, dict):
            continue
        for name, spec in case.schema["properties"].items():
            given = case.predicted.get(name)
            if field_kind(spec) == "labels":
                decisions = [(per_field[f"{name}.{label}"], label in case.expected[name],
                              isinstance(given, list) and label in given)
                             for label in spec["items"]["enum"]]
            else:
                decisions = [(per_field[name], case.expected[name], given)]
            for logprobs, gold, answer in decisions:
                options = [True, False] if isinstance(gold, bool) else spec["enum"]
                best = next((i for i, o in enumerate(options) if _same(o, answer)),
                            max(range(len(options)), key=logprobs.__getitem__))
                out.append((math.exp(logprobs[best]), _same(gold, options[best])))
    return out
