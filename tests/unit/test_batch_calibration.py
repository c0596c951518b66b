"""Batch calibration removes a prior the wording adds, using the documents alone: a synthetic
batch whose every score leans to one option by the same bias gets its labels back."""

import math
import random

import pytest

from vllm_pcd.core.scoring import (MIN_DOCUMENTS, FieldResult, RunningPriors, batch_prior,
                                   calibrate, too_few)
from vllm_pcd.core.plan import Options
from vllm_pcd.core.schema import FieldSpec, SchemaError

FIELD = FieldSpec("section", "enum", ("news", "sport", "tech", "arts"))


def log_softmax(xs):
    top = max(xs)
    total = math.log(sum(math.exp(x - top) for x in xs)) + top
    return tuple(x - total for x in xs)


def biased_batch(documents, bias, seed=0):
    """(gold labels, results): evidence for the gold option plus noise, then a prior that
    adds `bias` to option 0's logit in every document."""
    rng = random.Random(seed)
    gold = [k % len(FIELD.options) for k in range(documents)]
    results = []
    for label in gold:
        logits = [rng.gauss(0, 0.5) + (2.0 if i == label else 0.0)
                  for i in range(len(FIELD.options))]
        logits[0] += bias
        results.append((FieldResult(FIELD, log_softmax(logits)),))
    return gold, results


def accuracy(gold, results):
    return sum(r[0].value == FIELD.options[g] for g, r in zip(gold, results)) / len(gold)


def test_a_shared_prior_is_removed_without_labels():
    gold, results = biased_batch(64, bias=3.0)
    before = accuracy(gold, results)
    assert sum(r[0].value == "news" for r in results) > 0.8 * len(results)  # the prior wins
    prior = batch_prior(results)
    calibrated = [calibrate(r, prior.fields) for r in results]
    after = accuracy(gold, calibrated)
    assert before < 0.45 and after > 0.85
    shares = [sum(r[0].value == o for r in calibrated) / len(calibrated) for o in FIELD.options]
    assert max(shares) < 0.4  # close to the gold shares (0.25 each)
    assert prior.method == "batch" and prior.documents == 64


def test_without_a_prior_calibration_changes_little():
    gold, results = biased_batch(64, bias=0.0, seed=1)
    calibrated = [calibrate(r, batch_prior(results).fields) for r in results]
    assert accuracy(gold, calibrated) >= accuracy(gold, results) - 0.05


def test_too_few_documents_are_left_uncalibrated_and_say_why():
    _, results = biased_batch(MIN_DOCUMENTS - 1, bias=3.0)
    assert batch_prior(results) is None
    assert too_few(MIN_DOCUMENTS - 1) == {"method": "batch", "applied": False,
                                          "documents": MIN_DOCUMENTS - 1,
                                          "needed": MIN_DOCUMENTS}


def test_batch_is_an_option_of_its_own():
    assert Options(calibration="batch").calibration == "batch"
    with pytest.raises(SchemaError):
        Options(calibration="batches")


def test_a_running_estimate_equals_the_batch_mean_and_warms_up_first():
    """Online, each document joins its estimate before it is calibrated: the prior after n
    documents is the batch prior of those n, and none is given before MIN_DOCUMENTS."""
    _, results = biased_batch(MIN_DOCUMENTS + 4, bias=3.0)
    running = RunningPriors()
    for n, result in enumerate(results, start=1):
        size, prior = running.observe("tenant", result)
        assert size == n
        if n < MIN_DOCUMENTS:
            assert prior is None
        else:
            expected = batch_prior(results[:n]).fields[0].scores
            assert prior.fields[0].scores == pytest.approx(expected, abs=1e-12)
            assert prior.documents == n


def test_one_tenants_stream_never_moves_anothers_estimate():
    _, leaning = biased_batch(64, bias=3.0, seed=2)
    _, plain = biased_batch(MIN_DOCUMENTS, bias=0.0, seed=3)
    alone, shared = RunningPriors(), RunningPriors()
    for result in plain[:-1]:
        alone.observe(("b", "schema"), result)
        shared.observe(("b", "schema"), result)
    for result in leaning:
        shared.observe(("a", "schema"), result)
    assert alone.observe(("b", "schema"), plain[-1]) == shared.observe(("b", "schema"), plain[-1])


def test_a_running_estimate_removes_a_streams_prior_after_warming_up():
    gold, results = biased_batch(256, bias=3.0, seed=4)
    running = RunningPriors()
    answers = []
    for result in results:
        _, prior = running.observe("t", result)
        answers.append(result if prior is None else calibrate(result, prior.fields))
    warm = slice(64, None)
    assert accuracy(gold[warm], answers[warm]) > 0.85 > 0.45 > accuracy(gold[warm], results[warm])


def test_estimates_are_bounded_in_keys_and_follow_a_drifting_stream():
    running = RunningPriors(keys=4, window=32)
    _, results = biased_batch(4, bias=0.0)
    for key in range(10):
        running.observe(key, results[0])
    assert running.observe(0, results[0])[0] == 1  # dropped, least recently used: starts anew
    assert running.observe(9, results[0])[0] == 2
    # past the window, old documents weigh less: a stream that turns to option 0 shows it
    _, before = biased_batch(64, bias=0.0, seed=5)
    _, after = biased_batch(64, bias=4.0, seed=6)
    for result in before + after:
        _, prior = running.observe("drift", result)
    everything = math.exp(batch_prior(before + after).fields[0].scores[0])
    assert math.exp(prior.fields[0].scores[0]) > everything + 0.2
