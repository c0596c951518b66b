"""Content-free calibration: the prior divided out, cached per schema, requested by name."""

import math

import pytest

from tests.conftest import MESSAGE, SUPPORT_SCHEMA
from vllm_pcd.core.scoring import (PriorCache, calibrate, content_free_messages, field_result,
                                   prior_key)
from vllm_pcd.core.plan import Options, build_plan
from vllm_pcd.core.schema import FieldSpec, SchemaError, parse_schema

OK = FieldSpec("ok", "boolean", (True, False))


def test_the_prior_is_divided_out_and_kept_in_the_diagnostics():
    document = field_result(OK, [math.log(0.6), math.log(0.4)])
    prior = field_result(OK, [math.log(0.8), math.log(0.2)])
    [got] = calibrate([document], [prior])
    # 0.6/0.8 against 0.4/0.2: false wins once the prior for true is divided out
    assert math.exp(got.scores[1]) == pytest.approx(0.4 / 0.2 / (0.6 / 0.8 + 0.4 / 0.2))
    assert document.value is True and got.value is False
    candidates = got.diagnostics()["candidates"]
    assert candidates[0]["uncalibrated_score"] == document.scores[0]
    assert candidates[1]["prior_score"] == prior.scores[1]
    [same] = calibrate([document], [field_result(OK, [0.0, 0.0])])  # a flat prior: no change
    assert same.scores == pytest.approx(document.scores)


def test_the_content_free_conversation_keeps_only_system_turns():
    chat = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "doc"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    assert content_free_messages(chat) == [{"role": "system", "content": "Be terse."},
                                           {"role": "user", "content": "N/A"}]


def test_priors_are_keyed_by_plan_scoring_and_tenant(tokenizer):
    spec = parse_schema(SUPPORT_SCHEMA)
    empty = build_plan(tokenizer, spec, content_free_messages([]))
    assert prior_key(empty, "sum", None) == prior_key(
        build_plan(tokenizer, spec, content_free_messages([])), "sum", None)
    assert prior_key(empty, "sum", "a") != prior_key(empty, "sum", "b")
    other = build_plan(tokenizer, spec, content_free_messages([]), Options(formulation="codes"))
    assert prior_key(other, "sum", None) != prior_key(empty, "sum", None)
    document = build_plan(tokenizer, spec, [{"role": "user", "content": MESSAGE}])
    assert prior_key(document, "sum", None) != prior_key(empty, "sum", None)


def test_the_cache_keeps_the_most_recent_priors():
    cache = PriorCache(size=2)
    cache.put("a", (1,))
    cache.put("b", (2,))
    assert cache.get("a") == (1,)  # now the most recent
    cache.put("c", (3,))
    assert cache.get("b") is None and cache.get("a") == (1,) and cache.get("c") == (3,)


@pytest.mark.parametrize("bad", ["platt", None, ["content_free"], 1])
def test_unknown_calibrations_are_refused(bad):
    with pytest.raises(SchemaError, match="pcd_calibration"):
        Options(calibration=bad)
    assert Options(calibration="content_free").calibration == "content_free"
