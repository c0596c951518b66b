"""Conditioned fields (`pcd_joint`, `x-pcd-after`): later rounds read the values chosen
before them, match an FP32 forward over the object written so far, and compute no token
twice."""

import pytest

from tests.conftest import MESSAGE, SIX_FIELD_SCHEMA
from tests.helpers import reference_candidate_sums
from vllm_pcd import constrained
from vllm_pcd.core.plan import Answered, Options, build_plan, conditions
from vllm_pcd.core.schema import SchemaError, parse_schema
from vllm_pcd.core.scoring import log_softmax

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

AFTER = {"type": "object", "additionalProperties": False,
         "required": ["refund", "topic", "urgent"],
         "properties": {"refund": {"type": "boolean"},
                        "topic": {"type": "string", "enum": ["billing", "technical"],
                                  "x-pcd-after": ["refund"]},
                        "urgent": {"type": "boolean", "x-pcd-after": ["topic"]}}}
TOLERANCE = 1e-4


def test_conditions_follow_the_schema_and_joint_reads_every_earlier_field():
    spec = parse_schema(AFTER)
    assert conditions(spec, joint=False) == ((), (0,), (0, 1))  # urgent reads topic's too
    six = parse_schema(SIX_FIELD_SCHEMA)
    assert conditions(six, joint=True) == tuple(tuple(range(i)) for i in range(6))
    assert conditions(six, joint=False) == ((),) * 6


@pytest.mark.parametrize("after, message", [
    (["nope"], "not another property"),
    (["topic"], "a cycle"),
    ("refund", "list of distinct property names"),
    (["urgent", "urgent"], "list of distinct property names"),
])
def test_a_bad_dependency_is_refused(after, message):
    schema = {**AFTER, "properties": {**AFTER["properties"],
                                      "refund": {"type": "boolean", "x-pcd-after": after}}}
    with pytest.raises(SchemaError, match=message):
        parse_schema(schema)


def test_conditioned_fields_need_json_stems_and_no_content_free_prior(tokenizer):
    spec = parse_schema(AFTER)
    messages = [{"role": "user", "content": MESSAGE}]
    with pytest.raises(SchemaError, match="json formulation"):
        build_plan(tokenizer, spec, messages, Options(formulation="codes"))
    with pytest.raises(SchemaError, match="content-free"):
        build_plan(tokenizer, spec, messages, Options(calibration="content_free"))


def test_a_later_round_continues_the_object_with_the_chosen_values(tokenizer):
    spec = parse_schema(AFTER)
    messages = [{"role": "user", "content": MESSAGE}]
    first = build_plan(tokenizer, spec, messages)
    assert [fp.field.name for fp in first.fields] == ["refund"] and first.leaves
    answered = Answered({"refund": True}, first.prompts())
    second = build_plan(tokenizer, spec, messages, answered=answered)
    assert [fp.field.name for fp in second.fields] == ["topic"] and second.leaves
    text = tokenizer.decode(list(second.prompts()[1]))
    assert text.endswith('{"refund": true, "topic": "')
    # one request, no context request of its own: it forks the longest earlier prompt it
    # extends (the refund branch's) and computes the rest in its own step
    assert not second.context and len(second.scorings) == 1
    assert max(second.reads[1]) == len(first.prompts()[1])
    assert second.ideal_tokens == len(second.prompts()[1]) - len(first.prompts()[1])


def test_joint_answers_match_the_fp32_reference_and_compute_each_token_once(
        fp32_llm, reference_model):  # noqa: F811
    result = constrained(fp32_llm, MESSAGE, SIX_FIELD_SCHEMA, joint=True,
                         cache_salt="joint-fidelity")
    assert len(result.rounds) == 6 and [len(r.fields) for r in result.rounds] == [1] * 6
    diagnostics = result.diagnostics()
    assert diagnostics["rounds"] == [[name] for name in SIX_FIELD_SCHEMA["properties"]]
    names = list(SIX_FIELD_SCHEMA["properties"])
    assert diagnostics["fields"][names[2]]["conditioned_on"] == {
        n: result.object[n] for n in names[:2]}
    for number, round_ in enumerate(result.rounds):
        (fp,), (fr,) = round_.plan.fields, round_.fields
        written = tokenizer_text(fp32_llm, round_.plan.prompts()[0])
        assert all(f'"{n}": ' in written for n in names[:number])  # the object so far
        expected = log_softmax(reference_candidate_sums(reference_model,
                                                        round_.plan.shared_ids, fp))
        assert max(abs(a - b) for a, b in zip(fr.scores, expected)) < TOLERANCE, fp.field.name
    tokens = diagnostics["tokens"]
    assert tokens["ideal"] == sum(r.plan.ideal_tokens for r in result.rounds)
    assert tokens["computed"] == tokens["ideal"]
    # the context, then one step per field: each later round forks the one before it
    assert diagnostics["backbone_calls"] == 1 + len(result.rounds)
    assert all(not r.plan.context for r in result.rounds[1:])


def tokenizer_text(llm, ids):
    return llm.get_tokenizer().decode(list(ids))


def test_without_conditions_a_call_is_one_round_as_before(fp32_llm):
    result = constrained(fp32_llm, MESSAGE, SIX_FIELD_SCHEMA, cache_salt="one-round")
    assert len(result.rounds) == 1 and "rounds" not in result.diagnostics()
    assert result.plan.reads == () and not result.plan.leaves
    tokens = result.diagnostics()["tokens"]
    assert tokens["ideal"] == len(result.plan.shared_ids) + result.plan.branch_tokens
