"""The evaluation's metric functions, on cases small enough to count by hand."""

import json
import math

import pytest

from benchmarks.metrics import (
    Case, balanced_accuracy, confidences, exact_accuracy, field_accuracy, first_option_share,
    is_schema_valid, label_accuracy, label_balanced, median, p90, paired_bootstrap, percentile, true_share,
    valid_rate)
from vllm_pcd.core.scoring import expected_calibration_error, reliability

SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "enum": ["billing", "technical", "shipping"]},
        "refund": {"type": "boolean"},
        "urgent": {"type": "boolean"},
    },
    "required": ["topic", "refund", "urgent"],
    "additionalProperties": False,
}
GOLD_1 = {"topic": "billing", "refund": False, "urgent": True}
GOLD_2 = {"topic": "shipping", "refund": True, "urgent": True}

CASES = [
    Case(SCHEMA, GOLD_1, {"topic": "billing", "refund": False, "urgent": True}),  # 3/3
    Case(SCHEMA, GOLD_2, {"topic": "billing", "refund": True, "urgent": False}),  # 1/3
    Case(SCHEMA, GOLD_1, None),                                                   # 0/3
]


def test_field_accuracy_counts_every_gold_field():
    assert field_accuracy(CASES) == pytest.approx(4 / 9)
    assert field_accuracy(CASES, "enum") == pytest.approx(1 / 3)
    assert field_accuracy(CASES, "boolean") == pytest.approx(3 / 6)


def test_exact_accuracy_needs_every_field():
    assert exact_accuracy(CASES) == pytest.approx(1 / 3)


def test_integer_is_not_a_boolean_answer():
    case = Case(SCHEMA, GOLD_1, {"topic": "billing", "refund": 0, "urgent": 1})
    assert field_accuracy([case], "boolean") == 0
    assert not is_schema_valid(SCHEMA, case.predicted)


@pytest.mark.parametrize("obj, valid", [
    ({"topic": "billing", "refund": True, "urgent": False}, True),
    ({"topic": "billing", "refund": True}, False),                                  # missing
    ({"topic": "billing", "refund": True, "urgent": False, "x": 1}, False),         # extra
    ({"topic": "Billing", "refund": True, "urgent": False}, False),                 # not in enum
    ({"topic": "billing", "refund": "true", "urgent": False}, False),               # string
    ({"topic": True, "refund": True, "urgent": False}, False),                      # bool in enum
    (None, False),
    ([1, 2, 3], False),
])
def test_schema_validity(obj, valid):
    assert is_schema_valid(SCHEMA, obj) is valid


def test_valid_rate():
    bad = Case(SCHEMA, GOLD_1, {"topic": "other", "refund": True, "urgent": True})
    assert valid_rate([*CASES, bad]) == pytest.approx(2 / 4)


def test_answer_shares_skip_missing_objects():
    # Predicted booleans: F, T (case 1), T, F (case 2); case 3 has no object.
    assert true_share(CASES) == pytest.approx(2 / 4)
    # Gold booleans: F, T, T, T, F, T.
    assert true_share(CASES, gold=True) == pytest.approx(4 / 6)
    # Predicted topics: billing, billing — both the first option.
    assert first_option_share(CASES) == 1
    # Gold topics: billing, shipping, billing.
    assert first_option_share(CASES, gold=True) == pytest.approx(2 / 3)


def test_shares_of_nothing_are_none():
    assert true_share([Case(SCHEMA, GOLD_1, None)]) is None
    assert field_accuracy([]) is None
    assert exact_accuracy([]) is None


def test_percentiles_interpolate_linearly():
    values = [4.0, 1.0, 3.0, 2.0]
    assert median(values) == pytest.approx(2.5)
    # position (4 - 1) * 0.9 = 2.7 → 3 + 0.7 * (4 - 3)
    assert p90(values) == pytest.approx(3.7)
    assert percentile([5.0], 90) == 5.0
    assert median([]) is None
    assert percentile(list(range(11)), 90) == pytest.approx(9.0)


def test_paired_bootstrap_difference_and_interval():
    worse = [Case(c.schema, c.expected, None) for c in CASES]
    got = paired_bootstrap(CASES, worse, rounds=500)
    assert got["difference"] == pytest.approx(4 / 9)
    assert 0 <= got["low"] <= got["difference"] <= got["high"] <= 1
    same = paired_bootstrap(CASES, CASES, rounds=200)
    assert same == {"difference": 0.0, "low": 0.0, "high": 0.0}
    exact = paired_bootstrap(CASES, worse, exact=True, rounds=200)
    assert exact["difference"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        paired_bootstrap(CASES, CASES[:2])


def test_confidence_is_the_probability_of_the_answer_given():
    scores = [{"topic": [math.log(0.7), math.log(0.2), math.log(0.1)],
               "refund": [math.log(0.4), math.log(0.6)],
               "urgent": [math.log(0.9), math.log(0.1)]}, None, None]
    points = confidences(CASES, scores)
    assert [(round(p, 6), ok) for p, ok in points] == [(0.7, True), (0.6, True), (0.9, True)]


def test_confidence_follows_the_answer_given_not_the_best_score():
    """A greedy decision can answer a value below the most probable one: its point is that
    value's probability and whether it was right."""
    scores = [{"topic": [math.log(0.3), math.log(0.45), math.log(0.25)],
               "refund": [math.log(0.4), math.log(0.6)],
               "urgent": [math.log(0.9), math.log(0.1)]}]
    points = confidences(CASES[:1], scores)  # answered billing, gold billing
    assert [(round(p, 6), ok) for p, ok in points] == [(0.3, True), (0.6, True), (0.9, True)]


def test_reliability_bins_and_ece():
    points = [(0.95, True), (0.95, False), (0.55, True), (1.0, True)]
    bins = reliability(points)
    assert [(b["low"], b["count"]) for b in bins] == [(0.5, 1), (0.9, 3)]
    assert bins[1]["accuracy"] == pytest.approx(2 / 3)
    # |0.55 - 1| * 1 + |(0.95 + 0.95 + 1) / 3 - 2/3| * 3, over 4 points
    assert expected_calibration_error(points) == pytest.approx((0.45 + abs(2.9 - 2)) / 4)
    assert expected_calibration_error([(1.0, True)]) == 0
    assert expected_calibration_error([]) is None


def test_two_runs_are_compared_case_by_case(tmp_path):
    from benchmarks.compare_runs import compare

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    cases = [{"id": f"c{i}", "schema": schema, "expected": {"ok": i % 2 == 0}} for i in range(4)]
    source = tmp_path / "cases.jsonl"
    source.write_text("\n".join(json.dumps(c) for c in cases))
    right = {c["id"]: c["expected"] for c in cases}
    wrong = {c["id"]: {"ok": not c["expected"]["ok"]} for c in cases[:2]} | dict(
        list(right.items())[2:])
    run = {"limit": None, "tasks": {str(source): {"answers": {"m": right}}}}
    other = {"limit": None, "tasks": {str(source): {"answers": {"m": wrong}}}}
    lines = compare(run, "m", other, "m")
    assert lines[0].startswith(f"{source}: field +50.0") and "exact +50.0" in lines[0]
    assert lines[-1].startswith("pooled public: field +50.0")


def test_two_runs_scores_agree_where_their_most_probable_values_do():
    from benchmarks.compare_runs import agreement

    log = math.log
    source = {"c0": {"ok": [log(0.9), log(0.1)]}, "c1": {"ok": [log(0.6), log(0.4)]}}
    moved = {"c0": {"ok": [log(0.8), log(0.2)]}, "c1": {"ok": [log(0.3), log(0.7)]}}
    runs = [{"tasks": {"t": {"scores": {"m": scores}}}} for scores in (source, moved)]
    line, = agreement(runs[0], "m", runs[1], "m")
    assert line.startswith("t: 1/2 fields agree (50.0%)")
    # per option apart: 0.1, 0.1, 0.3, 0.3
    assert line.endswith("median 0.2000, largest 0.3000")


YES_NO = {"type": "object", "properties": {"answer": {"type": "boolean"}},
          "required": ["answer"], "additionalProperties": False}


def test_balanced_accuracy_gives_a_label_prior_nothing():
    """Always `true` on three true cases and one false: 75% accurate, 50% balanced."""
    always_true = [Case(YES_NO, {"answer": gold}, {"answer": True})
                   for gold in (True, True, True, False)]
    assert field_accuracy(always_true) == pytest.approx(0.75)
    assert balanced_accuracy(always_true) == pytest.approx(0.5)
    reading = [Case(YES_NO, {"answer": gold}, {"answer": gold}) for gold in (True, False)]
    assert balanced_accuracy(reading) == 1.0
    # per (field, label): billing 1/2, shipping 0/1, refund false 1/2 and true 1/1,
    # urgent true 1/3 (the missing object counts as wrong)
    assert balanced_accuracy(CASES) == pytest.approx((0.5 + 0 + 0.5 + 1 + 1 / 3) / 5)


def test_a_label_balanced_sample_has_as_many_of_each_answer():
    cases = [{"schema": YES_NO, "expected": {"answer": i % 4 == 0}, "id": i} for i in range(40)]
    sample = label_balanced(cases, None, seed=0)
    assert len(sample) == 20 and sum(c["expected"]["answer"] for c in sample) == 10
    limited = label_balanced(cases, 8, seed=0)
    assert len(limited) == 8 and sum(c["expected"]["answer"] for c in limited) == 4
    assert label_balanced(cases, 8, seed=0) == limited  # the draw is seeded


LABELS = {"type": "object", "required": ["topics"], "additionalProperties": False,
          "properties": {"topics": {"type": "array", "uniqueItems": True,
                                    "items": {"enum": ["business", "sport", "tech"]}}}}


def test_a_label_set_is_right_as_a_set_and_scored_per_label():
    cases = [Case(LABELS, {"topics": ["sport", "tech"]}, {"topics": ["tech", "sport"]}),
             Case(LABELS, {"topics": ["business"]}, {"topics": ["business", "tech"]}),
             Case(LABELS, {"topics": ["sport"]}, None)]
    assert field_accuracy(cases) == pytest.approx(1 / 3)
    assert label_accuracy(cases) == pytest.approx(5 / 9)  # 3 + 2 + 0 of 3 labels each
    assert label_accuracy(CASES) is None
    assert is_schema_valid(LABELS, {"topics": ["tech", "sport"]})
    assert not is_schema_valid(LABELS, {"topics": ["tech", "tech"]})
    assert not is_schema_valid(LABELS, {"topics": ["news"]})
    assert not is_schema_valid(LABELS, {"topics": "tech"})


def test_a_label_set_gives_one_confidence_per_label():
    cases = [Case(LABELS, {"topics": ["sport"]}, {"topics": ["sport", "tech"]})]
    yes_no = {"topics.business": [math.log(0.2), math.log(0.8)],
              "topics.sport": [math.log(0.9), math.log(0.1)],
              "topics.tech": [math.log(0.7), math.log(0.3)]}
    points = confidences(cases, [yes_no])
    assert [(round(p, 6), ok) for p, ok in points] == [(0.8, True), (0.9, True), (0.7, False)]
