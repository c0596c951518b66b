"""Every client-controlled part of a request, mutated, against the live multiprocess server:
`vllm_xargs` (every `pcd*` key, junk and valid-looking), `chat_template_kwargs` (reserved
keys, junk), request templates, `messages` (roles, content types), sampling options and the
schema, on the PCD route, plain chat, `/v1/completions` and the decision routes. Each body
gets a 2xx or a 4xx in OpenAI's format, never a 5xx (but vLLM's own 501 for a model its
`/v1/systemone` does not serve, behind `"pcd": false`); afterwards the engine is alive and
idle and a valid PCD request gets the identical answer."""

import asyncio
import copy
import json

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.engine_state import engine_state, is_idle, wait_until_idle
from tests.conftest import API_KEY, MESSAGE, SUPPORT_SCHEMA
from tests.helpers import DECISIONS, SYSTEMONE, junk, mutations

EXAMPLES = 1000
TAG_KEYS = ["pcd", "pcd_group", "pcd_group_size", "pcd_shared", "pcd_allowed", "PCD_x",
            "pcdx", "seed_other"]
valid_looking = st.sampled_from([
    "g", 3, 0, -1, [130], [1, 2], [[1]], 10 ** 12, None, True, "pcd-1-b0",
    {"group": "g", "group_size": 2}, {"group": "g", "group_size": 2, "sig": "0" * 64},
    {"allowed": [1, 2], "sig": "x"}, {"shared": [128], "sig": None}])
xargs = st.one_of(
    st.dictionaries(st.sampled_from(TAG_KEYS), valid_looking | junk, min_size=1, max_size=3),
    junk)
template_kwargs = st.dictionaries(
    st.sampled_from(["tokenize", "chat_template", "add_generation_prompt", "conversation",
                     "messages", "continue_final_message", "return_dict", "enable_thinking",
                     "tools", "documents", "padding", "max_length", "custom", "pcd_mode",
                     "pcd_formulation"]),
    junk | st.sampled_from(["{{ bad", "{% for %}", "{{ raise_exception('no') }}"]), max_size=3)
templates = st.sampled_from(["{{ bad", "{% for x in %}", "{{ raise_exception('no') }}",
                             "{{ messages[0]['content'] }}", "", "{{ 1/0 }}"]) | st.text(max_size=20)
content = (st.text(max_size=40) | st.none() | st.integers() | junk
           | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]),
                                             "text": junk | st.text(max_size=10)}), max_size=3))
messages = st.one_of(
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(
        ["user", "assistant", "system", "tool", "developer", "wizard", ""]) | junk,
        "content": content}), max_size=3),
    junk)
sampling = st.dictionaries(st.sampled_from(
    ["temperature", "top_p", "top_k", "max_tokens", "n", "logprobs", "top_logprobs", "seed",
     "stop", "logit_bias", "presence_penalty", "min_tokens", "stream", "response_format",
     "tools", "structured_outputs", "priority", "cache_salt", "prompt_logprobs", "echo",
     "ignore_eos", "min_p", "repetition_penalty", "allowed_token_ids", "bad_words"]),
    junk | st.sampled_from([-1, 0, 2, 10 ** 12, 1.5, "x", True, [], {}]), max_size=3)


def bounded(body):
    """A body that passes validation must stay small: at most 2 generated tokens, 2 choices.
    A null `max_tokens` is valid and means "up to the context length", so it is bounded too."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key, 0)
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 2):
            body[key] = 2
    if isinstance(body.get("n"), int) and body["n"] > 2:
        body["n"] = 2
    if isinstance(body.get("min_tokens"), int) and 0 < body["min_tokens"] <= 2:
        body["min_tokens"] = 0
    return body


question = st.fixed_dictionaries({"type": st.sampled_from(["noul", "choice", "score", "x"]) | junk,
                                  "instructions": junk, "criteria": junk})
decision_parts = {
    "systemone": {"state": junk, "questions": st.dictionaries(st.text(max_size=8), question,
                                                              max_size=3) | junk,
                  "instructions": junk, "chat_template_kwargs": template_kwargs | junk,
                  "cache_salt": junk, "pcd": junk, "images": junk, "request_id": junk},
    "decisions": {"input": junk, "joint": junk, "cache_salt": junk, "model": junk,
                  "questions": st.lists(st.fixed_dictionaries(
                      {"type": st.sampled_from(["predicate", "choice", "score"]),
                       "instructions": junk, "choices": junk, "levels": junk}), max_size=2) | junk},
}


def decision_body(draw, route):
    """A valid decision body (the e2e tests' own) with one to three parts replaced by junk."""
    body = copy.deepcopy(SYSTEMONE if route == "systemone" else {**DECISIONS, "model": MODEL})
    parts = decision_parts[route]
    for key in draw(st.lists(st.sampled_from(sorted(parts)), min_size=1, max_size=3)):
        body[key] = draw(parts[key])
    return route, body


@st.composite
def hostile_body(draw):
    route = draw(st.sampled_from(["pcd", "chat", "completions", "systemone", "decisions"]))
    if route in decision_parts:
        return decision_body(draw, route)
    body = {"model": MODEL, "max_tokens": 2}
    if route == "completions":
        body["prompt"] = draw(st.sampled_from(["Name a colour.", ""]) | junk)
    else:
        body["messages"] = [{"role": "user", "content": MESSAGE}]
    if route == "pcd":
        body["chat_template_kwargs"] = {"pcd_schema": copy.deepcopy(SUPPORT_SCHEMA)}
    parts = draw(st.lists(st.sampled_from(["xargs", "kwargs", "template", "messages",
                                           "sampling", "schema"]), min_size=1, max_size=3))
    for part in parts:
        if part == "xargs":
            body["vllm_xargs"] = draw(xargs)
        elif part == "kwargs" and route != "completions":
            body["chat_template_kwargs"] = {**body.get("chat_template_kwargs", {}),
                                            **draw(template_kwargs)}
        elif part == "template" and route != "completions":
            body["chat_template"] = draw(templates)
        elif part == "messages" and route != "completions":
            body["messages"] = draw(messages)
        elif part == "sampling":
            body.update(draw(sampling))
        elif part == "schema" and route == "pcd":
            body["chat_template_kwargs"] = draw(st.one_of(mutations()))
    return route, bounded(body)


MODEL = None


PATHS = {"completions": "/v1/completions", "systemone": "/v1/systemone",
         "decisions": "/v1/decisions"}


def send(http, route, body):
    path = PATHS.get(route, "/v1/chat/completions")
    with http.stream("POST", path, content=json.dumps(body, default=str)) as response:
        text = response.read().decode(errors="replace")
    return response.status_code, text


def test_a_thousand_hostile_bodies_get_a_2xx_or_4xx_and_change_nothing(pcd_server):
    global MODEL
    with httpx.Client(base_url=pcd_server, timeout=120,
                      headers={"Authorization": f"Bearer {API_KEY}",
                               "Content-Type": "application/json"}) as http:
        MODEL = http.get("/v1/models").json()["data"][0]["id"]
        valid = {"model": MODEL, "messages": [{"role": "user", "content": MESSAGE}],
                 "chat_template_kwargs": {"pcd_schema": SUPPORT_SCHEMA}}
        before = http.post("/v1/chat/completions", json=valid).json()
        idle = asyncio.run(engine(pcd_server, engine_state))
        statuses = {}

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(hostile_body())
        def survives(case):
            route, body = case
            status, text = send(http, route, body)
            stock_refusal = route == "systemone" and body.get("pcd") is False and status == 501
            assert status < 500 or stock_refusal, (route, json.dumps(body, default=str)[:400],
                                                   text[:400])
            if status >= 400:
                error = json.loads(text)["error"]
                assert error["code"] == status and error["message"], text[:300]
            statuses[(route, status)] = statuses.get((route, status), 0) + 1

        survives()
        print("statuses (route, code): count", dict(sorted(statuses.items())))
        assert sum(statuses.values()) >= EXAMPLES
        assert http.get("/health").status_code == 200
        after = http.post("/v1/chat/completions", json=valid).json()
        assert after["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
        assert after["pcd"]["fields"] == before["pcd"]["fields"]
        settled = asyncio.run(engine(pcd_server, wait_until_idle, idle["kv_usage"]))
        assert is_idle(settled, idle["kv_usage"]), (settled, idle)


async def engine(url, probe, *args):
    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        return await probe(http, MODEL, *args)
