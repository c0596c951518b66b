"""Two data-parallel engines behind one server: every request of a PCD call is pinned to one
engine, so its branches find the context's KV there (tokens computed = the single-engine
figure, two backbone calls) and its admission groups complete; calls use both engines."""

import re

import httpx
import pytest

from tests.conftest import API_KEY, MESSAGE, SERVER_ARGS, SIX_FIELD_SCHEMA, SUPPORT_SCHEMA
from tests.helpers import SYSTEMONE, own_tokens

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def dp_server(model_path, tmp_path_factory):
    from vllm_pcd.launch import serve

    log = tmp_path_factory.mktemp("dp") / "vllm.log"
    with serve(model_path, args=[*SERVER_ARGS, "--data-parallel-size", "2"], kv_cache_gib=1,
               log_path=log) as url:
        yield url


def per_engine(text, name):
    return {engine: float(value) for engine, value in
            re.findall(rf'^{re.escape(name)}{{engine="(\d+)"[^}}]*}} ([0-9.e+-]+)$', text, re.M)}


def test_pcd_calls_are_pinned_to_one_engine_each(dp_server, pcd_server, tokenizer):
    with httpx.Client(base_url=dp_server, headers=AUTH, timeout=300) as dp, \
            httpx.Client(base_url=pcd_server, headers=AUTH, timeout=300) as single:
        model = dp.get("/v1/models").json()["data"][0]["id"]
        before = per_engine(dp.get("/metrics").text, "vllm:prompt_tokens_total")
        for i in range(6):
            schema = (SUPPORT_SCHEMA, SIX_FIELD_SCHEMA)[i % 2]
            body = {"model": model, "messages": [{"role": "user", "content": MESSAGE}],
                    "chat_template_kwargs": {"pcd_schema": schema}, "cache_salt": f"dp-{i}"}
            answer = dp.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text[:300]
            diag = answer.json()["pcd"]
            assert diag["backbone_calls"] == 2
            assert diag["tokens"]["computed"] == own_tokens(tokenizer, schema)
            reference = single.post("/v1/chat/completions", json=body).json()
            assert answer.json()["choices"][0]["message"]["content"] == \
                reference["choices"][0]["message"]["content"]
            for name, field in diag["fields"].items():
                for got, want in zip(field["candidates"],
                                     reference["pcd"]["fields"][name]["candidates"]):
                    assert got["score"] == pytest.approx(want["score"], abs=1e-4)
        after = per_engine(dp.get("/metrics").text, "vllm:prompt_tokens_total")
        assert set(after) == {"0", "1"}
        assert all(after[e] > before.get(e, 0) for e in after), (before, after)
        plain = dp.post("/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 4})
        assert plain.status_code == 200 and "pcd" not in plain.json()


def test_decision_requests_are_pinned_to_one_engine_each(dp_server, pcd_server):
    """The decision routes make the same pinned PCD call: both engines answer the same
    probabilities as the single-engine server, in 2 backbone calls each. One salt of their
    own makes each engine's first call cold, as the reference is: a prefix an earlier test
    cached in other batch shapes would move bf16 scores."""
    salted = {**SYSTEMONE, "cache_salt": "dp-decision"}
    with httpx.Client(base_url=dp_server, headers=AUTH, timeout=300) as dp, \
            httpx.Client(base_url=pcd_server, headers=AUTH, timeout=300) as single:
        reference = single.post("/v1/systemone", json=salted).json()
        for _ in range(2):  # calls take the engines in turn
            answer = dp.post("/v1/systemone", json=salted)
            assert answer.status_code == 200, answer.text[:300]
            body = answer.json()
            assert body["pcd"]["backbone_calls"] == 2
            tokens = body["pcd"]["tokens"]  # the fork's exact accounting, on either engine
            assert tokens["computed"] == tokens["ideal"] - tokens["context_cached"]
            for qid, got in body["answers"].items():
                assert got["probabilities"] == pytest.approx(
                    reference["answers"][qid]["probabilities"], abs=1e-4)
