"""Planning is refused cheaply and early, and costs what the text costs once, not once per
continuation (tokenizer only; the served bounds are in server/test_server_e2e)."""

import asyncio

import pytest

from tests.conftest import MESSAGE, SIX_FIELD_SCHEMA
from vllm_pcd.core.plan import (Cancelled, InContext, build_plan, common_prefix, render_text,
                                split_tail)
from vllm_pcd.pipeline import Overloaded, Planner
from vllm_pcd.core.schema import Limits, SchemaError, parse_schema

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too


class Counting:
    """The tokenizer, counting the characters it is asked to encode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.chars, self.calls = tokenizer, 0, 0

    def encode(self, text, add_special_tokens=True):
        self.chars += len(text)
        self.calls += 1
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def _document(words):
    return " ".join(f"word{i % 97}" for i in range(words))


def test_a_long_document_is_tokenized_a_bounded_number_of_times(tokenizer):
    spec = parse_schema(SIX_FIELD_SCHEMA)
    counting = Counting(tokenizer)
    document = _document(600)
    plan = build_plan(counting, spec, [{"role": "user", "content": document}])
    continuations = counting.calls
    assert continuations > 20  # every field's stem and values
    # The rendered text is read a few times (context, head, tail check), never once per
    # continuation: the document's characters are encoded at most 4 times over.
    assert counting.chars < 4 * (len(document) + 2000) + 200 * continuations
    assert len(plan.shared_ids) > 600


@pytest.mark.parametrize("words", [5, 300])
def test_the_tail_cut_gives_exactly_the_whole_texts_tokens(tokenizer, words):
    """Against the quadratic reference: every continuation tokenized with the whole text."""
    text = render_text(tokenizer, [{"role": "user", "content": _document(words)}])
    context = tokenizer.encode(text, add_special_tokens=False)
    head, tail = split_tail(tokenizer, text, context)
    assert head and len(tail) < 40, "the cut falls on the template's last added token"
    groups = [['{"a":', '{"a": true', '{"a": false'], ['{"topic":', '{"topic": "billing"']]
    encode = InContext(tokenizer, text, groups)
    for group in groups:
        for c in group:
            whole = tokenizer.encode(text + c, add_special_tokens=False)
            assert list(encode.shared_ids) + list(encode(c)) == whole, c
    assert common_prefix(encode.shared_ids, context) >= len(head)


def test_a_text_over_the_character_bound_is_refused_before_it_is_rendered(tokenizer):
    limits = Limits(max_prompt_tokens=512)
    counting = Counting(tokenizer)
    huge = "x" * (limits.prompt_chars + 1)
    with pytest.raises(SchemaError, match="max_prompt_chars") as err:
        build_plan(counting, parse_schema(SIX_FIELD_SCHEMA), [{"role": "user", "content": huge}],
                   limits=limits)
    assert err.value.rule == "max_prompt_chars" and counting.calls == 0
    parts = [{"role": "user", "content": [{"type": "text", "text": huge}]}]
    with pytest.raises(SchemaError, match="max_prompt_chars"):
        build_plan(counting, parse_schema(SIX_FIELD_SCHEMA), parts, limits=limits)


@pytest.mark.parametrize("content,rule", [
    ("is this \ud800 urgent?", "encoding"),
    ([{"type": "text", "text": "lone \udfff"}], "encoding"),
    ([], "depth"),
])
def test_text_no_tokenizer_can_read_is_refused_before_it_is_rendered(tokenizer, content, rule):
    """A lone surrogate (or content nested past any message shape) is the client's fault: a
    400 naming where it is, never a tokenizer's exception."""
    if rule == "depth":
        for _ in range(500):
            content = [content]
    counting = Counting(tokenizer)
    with pytest.raises(SchemaError) as err:
        build_plan(counting, parse_schema(SIX_FIELD_SCHEMA), [{"role": "user", "content": content}])
    assert err.value.rule == rule and counting.calls == 0
    str(err.value).encode("utf-8")


def test_too_many_messages_are_refused_before_they_are_rendered(tokenizer):
    counting = Counting(tokenizer)
    many = [{"role": "user", "content": "hi"}] * (Limits().max_messages + 1)
    with pytest.raises(SchemaError, match="max_messages"):
        build_plan(counting, parse_schema(SIX_FIELD_SCHEMA), many)
    assert counting.calls == 0


def test_a_context_over_the_token_limit_is_refused_before_any_continuation(tokenizer):
    limits = Limits(max_prompt_tokens=256)
    counting = Counting(tokenizer)
    with pytest.raises(SchemaError, match="before any answer"):
        build_plan(counting, parse_schema(SIX_FIELD_SCHEMA),
                   [{"role": "user", "content": _document(400)}], limits=limits)
    assert counting.calls == 1  # the context alone


def test_planning_stops_when_its_caller_gives_up(tokenizer):
    with pytest.raises(Cancelled):
        build_plan(tokenizer, parse_schema(SIX_FIELD_SCHEMA), [{"role": "user",
                                                                "content": MESSAGE}],
                   cancelled=lambda: True)


def test_the_planner_queue_is_bounded_and_a_cancelled_call_leaves_it():
    import threading

    gate = threading.Event()

    def slow(*, cancelled):
        gate.wait(5)
        return "planned"

    async def scenario():
        planner = Planner()
        first = asyncio.create_task(planner.plan(2, slow))
        second = asyncio.create_task(planner.plan(2, slow))
        await asyncio.sleep(0.05)
        with pytest.raises(Overloaded, match="max_queued_plans = 2"):
            await planner.plan(2, slow)
        second.cancel()  # queued behind the first: taken out of the queue
        await asyncio.sleep(0.05)
        assert planner.waiting == 1
        gate.set()
        assert await first == "planned"
        assert planner.waiting == 0

    asyncio.run(scenario())
