"""Every door that carries a chat body gives PCD's answer or a clear 4xx, never free text; a
client reaches PCD's engine channel through none of them; a big body is refused at once and
stalls nobody. All on the multiprocess `vllm serve` the suite shares (`pcd_server`)."""

import json
import os
import subprocess
import threading
import time

import pytest

from tests.conftest import MESSAGE, SUPPORT_SCHEMA
from tests.helpers import DECISIONS, SYSTEMONE
from vllm_pcd.internals.handler import STRAY_SCHEMA

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

MESSAGES = [{"role": "user", "content": MESSAGE}]


def pcd_body(http, **extra):
    return {"model": http.model, "messages": MESSAGES,
            "chat_template_kwargs": {"pcd_schema": SUPPORT_SCHEMA}, **extra}


def answered_by_pcd(response):
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["pcd"]["backbone_calls"] == 2
    content = json.loads(body["choices"][0]["message"]["content"])
    assert set(content) == set(SUPPORT_SCHEMA["properties"])
    return content, body["pcd"]["fields"]


def test_invocations_answers_pcd_as_the_chat_route(http):
    """SageMaker's door dispatches chat bodies to vLLM's chat handler, where PCD answers. Each
    call under its own salt computes the same tokens in the same steps, so bf16 cannot part
    them (a prefix-cache hit would change the second call's batch shapes)."""
    route = answered_by_pcd(http.post("/v1/chat/completions",
                                      json=pcd_body(http, cache_salt="doors-route")))
    door = answered_by_pcd(http.post("/invocations",
                                     json=pcd_body(http, cache_salt="doors-invocations")))
    assert door[0] == route[0]
    for name, field in route[1].items():
        assert [c["score"] for c in door[1][name]["candidates"]] == pytest.approx(
            [c["score"] for c in field["candidates"]], abs=2e-3)


def test_invocations_answers_structured_outputs_as_the_chat_route(http):
    """vLLM's own guided choice, answered by PCD (the server opts in), through either door."""
    body = {"model": http.model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0,
            "structured_outputs": {"choice": ["billing", "shipping", "login"]}}
    route, door = (http.post(path, json=body).json() for path in
                   ("/v1/chat/completions", "/invocations"))
    assert "pcd" in route and "pcd" in door
    assert door["choices"][0]["message"]["content"] == \
        route["choices"][0]["message"]["content"] in body["structured_outputs"]["choice"]


def test_messages_route_built_on_the_chat_handler_answers_pcd(http):
    """Anthropic's `/v1/messages` calls the chat handler too: PCD's object as its text."""
    response = http.post("/v1/messages", json={**pcd_body(http), "max_tokens": 8})
    assert response.status_code == 200, response.text
    text = response.json()["content"][0]["text"]
    assert set(json.loads(text)) == set(SUPPORT_SCHEMA["properties"])


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"input": MESSAGE}),
    ("/v1/chat/completions/batch", {"messages": [MESSAGES, MESSAGES]}),
    ("/tokenize", {"messages": MESSAGES}),
])
def test_doors_that_cannot_carry_pcd_schema_refuse_it(http, path, body):
    response = http.post(path, json={"model": http.model, **body,
                                     "chat_template_kwargs": {"pcd_schema": SUPPORT_SCHEMA}})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"].startswith(STRAY_SCHEMA)


@pytest.mark.parametrize("form", ["escaped", "utf-16", "utf-32", "completions"])
def test_every_spelling_of_a_reserved_key_is_a_400(http, form):
    plain = {"model": http.model, "messages": MESSAGES, "max_tokens": 2}
    path = "/v1/chat/completions"
    if form == "escaped":  # JSON escapes spell the key without its letters
        raw = json.dumps({**plain, "vllm_xargs": {"KEY": 1}}).replace("KEY", "\\u0070cd_group")
        content = raw.replace("vllm_xargs", "\\u0076llm_xargs").encode()
    elif form.startswith("utf"):
        content = json.dumps({**plain, "vllm_xargs": {"pcd_group": "g"}}).encode(form)
    else:
        path = "/v1/completions"
        content = json.dumps({"model": http.model, "prompt": "hi", "max_tokens": 2,
                              "vllm_xargs": {"pcd": {"allowed": [1], "sig": "0" * 64}}}).encode()
    response = http.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    # vLLM 0.24's validation errors carry no param: the message names it there.
    assert "vllm_xargs" in (error["param"], *error["message"].split())
    assert "reserved" in error["message"]
    answered_by_pcd(http.post("/v1/chat/completions", json=pcd_body(http)))


def test_a_long_client_request_id_is_the_responses_alone(http):
    """Engine ids are fresh: a 200-character X-Request-Id only names the response, and two
    calls sharing an id do not mix their branches."""
    long_id = "r" * 200
    body = {**DECISIONS, "model": http.model}
    results = [None, None]

    def call(k):
        results[k] = http.post("/v1/decisions", json=body, headers={"X-Request-Id": long_id})

    threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alone = http.post("/v1/decisions", json=body)
    assert alone.status_code == 200, alone.text
    for response in results:
        assert response.status_code == 200, response.text
        # The same body, batched with its twin or alone: on a bf16 server the batch's shape
        # moves a probability a little (0.852 against 0.835 on a CPU with AMX).
        assert _probabilities(response.json()["answers"]) == pytest.approx(
            _probabilities(alone.json()["answers"]), abs=0.05)
    systemone = http.post("/v1/systemone", headers={"X-Request-Id": long_id},
                          json={**SYSTEMONE, "model": http.model})
    assert systemone.status_code == 200, systemone.text
    assert systemone.json()["id"] == f"decision-{long_id}"


def _probabilities(value):
    """Every probability in a decisions answer, in order."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in
                ([v] if k == "probability" else _probabilities(v))]
    if isinstance(value, list):
        return [p for v in value for p in _probabilities(v)]
    return []


def test_a_megabyte_body_is_refused_at_once_and_stalls_no_one(http):
    big = pcd_body(http, messages=[{"role": "user", "content": "word " * 200_000}])
    start = time.perf_counter()
    refused = http.post("/v1/chat/completions", json=big)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "messages"
    assert "max_prompt_chars" in refused.json()["error"]["message"]
    many = pcd_body(http, messages=MESSAGES * 300)
    assert http.post("/v1/chat/completions", json=many).json()["error"]["param"] == "messages"
    decision = http.post("/v1/systemone", json={**SYSTEMONE, "model": http.model,
                                                "state": {"ticket": "word " * 200_000}})
    assert decision.status_code == 400 and "max_prompt_chars" in decision.text
    answered_by_pcd(http.post("/v1/chat/completions", json=pcd_body(http)))
    assert time.perf_counter() - start < 300  # a bound on the test, not a timing claim


def test_run_batch_answers_every_pcd_line(model_path, tmp_path):
    """`vllm run-batch` (vLLM's OpenAI batch runner) with the plugin: each chat line with a
    pcd_schema gets PCD's object and diagnostics, and so does a guided choice (the batch opts in,
    as a server does); a plain line gets vLLM's free text. The runner submits every line at
    once: with room to plan one call at a time, the others wait their turn (a server would
    answer them 429, and a batch has nobody to retry)."""
    lines = [{"custom_id": f"pcd-{k}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": str(model_path), "messages": [{"role": "user", "content": text}],
                       "chat_template_kwargs": {"pcd_schema": SUPPORT_SCHEMA}}}
             for k, text in enumerate([MESSAGE, "My parcel never arrived.", "Reset my login."])]
    choices = ["billing", "shipping", "login"]
    lines.append({"custom_id": "choice", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": str(model_path), "structured_outputs": {"choice": choices},
                           "messages": [{"role": "user", "content": MESSAGE}]}})
    lines.append({"custom_id": "plain", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": str(model_path), "max_tokens": 3,
                           "messages": [{"role": "user", "content": "Hello"}]}})
    source, sink = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    from benchmarks.methods import PCD_CONFIG
    from vllm_pcd.models import fast_dtype
    from vllm_pcd.launch import vllm_command

    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING",)}
    env.update(VLLM_PLUGINS="pcd", VLLM_CPU_KVCACHE_SPACE="1")
    run = subprocess.run([vllm_command(), "run-batch", "-i", str(source), "-o", str(sink),
                          "--model", str(model_path), "--max-model-len", "4096",
                          "--dtype", fast_dtype(),
                          "--additional-config", json.dumps(
                              {"pcd": {**PCD_CONFIG, "limits": {"max_queued_plans": 1}}})],
                         env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    out = {o["custom_id"]: o for o in map(json.loads, sink.read_text().splitlines())}
    for k in range(3):
        body = out[f"pcd-{k}"]["response"]["body"]
        assert body["pcd"]["backbone_calls"] == 2, body
        assert set(json.loads(body["choices"][0]["message"]["content"])) == \
            set(SUPPORT_SCHEMA["properties"])
    choice = out["choice"]["response"]["body"]
    assert "pcd" in choice and choice["choices"][0]["message"]["content"] in choices
    assert "pcd" not in out["plain"]["response"]["body"]


def test_offline_chat_refuses_pcd_schema(fp32_llm):
    """vLLM's offline `LLM.chat` renders with vLLM's own parameters: a pcd_schema there is
    refused, naming `vllm_pcd.constrained`, instead of answered as free text."""
    with pytest.raises(ValueError) as err:
        fp32_llm.chat(MESSAGES, chat_template_kwargs={"pcd_schema": SUPPORT_SCHEMA})
    assert str(err.value).startswith(STRAY_SCHEMA)


def test_offline_chat_answers_a_guided_choice_by_pcd_as_greedy_decoding_would(fp32_llm):
    """The offline door gives a structured-output chat PCD's answer where a server would (here
    the call opts in), vLLM's `RequestOutput` in shape, and hands the rest to vLLM."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    choices = ["positive", "negative", "neutral"]  # one token each
    asked = [{"role": "user", "content": "Review: I love this blender, it is the best purchase "
              "I made all year. Is it positive, negative or neutral?"}]
    params = SamplingParams(temperature=0, max_tokens=16,
                            structured_outputs=StructuredOutputsParams(choice=choices))
    opt_in = {"pcd_structured_outputs": True}
    pcd = fp32_llm.chat([asked, MESSAGES], params, chat_template_kwargs=opt_in)
    stock = fp32_llm.chat([asked, MESSAGES], params)
    assert len(pcd) == 2 and all(hasattr(out, "pcd") for out in pcd)
    assert not hasattr(stock[0], "pcd")
    # On a clear case greedy grammar decoding's first token is PCD's best value (elsewhere it
    # may pick a shorter prefix token, such as "ne", that PCD does not score).
    assert pcd[0].outputs[0].text == stock[0].outputs[0].text == "positive"
    assert pcd[1].outputs[0].text in choices
    assert pcd[0].outputs[0].finish_reason == "stop" and pcd[0].outputs[0].token_ids
    schema = {"type": "object", "additionalProperties": False, "required": ["topic"],
              "properties": {"topic": {"enum": choices}}}
    as_json = SamplingParams(temperature=0, max_tokens=32,
                             structured_outputs=StructuredOutputsParams(json=schema))
    answered = fp32_llm.chat(asked, as_json, chat_template_kwargs=opt_in)[0]
    assert hasattr(answered, "pcd") and json.loads(answered.outputs[0].text) in \
        [{"topic": choice} for choice in choices]
    logprobs = SamplingParams(temperature=0, max_tokens=16, logprobs=1,
                              structured_outputs=StructuredOutputsParams(choice=choices))
    handed = fp32_llm.chat(asked, logprobs, chat_template_kwargs=opt_in)
    assert not hasattr(handed[0], "pcd") and handed[0].outputs[0].logprobs
    with pytest.raises(ValueError, match="pcd_structured_outputs"):
        fp32_llm.chat(MESSAGES, params, chat_template_kwargs={"pcd_structured_outputs": "yes"})
