"""Planning the schemas users write: nested stems, values that are prefixes of each other,
constants, label sets, and the bare/choice posing of vLLM's own structured-output idioms."""

import pytest

from tests.conftest import MESSAGE
from vllm_pcd.core.scoring import RequestReport, field_results
from vllm_pcd.core.plan import ConstantFieldPlan, Options, SequenceFieldPlan, build_plan
from vllm_pcd.core.schema import SchemaError, parse_schema
from tests.helpers import closed

MESSAGES = [{"role": "user", "content": MESSAGE}]


def tails(tokenizer, plan, fp):
    """Each candidate's text after the assistant's turn starts."""
    return [tokenizer.decode([*plan.shared_ids, *seq]).split("<|im_start|>assistant\n")[-1]
            for seq in fp.candidates]


def test_a_nested_field_continues_its_own_nesting(tokenizer):
    spec = parse_schema(closed({"customer": closed({"tier": {"enum": ["free", "pro"]},
                                                    "vip": {"type": "boolean"}}),
                                "urgent": {"type": "boolean"}}))
    plan = build_plan(tokenizer, spec, MESSAGES, Options(formulation="json_next"))
    texts = [tails(tokenizer, plan, fp) for fp in plan.fields]
    assert texts[0] == ['{"customer": {"tier": "free",', '{"customer": {"tier": "pro",']
    assert texts[1] == ['{"customer": {"vip": true,', '{"customer": {"vip": false,']
    assert texts[2] == ['{"urgent": true,', '{"urgent": false,']
    shown = tokenizer.decode(list(plan.shared_ids))
    assert '- customer.tier: "free", "pro"' in shown


def test_the_indented_formulation_writes_the_object_as_instruction_models_do(tokenizer):
    indented = Options(formulation="json_indented")
    spec = parse_schema(closed({"customer": closed({"tier": {"enum": ["free", "pro"]}}),
                                "rating": {"type": "integer", "minimum": 1, "maximum": 10}}))
    plan = build_plan(tokenizer, spec, MESSAGES, indented)
    tier, rating = (tails(tokenizer, plan, fp) for fp in plan.fields)
    assert tier == ['{\n  "customer": {\n    "tier": "free', '{\n  "customer": {\n    "tier": "pro']
    assert rating[:2] == ['{\n  "rating": 1,', '{\n  "rating": 2,']  # another key follows
    rating_only = closed({"rating": {"type": "integer", "minimum": 1, "maximum": 10}})
    alone = build_plan(tokenizer, parse_schema(rating_only), MESSAGES,
                       indented)
    # values that start others end where an indented object's last value ends: its line
    assert tails(tokenizer, alone, alone.fields[0])[:2] == ['{\n  "rating": 1\n',
                                                            '{\n  "rating": 2\n']


def test_values_that_start_others_are_scored_up_to_what_follows_them(tokenizer):
    spec = parse_schema(closed({"rating": {"type": "integer", "minimum": 1, "maximum": 10}}))
    plan = build_plan(tokenizer, spec, MESSAGES)  # the default scores unique prefixes
    (fp,) = plan.fields
    assert isinstance(fp, SequenceFieldPlan) and fp.terminator == "}"
    assert [t.split('"rating":')[-1] for t in tails(tokenizer, plan, fp)] == \
        [f" {n}}}" for n in range(1, 11)]


def test_a_constant_asks_the_engine_nothing(tokenizer):
    spec = parse_schema(closed({"kind": {"const": "ticket"}, "urgent": {"type": "boolean"}}))
    plan = build_plan(tokenizer, spec, MESSAGES)
    assert isinstance(plan.fields[0], ConstantFieldPlan)
    assert {s.field_index for s in plan.scorings} == {1}
    reports = [RequestReport(0, 0, None, {t: -1.0 for t in s.token_ids}) for s in plan.scorings]
    kind, urgent = field_results(plan, reports, "sum")
    assert kind.value == "ticket" and kind.scores == (0.0,)


def test_a_label_set_asks_one_yes_no_per_label(tokenizer):
    spec = parse_schema(closed({"topics": {"type": "array", "uniqueItems": True,
                                           "items": {"enum": ["sport", "tech"]}}}))
    plan = build_plan(tokenizer, spec, MESSAGES, Options(formulation="json_next"))
    assert [tails(tokenizer, plan, fp) for fp in plan.fields] == [
        ['{"topics": {"sport": true,', '{"topics": {"sport": false,'],
        ['{"topics": {"tech": true,', '{"topics": {"tech": false,']]


def test_guided_choice_is_posed_as_the_reply_itself_on_the_clients_prompt(tokenizer):
    spec = parse_schema(closed({"choice": {"enum": ["positive", "negative", "neutral"]}}))
    plan = build_plan(tokenizer, spec, MESSAGES, Options(formulation="choice", layout="bare"))
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    (fp,) = plan.fields
    whole = [tokenizer.decode([*plan.shared_ids, *seq]) for seq in fp.candidates]
    assert all(w.startswith(rendered) for w in whole)  # nothing added to the conversation
    for w, choice in zip(whole, ["positive", "negative", "neutral"]):
        assert w[len(rendered):] and choice.startswith(w[len(rendered):])  # its unique prefix


@pytest.mark.parametrize("properties", [
    {"a": {"enum": ["x", "xy"]}},
    {"a": {"enum": ["x"]}, "b": {"enum": ["y"]}},
    {"a": {"enum": [1, 2]}},
])
def test_the_choice_posing_answers_one_field_of_distinct_strings(tokenizer, properties):
    with pytest.raises(SchemaError) as info:
        build_plan(tokenizer, parse_schema(closed(properties)), MESSAGES,
                   Options(formulation="choice", layout="bare"))
    assert info.value.rule == "formulation"


def test_conditioning_is_refused_for_nested_fields(tokenizer):
    spec = parse_schema(closed({"a": closed({"b": {"type": "boolean"}}),
                                "c": {"type": "boolean"}}))
    with pytest.raises(SchemaError) as info:
        build_plan(tokenizer, spec, MESSAGES, Options(joint=True))
    assert info.value.rule == "conditioned"
