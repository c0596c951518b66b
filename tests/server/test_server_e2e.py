"""`vllm serve` with the plugin, as a user runs it, driven by the openai client."""

import json
import math

import openai
import pytest

from tests.conftest import (API_KEY, CPU_BLOCK_SIZE, MESSAGE, SERVER_ARGS,
                            PROFILE_TEMPERATURE, PROFILED_SCHEMA, SIX_FIELD_SCHEMA,
                            SUPPORT_SCHEMA, computed_tokens)
from tests.helpers import own_tokens, pcd
from vllm_pcd.core.plan import Options, build_plan
from vllm_pcd.launch import serve
from vllm_pcd.pipeline import as_messages
from vllm_pcd.core.schema import parse_schema

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too


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
    assert diag["tokens"]["computed"] <= 1.2 * diag["tokens"]["ideal"]
    assert diag["backbone_calls"] == 2
    plan = build_plan(tokenizer, parse_schema(schema), as_messages(MESSAGE))
    assert diag["projection"] == {"route": "torch",  # this CPU's restricted-head route
                                  "restricted_requests": sum([s.restricted for s in plan.scorings]),
                                  "fallbacks": 0}
    for name, field in diag["fields"].items():
        assert field["value"] == obj[name]
        probs = [c["probability"] for c in field["candidates"]]
        assert abs(sum(probs) - 1) < 1e-6
        # the greedy default can choose below the most probable value only over a trie
        assert field["margin"] >= 0 or "stepwise_score" in field["candidates"][0]
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


WIDE_SCHEMA = {
    "type": "object",
    "properties": {f"aspect_{i}": {"type": "string", "enum": ["praised", "criticised", "absent"],
                                   "description": f"What the customer says about aspect {i} of "
                                                  "the service, if anything"}
                   for i in range(16)},
    "required": [f"aspect_{i}" for i in range(16)],
    "additionalProperties": False,
}


@pytest.mark.parametrize("layout", ["schema_first", "document_first"])
def test_a_second_document_with_the_same_schema_computes_only_its_own_tokens(
        client, tokenizer, layout):
    """Schema first, the field list's KV blocks computed for one document serve the next:
    the engine computes the second one's document and branch tokens only (within the
    partial block at the divergence). Document first, nothing beyond the template's opening
    is shared."""
    docs = [MESSAGE, "The app crashes whenever I open the settings page on my phone."]
    plans = [build_plan(tokenizer, parse_schema(WIDE_SCHEMA), as_messages(d),
                        Options(layout=layout))
             for d in docs]
    common = next(i for i, (a, b) in enumerate(zip(*(p.shared_ids for p in plans))) if a != b)
    salt = f"second-document-{layout}"
    first, second = (pcd(client, WIDE_SCHEMA, d, {"pcd_layout": layout}, cache_salt=salt)
                     for d in docs)
    assert first.model_extra["pcd"]["tokens"]["context_cached"] == 0
    tokens = second.model_extra["pcd"]["tokens"]
    reused = common - common % CPU_BLOCK_SIZE
    assert tokens["context_cached"] == reused
    assert tokens["computed"] == computed_tokens(plans[1]) - reused
    own = computed_tokens(plans[1]) - common  # its document on, and its branches
    assert 0 <= tokens["computed"] - own < CPU_BLOCK_SIZE
    if layout == "schema_first":
        assert reused >= 3 * CPU_BLOCK_SIZE  # the 16-field list
    else:
        assert reused < CPU_BLOCK_SIZE
    # another tenant (cache salt) shares nothing with this one
    other = pcd(client, WIDE_SCHEMA, docs[1], {"pcd_layout": layout}, cache_salt=salt + "-other")
    assert other.model_extra["pcd"]["tokens"]["context_cached"] == 0


@pytest.mark.parametrize("layout", ["sideways", 3, None, ["schema_first"]])
def test_a_junk_layout_is_a_400_naming_pcd_layout(client, layout):
    with pytest.raises(openai.BadRequestError) as err:
        pcd(client, SUPPORT_SCHEMA, extra_kwargs={"pcd_layout": layout})
    assert "pcd_layout" in str(err.value)


def test_a_greedy_decision_over_http_keeps_the_scores_and_follows_the_shared_token(client):
    """The greedy default and `pcd_decision: most_probable` differ in the choice, never the
    probabilities: the two `billing_…`
    values share their first token, so greedy takes the likelier of them whenever their
    stepwise sum (the first token's probability among the values' first tokens) beats each
    other value, and the stepwise likeliest value otherwise."""
    from tests.helpers import SPLIT, SPLIT_MESSAGE

    default, greedy = (pcd(client, SPLIT, SPLIT_MESSAGE, options, cache_salt="decision")
                       for options in ({"pcd_decision": "most_probable"}, {}))
    plain, chosen = (r.model_extra["pcd"]["fields"]["x"] for r in (default, greedy))
    probability = {c["value"]: c["probability"] for c in chosen["candidates"]}
    assert probability == pytest.approx(
        {c["value"]: c["probability"] for c in plain["candidates"]}, abs=1e-2)
    step = {c["value"]: math.exp(c["stepwise_score"]) for c in chosen["candidates"]}
    billing = {v: p for v, p in step.items() if v.startswith("billing")}
    others = {v: p for v, p in step.items() if v not in billing}
    assert sum(billing.values()) + sum(others.values()) == pytest.approx(1.0)
    expected = (max(billing, key=billing.get) if sum(billing.values()) > max(others.values())
                else max(others, key=others.get))
    assert chosen["value"] == expected == json.loads(greedy.choices[0].message.content)["x"]
    assert chosen["decision"] == "greedy" and "decision" not in plain
    assert plain["value"] == max(probability, key=probability.get)
    with pytest.raises(openai.BadRequestError, match="pcd_decision"):
        pcd(client, SPLIT, extra_kwargs={"pcd_decision": "beam"})


def test_content_free_calibration_is_computed_once_per_schema(client):
    """The first request computes the schema's prior beside its document; the next, under
    the same salt, finds it cached. The scores are the uncalibrated ones minus the prior's,
    renormalised, and the response says how they were calibrated."""
    options = {"pcd_calibration": "content_free"}
    first, second = (pcd(client, SIX_FIELD_SCHEMA, text, options, cache_salt="calibrated")
                     for text in (MESSAGE, "Where is my parcel? It was due on Monday."))
    assert first.model_extra["pcd"]["calibration"]["prior_cached"] is False
    assert first.model_extra["pcd"]["calibration"]["prior_tokens_computed"] > 0
    diag = second.model_extra["pcd"]
    assert diag["calibrated"] is True
    assert diag["calibration"] == {"method": "content_free", "prior_cached": True,
                                   "prior_tokens_computed": 0}
    assert diag["backbone_calls"] == 2
    for name, field in diag["fields"].items():
        raw = [c["uncalibrated_score"] - c["prior_score"] for c in field["candidates"]]
        top = max(raw)
        total = top + math.log(sum(math.exp(r - top) for r in raw))
        assert [c["score"] for c in field["candidates"]] == pytest.approx(
            [r - total for r in raw], abs=1e-9)
    plain = pcd(client, SIX_FIELD_SCHEMA, MESSAGE)
    assert plain.model_extra["pcd"]["calibrated"] is False
    assert plain.model_extra["pcd"]["calibration"] is None
    with pytest.raises(openai.BadRequestError, match="pcd_calibration"):
        pcd(client, SIX_FIELD_SCHEMA, MESSAGE, {"pcd_calibration": "platt"})


def test_a_loaded_profile_calibrates_its_schema_only(client):
    """The server's profile (conftest) maps its schema's scores and flags by its thresholds;
    the same schema under other options, and every other schema, stay uncalibrated."""
    diag = pcd(client, PROFILED_SCHEMA, MESSAGE).model_extra["pcd"]
    assert diag["calibrated"] is True
    assert diag["calibration"]["method"] == "option_bias"  # the first field's map
    assert diag["calibration"]["held_out_ece"] == 0.01
    urgent, channel = diag["fields"]["urgent"], diag["fields"]["channel"]
    assert urgent["value"] is False and urgent["low_confidence"] is False
    assert channel["low_confidence"] is True
    raw = [c["uncalibrated_score"] / PROFILE_TEMPERATURE for c in channel["candidates"]]
    total = math.log(sum(math.exp(r) for r in raw))
    assert [c["score"] for c in channel["candidates"]] == pytest.approx(
        [r - total for r in raw], abs=1e-9)
    other = pcd(client, PROFILED_SCHEMA, MESSAGE, {"pcd_layout": "document_first"})
    assert other.model_extra["pcd"]["calibrated"] is False
    assert "low_confidence" not in other.model_extra["pcd"]["fields"]["channel"]
