"""A server many tenants share, as an operator runs it: multiprocess `vllm serve` with the
plugin, without `--enable-prompt-tokens-details` (cache hits stay private) and with vLLM's
token-in route on. PCD's traffic changes no neighbour's output, and no door reaches its
engine channel."""

import json
import math
import threading

import httpx
import pytest

from tests.conftest import MESSAGE, SUPPORT_SCHEMA
from tests.helpers import DECISIONS, SYSTEMONE
from vllm_pcd.compat import vllm_version
from vllm_pcd.launch import serve

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

ARGS = ["--dtype", "float32", "--max-model-len", "4096",
        *(["--enable-scale-out"] if vllm_version() != "0.24.0" else [])]


@pytest.fixture(scope="module")
def http(model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("tenants") / "vllm.log"
    with serve(model_path, args=ARGS, log_path=log) as url:
        with httpx.Client(base_url=url, timeout=300) as client:
            client.model = client.get("/v1/models").json()["data"][0]["id"]
            yield client


def pcd(http, content=MESSAGE):
    response = http.post("/v1/chat/completions", json={
        "model": http.model, "messages": [{"role": "user", "content": content}],
        "chat_template_kwargs": {"pcd_schema": SUPPORT_SCHEMA}})
    assert response.status_code == 200, response.text
    return response.json()


def test_cache_hits_are_not_revealed_without_prompt_tokens_details(http):
    """The same document twice: the second is a cache hit, and nothing in either answer says
    so, as vLLM reports no cached tokens without the flag."""
    for _ in range(2):
        body = pcd(http)
        tokens = body["pcd"]["tokens"]
        assert "computed" not in tokens and "context_cached" not in tokens
        assert set(body["pcd"]["timings"]) == {"plan_s"}  # a cached context runs faster
        assert tokens["ideal"] == tokens["shared"] + tokens["branch"]
        assert "prompt_tokens_details" not in body["usage"] or \
            body["usage"]["prompt_tokens_details"] is None
    calibrated = http.post("/v1/chat/completions", json={
        "model": http.model, "messages": [{"role": "user", "content": MESSAGE}],
        "chat_template_kwargs": {"pcd_schema": SUPPORT_SCHEMA,
                                 "pcd_calibration": "content_free"}}).json()
    assert set(calibrated["pcd"]["calibration"]) == {"method"}
    decided = http.post("/v1/decisions", json={**DECISIONS, "model": http.model}).json()
    assert decided["usage"]["input_tokens_details"]["cached_tokens"] == 0
    one = http.post("/v1/systemone", json={**SYSTEMONE, "model": http.model}).json()
    assert "computed" not in one["pcd"]["tokens"] and set(one["pcd"]["timings"]) == {"plan_s"}


def test_the_token_in_route_cannot_reach_the_engine_channel(http):
    forged = {"pcd": {"group": "g", "group_size": 1, "sig": "0" * 64}}
    response = http.post("/inference/v1/generate", json={
        "model": http.model, "token_ids": [1, 2, 3],
        "sampling_params": {"max_tokens": 2, "extra_args": forged}})
    assert response.status_code == 400, response.text
    assert "reserved" in response.json()["error"]["message"]
    pcd(http)


def _top_logprobs(http):
    response = http.post("/v1/chat/completions", json={
        "model": http.model, "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 3, "temperature": 0, "logprobs": True, "top_logprobs": 5})
    assert response.status_code == 200, response.text
    return [{t["token"]: t["logprob"] for t in position["top_logprobs"]}
            for position in response.json()["choices"][0]["logprobs"]["content"]]


def test_a_neighbours_top_logprobs_are_unchanged_by_pcd_traffic(http):
    """Ordinary clients asking for top_logprobs while PCD calls run: every answer has its five
    finite alternatives at every position, the same as alone (FP32, so batching moves them
    only by rounding)."""
    alone = _top_logprobs(http)
    assert all(len(p) == 5 and all(math.isfinite(v) for v in p.values()) for p in alone)
    seen = []
    for _ in range(6):
        calls = [threading.Thread(target=pcd, args=(http, f"{MESSAGE} ({k})")) for k in range(3)]
        for call in calls:
            call.start()
        seen.append(_top_logprobs(http))
        for call in calls:
            call.join()
    for got in seen:
        assert [list(p) for p in got] == [list(p) for p in alone], json.dumps(got)
        for position, expected in zip(got, alone):
            assert position == pytest.approx(expected, abs=1e-3)
