"""Hostile bodies replayed against the multiprocess server the suite shares (`pcd_server`,
`--api-key` set, vLLM's structured outputs answered by PCD): each gets its answer or a 4xx
naming the problem, through every door that carries it; no door answers PCD without the key."""

import json
import uuid

import httpx
import pytest

from benchmarks.hostile_schemas import (SCHEMA_FAMILIES, closed, guided_choices, ref_fanout,
                                        surrogate_description)
from tests.conftest import MESSAGE, SUPPORT_SCHEMA
from vllm_pcd.core.scoring import MIN_DOCUMENTS
from vllm_pcd.core.config import pcd_config

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

MESSAGES = [{"role": "user", "content": MESSAGE}]


def post(http, body, path="/v1/chat/completions", **kwargs):
    """`body` as JSON bytes (escaped, so a lone surrogate travels as `\\ud800`)."""
    return http.post(path, content=json.dumps(body).encode(),
                     headers={"content-type": "application/json"}, **kwargs)


def pcd_body(http, schema, **extra):
    return {"model": http.model, "messages": MESSAGES, "chat_template_kwargs":
            {"pcd_schema": schema}, **extra}


def format_body(http, schema, **extra):
    return {"model": http.model, "messages": MESSAGES, "temperature": 0, "response_format":
            {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, **extra}


def refused(response, *words):
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert all(w in message for w in words), message
    return message


def test_ref_fanout_is_answered_on_both_doors(http):
    """7 definitions of 10 references each: a million paths, answered once per definition."""
    schema = ref_fanout(10)
    for body in (pcd_body(http, schema), format_body(http, schema)):
        response = post(http, body)
        assert response.status_code == 200, response.text
        assert response.json()["pcd"]["fields"]["x"]


def test_integer_ranges_are_refused_naming_the_limit(http):
    refused(post(http, pcd_body(http, SCHEMA_FAMILIES["range_union"][0](12))),
            "more than 256 values")


@pytest.mark.parametrize("family,size", [("nested_definition", 400), ("nested_union", 300)])
def test_deep_nesting_is_a_400_not_a_500(http, family, size):
    refused(post(http, pcd_body(http, SCHEMA_FAMILIES[family][0](size))), "deeper than")


def test_lone_surrogates_are_a_400_wherever_they_are(http):
    refused(post(http, pcd_body(http, surrogate_description())), "surrogate")
    body = pcd_body(http, SUPPORT_SCHEMA)
    body["messages"] = [{"role": "user", "content": "refund \ud800 please"}]
    refused(post(http, body), "surrogate")


def test_legacy_guided_choice_is_constrained_or_refused_never_free_text(http):
    """3,000 choices are past PCD's limits: vLLM ignores `guided_choice`, so the body is
    refused naming the key that constrains it, instead of answered unconstrained."""
    body = {"model": http.model, "messages": MESSAGES, "max_tokens": 8,
            "guided_choice": guided_choices(3000)}
    refused(post(http, body), "guided_choice", "structured_outputs.choice")
    body["guided_choice"] = ["billing", "shipping", "login"]
    answered = post(http, body)
    assert answered.status_code == 200 and "pcd" in answered.json()
    assert answered.json()["choices"][0]["message"]["content"] in body["guided_choice"]


@pytest.mark.parametrize("temperature", [-1, "NaN"])
def test_sampling_options_are_vllms_to_refuse_before_any_work(http, temperature):
    body = format_body(http, SUPPORT_SCHEMA)
    body["temperature"] = temperature
    response = http.post("/v1/chat/completions",
                         content=json.dumps(body).replace('"NaN"', "NaN").encode(),
                         headers={"content-type": "application/json"})
    assert response.status_code == 400 and "temperature" in response.text, response.text
    assert "pcd" not in response.json()


def test_a_token_limit_no_reply_fits_goes_to_vllm_before_pcd_works(http):
    """`max_tokens: 1` cannot hold any object of the schema: vLLM's path answers (with
    `length`), and no PCD call ran first."""
    body = format_body(http, SUPPORT_SCHEMA, max_tokens=1)
    response = post(http, body)
    assert response.status_code == 200 and "pcd" not in response.json()
    assert response.json()["choices"][0]["finish_reason"] == "length"


def test_joint_call_of_many_long_sequence_fields_is_refused_before_its_rounds(http):
    wide = closed({f"f{i}": {"enum": [f"a rather long option number {j} for field {i}"
                                      for j in range(8)]} for i in range(32)})
    body = pcd_body(http, wide)
    body["chat_template_kwargs"].update(pcd_mode="sequence", pcd_joint=True)
    refused(post(http, body), "engine requests")


def test_invocations_needs_the_api_key_for_what_pcd_answers(http):
    """vLLM guards `/v1` only; PCD's answers need the key on `/invocations` too. Without it a
    PCD body gets `/v1`'s 401 and a structured-output body vLLM's own (stock) answer."""
    with httpx.Client(base_url=str(http.base_url), timeout=300) as anonymous:
        assert anonymous.post("/v1/chat/completions",
                              json=pcd_body(http, SUPPORT_SCHEMA)).status_code == 401
        assert anonymous.post("/invocations",
                              json=pcd_body(http, SUPPORT_SCHEMA)).status_code == 401
        wrong = anonymous.post("/invocations", json=pcd_body(http, SUPPORT_SCHEMA),
                               headers={"Authorization": "Bearer not-the-key"})
        assert wrong.status_code == 401
        stock = anonymous.post("/invocations", json={
            "model": http.model, "messages": MESSAGES, "max_tokens": 4, "temperature": 0,
            "structured_outputs": {"choice": ["billing", "shipping"]}})
        assert stock.status_code == 200 and "pcd" not in stock.json()
    keyed = post(http, pcd_body(http, SUPPORT_SCHEMA), path="/invocations")
    assert keyed.status_code == 200 and "pcd" in keyed.json()


@pytest.mark.parametrize("extra,named", [
    ({"pcd": {"structured_output": True}}, "structured_output"),
    ({"pcd": {"limit": {"max_fields": 4}}}, "limit"),
    ({"pcd": {"structured_outputs": "yes"}}, "structured_outputs"),
    ({"pcd": []}, "object"),
])
def test_an_operator_typo_in_the_pcd_configuration_refuses_the_start(extra, named):
    with pytest.raises(ValueError, match=named):
        pcd_config(extra)
    with pytest.raises(ValueError, match=named):
        pcd_config(json.dumps(extra))


@pytest.mark.parametrize("part", [{"documents": [{"title": "policy", "text": "No refunds."}]},
                                  {"return_token_ids": True}, {"logprobs": True},
                                  {"prompt_logprobs": 1}, {"echo": True}])
def test_what_pcd_cannot_honour_is_refused_not_dropped(http, part):
    name = next(iter(part))
    assert name in refused(post(http, pcd_body(http, SUPPORT_SCHEMA, **part)), name)


def test_a_tenants_running_batch_estimate_never_moves_anothers_answer(http):
    """Online batch calibration keeps one estimate per API key and OpenAI `user`: tenant A's
    stream leaves tenant B's estimate and scores as they were, and each answer says how many
    documents its estimate holds."""
    a, b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"

    def ask(user, text):
        body = pcd_body(http, SUPPORT_SCHEMA, user=user,
                        messages=[{"role": "user", "content": text}])
        body["chat_template_kwargs"]["pcd_calibration"] = "batch"
        response = post(http, body)
        assert response.status_code == 200, response.text
        return response.json()["pcd"]

    def scores(pcd):
        return [c["score"] for f in pcd["fields"].values() for c in f["candidates"]]

    first = ask(b, MESSAGE)
    assert first["calibration"] == {"method": "batch", "applied": False, "documents": 1,
                                    "needed": MIN_DOCUMENTS, "estimate": "running"}
    assert first["calibrated"] is False
    for k in range(MIN_DOCUMENTS):
        last = ask(a, f"{MESSAGE} (ticket {k})")
    assert last["calibrated"] and last["calibration"]["documents"] == MIN_DOCUMENTS
    assert any("prior_score" in c for f in last["fields"].values() for c in f["candidates"])
    again = ask(b, MESSAGE)
    assert again["calibration"]["documents"] == 2 and again["calibrated"] is False
    assert scores(again) == pytest.approx(scores(first), abs=1e-3)


def test_a_guided_choice_of_numbers_with_a_token_limit_is_a_400_not_a_500(http):
    """Choices are text (the choice schema declares strings): numbers are not PCD's to answer
    nor to count as replies, and the legacy key vLLM ignores is refused by name."""
    body = {"model": http.model, "messages": MESSAGES, "max_tokens": 4, "guided_choice": [1, 2]}
    refused(post(http, body), "guided_choice")
