"""The evaluation's derived calibrations, on synthetic answers: batch calibration regroups by
schema and leaves a schema with too few documents as the API leaves it; the coverage curve
and the above-chance test read what they claim."""

import math
import random

from benchmarks.calibration_methods import (above_chance, by_batch, coverage_curve, summary,
                                           task_methods)

SCHEMA = {"type": "object", "properties": {"section": {"type": "string", "enum": [
    "news", "sport", "tech"]}}, "required": ["section"], "additionalProperties": False}


def synthetic(documents, bias, seed=0, schema=SCHEMA):
    """Cases whose scores hold evidence for the gold plus a shared lean to option 0."""
    rng = random.Random(seed)
    options = schema["properties"]["section"]["enum"]
    cases, answers, scores = [], {}, {}
    for k in range(documents):
        gold = k % 3
        logits = [rng.gauss(0, 0.5) + (2.0 if i == gold else 0.0) + (bias if i == 0 else 0)
                  for i in range(3)]
        total = math.log(sum(math.exp(x) for x in logits))
        ident = f"t-{seed}-{k}"
        cases.append({"id": ident, "schema": schema, "expected": {"section": options[gold]}})
        scores[ident] = {"section": [x - total for x in logits]}
        answers[ident] = {"section": options[max(range(3), key=lambda i: logits[i])]}
    return cases, answers, scores


def accuracy(cases, answers):
    return sum(answers[c["id"]] == c["expected"] for c in cases) / len(cases)


def test_batch_calibration_of_an_evaluation_removes_its_shared_lean():
    cases, answers, scores = synthetic(60, bias=3.0)
    calibrated, calibrated_scores = by_batch(cases, answers, scores)
    assert accuracy(cases, answers) < 0.5 < 0.8 < accuracy(cases, calibrated)
    assert calibrated_scores != scores


def test_a_schema_with_too_few_documents_stays_as_answered():
    few, answers, scores = synthetic(10, bias=3.0)
    assert by_batch(few, answers, scores) == (answers, scores)


def test_coverage_keeps_the_most_probable_first():
    points = [(0.9, True), (0.8, True), (0.6, False), (0.4, False)]
    assert coverage_curve(points, steps=4) == [(0.25, 1.0), (0.5, 1.0), (0.75, 2 / 3),
                                               (1.0, 0.5)]


def test_above_chance_tells_a_prior_from_reading():
    cases, answers, _ = synthetic(60, bias=0.0)
    leaning = {c["id"]: {"section": "news"} for c in cases}
    assert above_chance(cases, answers) and not above_chance(cases, leaning)


def test_a_multi_field_task_reports_exact_objects_and_the_joint_method_beside_the_default():
    schema = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
              "properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"}}}
    cases = [{"id": f"m-{k}", "schema": schema, "expected": {"a": k % 2 == 0, "b": k % 3 == 0}}
             for k in range(12)]
    right = {c["id"]: dict(c["expected"]) for c in cases}
    one_off = {c["id"]: {**c["expected"], "b": not c["expected"]["b"]} if k < 6
               else dict(c["expected"]) for k, c in enumerate(cases)}
    task = {"answers": {"pcd_token": one_off, "pcd_token_joint": right, "ar_json": one_off},
            "scores": {"pcd_token": {}, "pcd_token_joint": {}}}
    rows = summary(cases, task_methods(task, cases))
    assert rows["default"]["field"] == 0.75 and rows["default"]["exact"] == 0.5
    assert rows["joint"]["exact"] == 1.0 and rows["joint"]["exact_vs_ar"]["difference"] == 0.5
    assert rows["default"]["by_field"]["b"]["accuracy"] == 0.5
