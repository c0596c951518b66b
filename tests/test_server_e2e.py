"""`vllm serve` with the plugin, as a user runs it, driven by the openai client."""

import json

import openai
import pytest

from tests.conftest import (API_KEY, KV_FORK, MESSAGE, SERVER_ARGS, SIX_FIELD_SCHEMA,
                            SUPPORT_SCHEMA, computed_tokens)
from vllm_pcd.engine import restrictable
from vllm_pcd.launch import serve
from vllm_pcd.pcd import as_messages
from vllm_pcd.plan import build_plan
from vllm_pcd.schema import parse_schema


def pcd(client, schema, content=MESSAGE, extra_kwargs=None, **extra):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, messages=[{"role": "user", "content": content}],
        extra_body={"chat_template_kwargs": {"pcd_schema": schema, **(extra_kwargs or {})},
                    **extra})


def own_tokens(tokenizer, schema):
    """Shared context once, then each token-mode request's own tokens (a boolean's three
    requests each recompute its short stem: they run in one step); on vLLM 0.24 each also
    recomputes the context's partial last block (`conftest.computed_tokens`)."""
    return computed_tokens(build_plan(tokenizer, parse_schema(schema), as_messages(MESSAGE)))


@pytest.mark.parametrize("schema", [SUPPORT_SCHEMA, SIX_FIELD_SCHEMA], ids=["2-field", "6-field"])
def test_pcd_answers_a_typed_object_with_diagnostics(client, tokenizer, schema):
    response = pcd(client, schema)
    obj = json.loads(response.choices[0].message.content)
    assert list(obj) == list(schema["properties"])
    for name, prop in schema["properties"].items():
        if prop.get("type") == "boolean":
            assert isinstance(obj[name], bool)
        else:
            assert obj[name] in prop["enum"]
    diag = response.model_extra["pcd"]
    assert diag["mode"] == "token" and diag["calibrated"] is False
    assert diag["tokens"]["computed"] == own_tokens(tokenizer, schema)
    if KV_FORK:
        assert diag["tokens"]["computed"] <= 1.2 * diag["tokens"]["ideal"]
    assert diag["backbone_calls"] == 2
    plan = build_plan(tokenizer, parse_schema(schema), as_messages(MESSAGE))
    assert diag["projection"] == {"route": "torch",  # this CPU's restricted-head route
                                  "restricted_requests": sum(restrictable(plan)),
                                  "fallbacks": 0}
    for name, field in diag["fields"].items():
        assert field["value"] == obj[name]
        probs = [c["probability"] for c in field["candidates"]]
        assert abs(sum(probs) - 1) < 1e-6 and field["margin"] >= 0
    assert response.usage.prompt_tokens == diag["tokens"]["ideal"]
    assert response.choices[0].finish_reason == "stop"


def test_invalid_schema_is_a_400_and_the_server_stays_up(client):
    bad = dict(SUPPORT_SCHEMA, additionalProperties=True)
    with pytest.raises(openai.BadRequestError) as info:
        pcd(client, bad)
    error = info.value.body
    assert "additionalProperties" in error["message"]
    assert info.value.status_code == 400
    with pytest.raises(openai.BadRequestError, match="pcd_schema must be a JSON object"):
        pcd(client, ["not", "an", "object"])
    with pytest.raises(openai.BadRequestError, match="stream"):
        pcd(client, SUPPORT_SCHEMA, stream=True)
    assert json.loads(pcd(client, SUPPORT_SCHEMA).choices[0].message.content)


def test_plain_chat_is_answered_by_vllm_as_without_the_plugin(client, model_path):
    """Greedy output through the plugin's route equals stock vLLM's (same engine, same
    request): the route must hand non-PCD requests over untouched."""
    request = dict(model=client.models.list().data[0].id, max_tokens=12, temperature=0,
                   messages=[{"role": "user", "content": "Name a colour."}])
    through_plugin = client.chat.completions.create(**request)
    assert through_plugin.model_extra.get("pcd") is None
    with serve(model_path, args=SERVER_ARGS, plugins=None) as url:
        stock = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY)
        without = stock.chat.completions.create(**request)
    assert through_plugin.choices[0].message.content == without.choices[0].message.content
    assert through_plugin.usage.prompt_tokens == without.usage.prompt_tokens


def test_sequence_and_mixed_modes_over_http(client):
    schema = dict(SIX_FIELD_SCHEMA, properties=dict(SIX_FIELD_SCHEMA["properties"]))
    schema["properties"]["urgent"] = {"type": "boolean", "x-pcd-mode": "token"}
    response = pcd(client, schema, extra_kwargs={"pcd_mode": "sequence"})
    diag = response.model_extra["pcd"]
    assert diag["mode"] == "mixed"
    assert diag["fields"]["urgent"]["mode"] == "token"
    assert diag["fields"]["language"]["mode"] == "sequence"
    obj = json.loads(response.choices[0].message.content)
    assert obj["language"] in ["English", "Español", "Deutsch"]
    cand = diag["fields"]["language"]["candidates"][1]
    assert cand["value"] == "Español" and cand["tokens"] >= 2 and cand["logprob_sum"] < 0


def test_codes_formulation_over_http(client):
    response = pcd(client, SUPPORT_SCHEMA, extra_kwargs={"pcd_formulation": "codes"})
    assert response.model_extra["pcd"]["fields"]["topic"]["codes"] == ["A", "B", "C", "D"]
