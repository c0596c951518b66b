"""vLLM's decision routes answered by PCD on the default (Llama) model, driven with plain HTTP as
a client written for vLLM's own endpoints would: `/v1/systemone` (vLLM 0.32's shape) and
`/v1/decisions` (vLLM 0.33's)."""

import math

import httpx
import pytest

from tests.conftest import MESSAGE
from tests.helpers import DECISIONS, SYSTEMONE
from vllm_pcd.compat import vllm_version
from vllm_pcd.serving.decision_protocol import SystemOneRequest
from vllm_pcd.serving.decisions import systemone_request, to_schema

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too


def systemone(http, body, **headers):
    return http.post("/v1/systemone", json=body, headers=headers)


def test_every_systemone_question_type_gets_vllms_response_shape(http):
    response = systemone(http, SYSTEMONE, **{"X-Request-Id": "ticket-7"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert list(body)[:7] == ["id", "object", "created", "model", "answers", "usage",
                              "diagnostics"]
    assert body["id"] == "decision-ticket-7" and body["object"] == "structured_decision"
    assert body["model"] == http.get("/v1/models").json()["data"][0]["id"]
    answers = body["answers"]
    assert list(answers) == ["refund", "team", "urgency"]
    assert answers["refund"]["type"] == "noul"
    assert set(answers["refund"]["probabilities"]) == {"yes", "no"}
    assert answers["refund"]["noul"] == answers["refund"]["probabilities"]["yes"]
    assert answers["team"]["choice"] in ("billing", "tech")
    assert list(answers["team"]["probabilities"]) == ["billing", "tech"]
    assert answers["urgency"]["legend"] == {"0": "low", "1": "medium", "2": "high"}
    probs = answers["urgency"]["probabilities"]
    assert answers["urgency"]["score"] == pytest.approx(sum(int(k) * p for k, p in probs.items()))
    for qid, answer in answers.items():
        p = list(answer["probabilities"].values())
        assert math.isclose(sum(p), 1.0, abs_tol=1e-6)
        diagnostics = body["diagnostics"][qid]
        # measured on the full LM head: the options' mass over the vocabulary is below 1
        assert 0 < diagnostics["label_mass"] < 1
        assert isinstance(diagnostics["argmax_is_label"], bool)
        assert answer["confidence"] == pytest.approx(max(p) * diagnostics["label_mass"])
    if vllm_version() != "0.24.0":  # vLLM's own response model accepts the body as it is
        from vllm.entrypoints.generate.structured_decisions.protocol import \
            StructuredDecisionResponse
        assert StructuredDecisionResponse.model_validate(body).answers == answers
    pcd = body["pcd"]
    assert pcd["backbone_calls"] == 2
    assert pcd["projection"]["restricted_requests"] == 0
    assert body["usage"] == {"input_tokens": pcd["tokens"]["ideal"], "output_tokens": 3}
    assert pcd["tokens"]["computed"] <= 1.2 * pcd["tokens"]["ideal"]


def test_systemone_answers_what_the_chat_route_answers_for_the_same_schema(http):
    """One plan: the decision's probabilities are the chat route's (restricted head) scores.
    Each call under its own salt computes the same tokens in the same steps (a prefix-cache
    hit would change the second call's batch shapes, and bf16 moves with them)."""
    questions, messages = systemone_request(SystemOneRequest.model_validate(SYSTEMONE))
    decision = systemone(http, {**SYSTEMONE, "cache_salt": "same-plan-decision"}).json()
    chat = http.post("/v1/chat/completions", json={
        "model": decision["model"], "messages": messages, "cache_salt": "same-plan-chat",
        "chat_template_kwargs": {"pcd_schema": to_schema(questions)}}).json()
    for q in questions:
        candidates = chat["pcd"]["fields"][q.key]["candidates"]
        expected = [c["probability"] for c in candidates]
        got = list(decision["answers"][q.id]["probabilities"].values())
        assert got == pytest.approx(expected, abs=2e-3), q.id


def test_decisions_route_answers_in_vllm_033s_shape(http):
    body = {**DECISIONS, "model": http.get("/v1/models").json()["data"][0]["id"]}
    response = http.post("/v1/decisions", json=body)
    assert response.status_code == 200, response.text
    got = response.json()
    assert list(got) == ["model", "answers", "usage"]
    predicate, topic, resolved, urgency = got["answers"]
    assert predicate["type"] == "predicate" and predicate["name"] == "is_complaint"
    assert 0 <= predicate["probability"] <= 1
    assert topic["choice"] in ("billing", "shipping")
    assert [p["value"] for p in resolved["probabilities"]] == [False, True]
    assert isinstance(resolved["choice"], bool)
    assert [p["value"] for p in urgency["probabilities"]] == [0, 1]
    usage = got["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + 4 and usage["output_tokens"] == 4


def test_the_same_decision_twice_gets_the_same_answer(http):
    salt = {"cache_salt": "decisions-e2e"}
    first, again = (systemone(http, {**SYSTEMONE, **salt}).json() for _ in range(2))
    for qid, answer in first["answers"].items():
        assert again["answers"][qid]["probabilities"] == pytest.approx(answer["probabilities"],
                                                                        abs=1e-6)


@pytest.mark.parametrize("change, status, words", [
    ({"questions": {"q": {"type": "yesno"}}}, 400, "unknown question type 'yesno'"),
    ({"questions": {"q": {"type": "choice", "criteria": []}}}, 400, "choice criteria"),
    ({"questions": {"q": {"type": "noul", "extra": 1}}}, 400, "unknown field(s) ['extra']"),
    ({"questions": {}}, 400, "needs at least one question"),
    ({"questions": {f"q{i}": {"type": "noul"} for i in range(40)}}, 400, "at most 32"),
    ({"questions": {"x" * 80: {"type": "noul"}}}, 400, "questions"),
    ({"state": None, "questions": {"q": {"type": "noul", "instructions": "x" * 2000}}}, 400,
     "description is longer"),
    ({"cache_salt": "a/b"}, 400, "cache_salt"),
    ({"images": ["data:image/png;base64,AAAA"]}, 400, "does not take image inputs"),
    ({"chat_template_kwargs": {"enable_thinking": True}}, 400, "thinking"),
    ({"chat_template_kwargs": {"pcd_schema": {}}}, 400, "schema is its questions"),
    ({"chat_template_kwargs": {"pcd_layout": "sideways"}}, 400, "pcd_layout"),
    ({"chat_template_kwargs": {"chat_template": "{{ 1/0 }}"}}, 400, "chat_template"),
    ({"model": "no-such-model"}, 404, "does not exist"),
    ({"questions": "noul"}, 400, "questions"),
])
def test_bad_systemone_requests_get_a_4xx_naming_the_problem(http, change, status, words):
    body = {**SYSTEMONE, **change}
    if "state" not in change and "questions" in change:
        body["state"] = MESSAGE
    response = systemone(http, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["code"] == status


def test_joint_decisions_read_the_answers_before_them(http):
    """`joint: true` answers the questions in order, each reading those before it: the
    same response shape, at one engine step per question after the context."""
    body = {**DECISIONS, "model": http.get("/v1/models").json()["data"][0]["id"]}
    joint = http.post("/v1/decisions", json={**body, "joint": True})
    assert joint.status_code == 200, joint.text
    alone = http.post("/v1/decisions", json=body).json()
    got = joint.json()
    assert list(got) == ["model", "answers", "usage"]
    assert [(a["type"], a["name"]) for a in got["answers"]] == \
        [(a["type"], a["name"]) for a in alone["answers"]]
    # the later questions read the answers before them: more tokens than the parallel read
    assert got["usage"]["input_tokens"] > alone["usage"]["input_tokens"]


def test_bad_decisions_requests_get_a_400(http):
    for change in ({"questions": []}, {"surprise": True}, {"joint": "yes"},
                   {"questions": [{"type": "choice", "instructions": "x",
                                   "choices": [{"value": "a"}, {"value": True}]}]}):
        response = http.post("/v1/decisions", json={**DECISIONS, "model": "", **change})
        assert response.status_code == 400, (change, response.text)
        assert response.json()["error"]["message"]


def test_routes_keep_authentication_and_json_rules(http, pcd_server):
    assert httpx.post(pcd_server + "/v1/systemone", json=SYSTEMONE).status_code == 401
    assert httpx.post(pcd_server + "/v1/decisions", json=DECISIONS).status_code == 401
    text = http.post("/v1/systemone", content=b"{}", headers={"Content-Type": "text/plain"})
    assert text.status_code in (400, 415)


def test_vllms_own_systemone_stays_behind_a_switch(http):
    """`"pcd": false` hands the body to vLLM's handler, which serves only a few Qwen3-family
    architectures: on this Llama model it answers 501, as without the plugin."""
    response = systemone(http, {**SYSTEMONE, "pcd": False})
    if vllm_version() == "0.24.0":  # no such route in that vLLM
        assert response.status_code == 501 and "no /v1/systemone" in response.text
        return
    assert response.status_code == 501, response.text
    assert "does not support the structured decision API" in response.json()["error"]["message"]
    assert systemone(http, SYSTEMONE).status_code == 200
