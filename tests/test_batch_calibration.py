"""Batch calibration removes a prior the wording adds, using the documents alone: a synthetic
batch whose every score leans to one option by the same bias gets its labels back."""

import math
import random

import pytest

from vllm_pcd.core.assemble import FieldResult
from vllm_pcd.core.batch_calibration import MIN_DOCUMENTS, batch_prior, too_few
from vllm_pcd.core.options import Options
from vllm_pcd.core.schema import FieldSpec, SchemaError
from vllm_pcd.core.scoring import calibrate

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
