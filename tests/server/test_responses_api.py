"""The Responses API (`/v1/responses`) with a finite-choice `text.format` or vLLM's guided
choice, sent by the real OpenAI client to the multiprocess server: answered by PCD as a
`response` object, compared with the same request on vLLM's own grammar decoding (the
request's `pcd_structured_outputs: false`), and handed to vLLM where PCD would answer
otherwise."""

from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from tests.conftest import API_KEY

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

REVIEW = "Review: I love this blender, it is the best purchase I made all year."
SENTIMENTS = ["positive", "negative", "neutral"]  # distinct first tokens
STOCK = {"chat_template_kwargs": {"pcd_structured_outputs": False}}
CHOICE = {"structured_outputs": {"choice": SENTIMENTS}}


class Verdict(BaseModel):
    sentiment: Literal["positive", "negative", "neutral"]
    recommends: bool


@pytest.fixture(scope="module")
def api(pcd_server):
    return openai.OpenAI(base_url=pcd_server + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(api):
    return api.models.list().data[0].id


def pcd_of(response):
    return (response.model_extra or {}).get("pcd")


def ask(api, model, extra=None, **kwargs):
    kwargs = {"model": model, "temperature": 0, "max_output_tokens": 64,
              "input": REVIEW + " Is it positive, negative or neutral?", **kwargs}
    return api.responses.create(extra_body=extra, **kwargs)


def test_guided_choice_is_answered_by_pcd_as_greedy_grammar_decoding_would(api, model):
    pcd, stock = ask(api, model, CHOICE), ask(api, model, {**CHOICE, **STOCK})
    assert pcd_of(pcd) is not None and pcd_of(stock) is None
    assert pcd.output_text == stock.output_text and pcd.output_text in SENTIMENTS
    assert (pcd.object, pcd.status, pcd.model) == ("response", "completed", model)
    assert [item.type for item in pcd.output] == ["message"]
    assert pcd.usage.input_tokens > 0 and pcd.usage.output_tokens == 1
    assert pcd.temperature == 0


def test_sdk_parse_with_a_text_format_model_gets_its_typed_object(api, model):
    messages = [{"role": "user", "content": REVIEW + " Describe the review."}]
    answers = {name: api.responses.parse(model=model, input=messages, text_format=Verdict,
                                         instructions="Answer in JSON.", temperature=0,
                                         max_output_tokens=100, extra_body=extra)
               for name, extra in (("pcd", None), ("stock", STOCK))}
    pcd, stock = answers["pcd"], answers["stock"]
    assert pcd_of(pcd) is not None and pcd_of(stock) is None
    assert isinstance(pcd.output_parsed, Verdict) and isinstance(stock.output_parsed, Verdict)
    assert pcd.output_text == pcd.output_parsed.model_dump_json().replace(" ", "")
    assert pcd.instructions == "Answer in JSON."


@pytest.mark.parametrize("change", [
    {"stream": True},
    {"include": ["message.output_text.logprobs"], "top_logprobs": 2},
    {"max_output_tokens": 1},
    {"extra": {"structured_outputs": {"regex": "yes|no"}}},
    {"input": [{"role": "user", "content": REVIEW},
               {"role": "assistant", "content": "It is"}]},
    {"extra": {**CHOICE, **STOCK}},
])
def test_what_pcd_would_answer_otherwise_goes_to_vllm_untouched(api, model, change):
    change = dict(change)
    extra = change.pop("extra", CHOICE)
    if change.get("stream"):
        events = list(ask(api, model, extra, **change))
        assert events and not any(pcd_of(getattr(e, "response", None) or e) for e in events)
        assert events[-1].type == "response.completed"
        assert events[-1].response.output_text in SENTIMENTS
        return
    response = ask(api, model, extra, **change)
    assert pcd_of(response) is None
    if "include" in change:
        assert response.output[0].content[0].logprobs  # vLLM's own, never silently empty
    if change.get("max_output_tokens") == 1:
        assert response.status == "incomplete"


def test_a_bad_opt_in_value_is_refused_by_name(api, model):
    with pytest.raises(openai.BadRequestError) as info:
        ask(api, model, {**CHOICE, "chat_template_kwargs": {"pcd_structured_outputs": 1}})
    assert "pcd_structured_outputs" in str(info.value)


def test_pcd_schema_on_the_responses_api_is_a_400_not_free_text(api, model):
    schema = {"type": "object", "additionalProperties": False, "required": ["ok"],
              "properties": {"ok": {"type": "boolean"}}}
    with pytest.raises(openai.BadRequestError) as info:
        ask(api, model, {"chat_template_kwargs": {"pcd_schema": schema}})
    assert "pcd_schema" in str(info.value)
