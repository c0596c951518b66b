"""vLLM's own structured-output idioms, sent by the real OpenAI client to the multiprocess
server (which opts in with `additional_config.pcd.structured_outputs`): PCD answers what it
answers exactly, each compared with the same request on vLLM's own grammar decoding (the
request's `pcd_structured_outputs: false`), and hands the rest to vLLM untouched."""

import enum
import json
import math
from typing import Annotated, Literal, Optional

import openai
import pytest
from pydantic import BaseModel, Field

from tests.conftest import API_KEY
from vllm_pcd.compat import vllm_version
from vllm_pcd.core.scoring import FieldResult, draw_values, value_distribution
from vllm_pcd.core.schema import FieldSpec

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

REVIEW = "Review: I love this blender, it is the best purchase I made all year."
SENTIMENTS = ["positive", "negative", "neutral"]  # distinct first tokens
STOCK = {"chat_template_kwargs": {"pcd_structured_outputs": False}}


class Tone(enum.Enum):
    WARM = "warm"
    COLD = "cold"


class Product(BaseModel):
    category: Literal["kitchen", "garden", "office"]
    returned: bool


class Review(BaseModel):
    sentiment: Literal["positive", "negative", "neutral"]
    tone: Tone
    recommends: bool
    stars: Annotated[int, Field(ge=1, le=5)]
    complaint: Optional[Literal["price", "quality"]]
    product: Product


REVIEW_JSON_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["sentiment", "stars", "topics"],
    "properties": {
        "sentiment": {"enum": SENTIMENTS},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "topics": {"type": "array", "uniqueItems": True,
                   "items": {"enum": ["price", "quality", "delivery"]}},
    },
}


@pytest.fixture(scope="module")
def api(pcd_server):
    return openai.OpenAI(base_url=pcd_server + "/v1", api_key=API_KEY, max_retries=0)


def ask(api, extra=None, **kwargs):
    kwargs = {"model": api.models.list().data[0].id, "temperature": 0, "max_tokens": 64,
              "messages": [{"role": "user", "content": REVIEW + " Is it positive, negative or "
                            "neutral?"}], **kwargs}
    return api.chat.completions.create(extra_body=extra, **kwargs)


def pcd_of(response):
    return (response.model_extra or {}).get("pcd")


def test_guided_choice_is_answered_by_pcd_as_greedy_grammar_decoding_would(api):
    pcd = ask(api, {"structured_outputs": {"choice": SENTIMENTS}})
    stock = ask(api, {"structured_outputs": {"choice": SENTIMENTS}, **STOCK})
    assert pcd_of(pcd) is not None and pcd_of(stock) is None
    # choices apart at their first token: greedy decoding under the grammar takes the
    # most probable first token, which is PCD's best value
    assert pcd.choices[0].message.content == stock.choices[0].message.content
    assert pcd.choices[0].message.content in SENTIMENTS
    assert pcd.choices[0].finish_reason == "stop"
    probabilities = [c["probability"] for c in pcd_of(pcd)["fields"]["choice"]["candidates"]]
    assert sum(probabilities) == pytest.approx(1.0)


def test_older_clients_guided_choice_key_is_answered_too(api):
    response = ask(api, {"guided_choice": SENTIMENTS})
    assert pcd_of(response) is not None
    assert response.choices[0].message.content in SENTIMENTS


def test_sdk_parse_with_a_pydantic_model_gets_its_typed_object(api):
    messages = [{"role": "user", "content": REVIEW + " Describe the review."}]
    model = api.models.list().data[0].id
    answers = {}
    for name, extra in (("pcd", None), ("stock", STOCK)):
        completion = api.beta.chat.completions.parse(
            model=model, messages=messages, response_format=Review, temperature=0,
            max_tokens=200, extra_body=extra)
        answers[name] = completion
    pcd, stock = answers["pcd"], answers["stock"]
    assert pcd_of(pcd) is not None and pcd_of(stock) is None
    parsed = pcd.choices[0].message.parsed
    assert isinstance(parsed, Review) and isinstance(parsed.tone, Tone)
    assert isinstance(parsed.product, Product) and parsed.product.category in \
        ("kitchen", "garden", "office")
    assert 1 <= parsed.stars <= 5
    assert isinstance(stock.choices[0].message.parsed, Review)  # the same shape either way


def test_a_response_format_schema_of_finite_fields_is_answered_compactly(api):
    single = {**REVIEW_JSON_SCHEMA, "required": ["sentiment", "stars"],
              "properties": {k: REVIEW_JSON_SCHEMA["properties"][k] for k in ("sentiment", "stars")}}
    fmt = {"type": "json_schema", "json_schema": {"name": "review", "schema": single,
                                                  "strict": True}}
    pcd, stock = ask(api, response_format=fmt), ask(api, STOCK, response_format=fmt)
    assert pcd_of(pcd) is not None and pcd_of(stock) is None
    content = pcd.choices[0].message.content
    obj = json.loads(content)
    assert content == json.dumps(obj, separators=(",", ":"))
    assert list(obj) == ["sentiment", "stars"] and obj["stars"] in range(1, 6)
    assert list(json.loads(stock.choices[0].message.content)) == list(obj)  # vLLM's shape too


def test_a_label_set_schema_goes_to_vllm_as_its_list_prompt_reads_worse_by_pcd(api):
    """The client's prompt asks for a list; PCD's one yes/no branch per label does not continue
    it (measured worse than grammar decoding), so vLLM's path answers, as stock: its xgrammar
    backend refuses `uniqueItems` with a 400. (0.24's refusal may raise past its handler and
    break the client's pooled connection: not asked there.)"""
    if vllm_version() == "0.24.0":
        pytest.skip("vLLM 0.24's own uniqueItems refusal escapes its handler")
    fmt = {"type": "json_schema",
           "json_schema": {"name": "review", "schema": REVIEW_JSON_SCHEMA, "strict": True}}
    with pytest.raises(openai.BadRequestError) as info:
        ask(api, response_format=fmt, max_tokens=200)
    assert "pcd" not in str(info.value)


@pytest.mark.parametrize("change", [
    {"stream": True}, {"logprobs": True, "top_logprobs": 2}, {"n": 2, "temperature": 0.8},
    {"stop": ["e"]},
    {"max_tokens": 1}, {"extra": {"structured_outputs": {"regex": "yes|no"}}},
    {"extra": {"structured_outputs": {"choice": ["yes", "yes please"]}}},
    {"extra": {"structured_outputs": {"choice": SENTIMENTS},
               "chat_template_kwargs": {"pcd_structured_outputs": False}}},
])
def test_what_pcd_would_answer_otherwise_goes_to_vllm_untouched(api, change):
    change = dict(change)
    extra = change.pop("extra", {"structured_outputs": {"choice": SENTIMENTS}})
    if change.get("stream"):
        chunks = list(ask(api, extra, **change))
        assert not any(pcd_of(c) for c in chunks)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) in SENTIMENTS
        return
    response = ask(api, extra, **change)
    assert pcd_of(response) is None
    if "logprobs" in change:
        assert response.choices[0].logprobs.content  # vLLM's own, never silently empty
    if change.get("n") == 2:
        assert len(response.choices) == 2
    if change.get("max_tokens") == 1:
        assert response.choices[0].finish_reason == "length"


def test_a_bad_opt_in_value_is_refused_by_name(api):
    with pytest.raises(openai.BadRequestError) as info:
        ask(api, {"structured_outputs": {"choice": SENTIMENTS},
                  "chat_template_kwargs": {"pcd_structured_outputs": "yes"}})
    assert "pcd_structured_outputs" in str(info.value)


def test_a_seed_draws_the_same_value_from_pcds_distribution(api):
    extra = {"structured_outputs": {"choice": SENTIMENTS}}
    first = ask(api, extra, temperature=1.5, seed=7)
    again = ask(api, extra, temperature=1.5, seed=7)
    assert first.choices[0].message.content == again.choices[0].message.content
    assert pcd_of(first)["sampling"] == {"temperature": 1.5, "top_p": 1.0, "seed": 7}
    drawn = {ask(api, extra, temperature=2.0, seed=s).choices[0].message.content
             for s in range(24)}
    assert len(drawn) > 1  # flatter at vLLM's highest temperature


def test_sampling_options_stock_vllm_refuses_are_refused_alike(api):
    """PCD validates the sampling options by vLLM's own rules, before any work."""
    for temperature in (-1.0, 50.0):
        outcomes = []
        for own in (True, False):
            extra = {"structured_outputs": {"choice": SENTIMENTS},
                     "chat_template_kwargs": {"pcd_structured_outputs": own}}
            try:
                outcomes.append(pcd_of(ask(api, extra, temperature=temperature)) is not None)
            except openai.BadRequestError as err:
                outcomes.append(("400", "temperature" in str(err)))
        pcd, stock = outcomes
        if stock is not False:  # stock vLLM refused it: PCD refuses it alike
            assert pcd == stock == ("400", True), (temperature, outcomes)


def test_draws_follow_the_value_distribution():
    field = FieldSpec("x", "enum", ("a", "b", "c"))
    result = FieldResult(field, tuple(math.log(p) for p in (0.6, 0.3, 0.1)))
    counts = {o: 0 for o in field.options}
    for seed in range(4000):
        counts[draw_values([result], 1.0, seed=seed)[0]] += 1
    assert [round(counts[o] / 4000, 1) for o in "abc"] == [0.6, 0.3, 0.1]
    assert draw_values([result], 0.0, seed=1) == ["a"]
    assert value_distribution(result.scores, 1.0, top_p=0.8) == pytest.approx([2 / 3, 1 / 3, 0])
