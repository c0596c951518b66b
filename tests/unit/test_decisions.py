"""Decision requests (vLLM's /v1/systemone and /v1/decisions shapes) as PCD schemas, and PCD
reads as their answers: the pure mapping, without a server."""

import math

import pytest
from pydantic import ValidationError

from tests.helpers import DECISIONS, SYSTEMONE
from vllm_pcd.serving.decision_protocol import DecisionsRequest, SystemOneRequest
from vllm_pcd.serving.decisions import (Read, check_cache_salt, decisions_request, decisions_response,
                                systemone_request, systemone_response, to_schema)
from vllm_pcd.core.schema import SchemaError, parse_schema

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too


def test_systemone_questions_become_one_closed_schema_and_a_chat():
    questions, messages = systemone_request(SystemOneRequest.model_validate(SYSTEMONE))
    schema = to_schema(questions)
    spec = parse_schema(schema)
    assert [f.name for f in spec.fields] == ["refund", "team", "urgency"]
    assert [f.kind for f in spec.fields] == ["boolean", "enum", "enum"]
    assert spec.fields[1].options == ("billing", "tech")
    assert spec.fields[2].options == ("low", "medium", "high")
    assert schema["properties"]["refund"]["description"] == \
        "Does the customer want money back?; true: asks for a refund"
    assert schema["properties"]["team"]["description"] == \
        "Which team should handle this?; billing: Payments and refunds"
    assert messages == [{"role": "system", "content": "You triage support tickets."},
                        {"role": "user", "content": '{"ticket": "My card was charged twice"}'}]


@pytest.mark.parametrize("question, message", [
    ({"type": "yesno"}, "unknown question type 'yesno'; supported: ['choice', 'noul', 'score']"),
    ({"type": "noul", "criteria": ["x"]}, "noul criteria must be an object with true and false"),
    ({"type": "noul", "criteria": {"maybe": 1}}, "noul criteria must be an object"),
    ({"type": "choice", "criteria": {}}, "choice criteria must map option names"),
    ({"type": "choice", "criteria": ["a", "b"]}, "choice criteria must map option names"),
    ({"type": "score", "criteria": ["only"]}, "score criteria must be an ordered list"),
    ({"type": "score", "criteria": ["a", "a"]}, "duplicate option names"),
    ({"type": "noul", "foo": 1, "bar": 2}, "unknown field(s) ['bar', 'foo']"),
])
def test_bad_systemone_questions_are_refused_with_vllms_messages(question, message):
    body = {"state": "x", "questions": {"q": question}}
    with pytest.raises(SchemaError, match=None) as err:
        systemone_request(SystemOneRequest.model_validate(body))
    assert message in str(err.value)


def test_systemone_refuses_media_and_empty_questions():
    with pytest.raises(SchemaError, match="does not take image inputs"):
        systemone_request(SystemOneRequest.model_validate(
            {"state": "x", "questions": {"q": {"type": "noul"}}, "images": ["data:,"]}))
    with pytest.raises(SchemaError, match="needs at least one question"):
        systemone_request(SystemOneRequest.model_validate({"state": "x", "questions": {}}))
    with pytest.raises(ValidationError):
        SystemOneRequest.model_validate({"questions": {}})  # state is required


@pytest.mark.parametrize("salt, ok", [(None, True), ("tenant-1", True), ("", False), (5, False),
                                      ("a/b", False), ("x" * 129, False), ("x" * 128, True)])
def test_cache_salts_follow_vllms_rule(salt, ok):
    if ok:
        check_cache_salt(salt)
    else:
        with pytest.raises(SchemaError, match="cache_salt"):
            check_cache_salt(salt)


def test_systemone_answers_have_vllms_keys_and_arithmetic():
    questions, _ = systemone_request(SystemOneRequest.model_validate(SYSTEMONE))
    reads = [Read((0.8, 0.2), 0.9, True), Read((0.3, 0.7), 0.5, False),
             Read((0.2, 0.3, 0.5), 1.0, True)]
    body = systemone_response("abc", "m", questions, reads, tokens_read=120)
    assert list(body) == ["id", "object", "created", "model", "answers", "usage", "diagnostics"]
    assert body["id"] == "decision-abc" and body["object"] == "structured_decision"
    refund, team, urgency = (body["answers"][k] for k in ("refund", "team", "urgency"))
    assert refund == {"type": "noul", "noul": 0.8, "probabilities": {"yes": 0.8, "no": 0.2},
                      "confidence": pytest.approx(0.72)}
    assert team == {"type": "choice", "choice": "tech",
                    "probabilities": {"billing": 0.3, "tech": 0.7},
                    "confidence": pytest.approx(0.35)}
    assert list(urgency) == ["type", "score", "legend", "probabilities", "confidence"]
    assert urgency["score"] == pytest.approx(0 * 0.2 + 1 * 0.3 + 2 * 0.5)
    assert urgency["legend"] == {"0": "low", "1": "medium", "2": "high"}
    assert body["usage"] == {"input_tokens": 120, "output_tokens": 3}
    assert body["diagnostics"]["team"] == {"label_mass": 0.5, "argmax_is_label": False}


def test_decisions_questions_become_fields_named_after_them():
    questions, messages = decisions_request(DecisionsRequest.model_validate(DECISIONS))
    assert messages == [{"role": "user",
                         "content": "Charged twice.\nRefund please.\n\nOrder 1234."}]
    # unnamed and repeated names get a position name; a true/false choice is a boolean
    assert [q.key for q in questions] == ["is_complaint", "topic", "question_3", "question_4"]
    spec = parse_schema(to_schema(questions))
    assert [f.kind for f in spec.fields] == ["boolean", "enum", "boolean", "enum"]
    assert to_schema(questions)["properties"]["question_3"]["description"] == \
        "Resolved?; true: closed"


def test_decisions_answers_keep_the_clients_option_order():
    questions, _ = decisions_request(DecisionsRequest.model_validate(DECISIONS))
    fields = parse_schema(to_schema(questions)).fields
    extra = {"label_mass": 0.5, "argmax_is_label": True}
    # the boolean field scores (true, false); the client listed false first
    read = Read.of(questions[2], fields[2].options, (math.log(0.9), math.log(0.1)), extra)
    assert read.probabilities == pytest.approx((0.1, 0.9))
    reads = [Read((0.6, 0.4), 1.0, True), Read((0.25, 0.75), 0.8, True), read,
             Read((0.5, 0.5), 1.0, True)]
    body = decisions_response("m", questions, reads, tokens_read=100, tokens_computed=30)
    assert list(body) == ["model", "answers", "usage"]
    predicate, topic, resolved, urgency = body["answers"]
    assert predicate == {"type": "predicate", "name": "is_complaint", "probability": 0.6}
    assert topic["choice"] == "shipping" and topic["confidence"] == pytest.approx(0.6)
    assert topic["probabilities"] == [{"value": "billing", "probability": 0.25},
                                      {"value": "shipping", "probability": 0.75}]
    assert resolved["choice"] is True and resolved["name"] is None
    assert [p["value"] for p in resolved["probabilities"]] == [False, True]
    assert urgency["probabilities"][1] == {"value": 1, "label": "high", "probability": 0.5}
    assert body["usage"] == {"input_tokens": 100,
                             "input_tokens_details": {"cached_tokens": 70, "cache_write_tokens": 0},
                             "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": 104}


@pytest.mark.parametrize("change, message", [
    ({"surprise": 1}, "extra"),
    ({"questions": []}, "at least 1"),
    ({"questions": [{"type": "predicate", "instructions": "x", "name": None}]},
     "name must be a string when provided"),
    ({"questions": [{"type": "choice", "instructions": "x",
                     "choices": [{"value": "a"}, {"value": "a"}]}]}, "choice values must be distinct"),
    ({"questions": [{"type": "choice", "instructions": "x", "choices": [{"value": 1}, {"value": 2}]}]},
     "valid string"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "text input only"),
    ({"input": [{"role": "assistant", "content": "x"}]}, "user"),
    ({"joint": "true"}, "boolean"),
])
def test_bad_decisions_bodies_fail_validation_as_in_vllm(change, message):
    with pytest.raises(ValidationError, match=None) as err:
        DecisionsRequest.model_validate({**DECISIONS, **change})
    assert message in str(err.value)


def test_decisions_pcd_refusals_name_the_question():
    mixed = {**DECISIONS, "questions": [{"type": "choice", "instructions": "x",
                                         "choices": [{"value": "a"}, {"value": True}]}]}
    with pytest.raises(SchemaError, match=r"questions\[0\]: PCD scores choices"):
        decisions_request(DecisionsRequest.model_validate(mixed))
    twice = {**DECISIONS, "questions": [{"type": "score", "instructions": "x",
                                         "levels": [{"label": "a"}, {"label": "a"}]}]}
    with pytest.raises(SchemaError, match="distinct level labels"):
        decisions_request(DecisionsRequest.model_validate(twice))


def test_label_mass_is_reported_only_where_the_full_head_scored():
    from vllm_pcd.core.scoring import RequestReport
    from vllm_pcd.core.scoring import vocabulary_extra as _vocabulary_extra

    full = RequestReport(10, 0, None, {5: math.log(0.5), 6: math.log(0.25)}, sampled=7)
    extra = _vocabulary_extra([full], full, {5, 6}, [math.log(0.5), math.log(0.25)])
    assert extra == {"label_mass": pytest.approx(0.75), "argmax_is_label": False}
    restricted = RequestReport(10, 0, None, {5: -0.1}, asked_restricted=True, restricted=True,
                               sampled=5)
    assert _vocabulary_extra([restricted], restricted, {5, 6}, [-0.1]) == {}
