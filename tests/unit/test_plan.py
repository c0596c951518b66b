"""Planner: shared context, branch suffixes and in-context single-token codes."""

import math

import pytest

from tests.conftest import MESSAGE, SIX_FIELD_SCHEMA, SUPPORT_SCHEMA
from vllm_pcd.core.plan import (DEFAULT_LAYOUT, RECAP, Formulation, Layout, Options,
                                SequenceFieldPlan, build_plan, choose_codes, instruction_text)
from vllm_pcd.core.schema import FieldSpec, Limits, SchemaError, parse_schema

JSON, SCHEMA_FIRST = Formulation.named("json"), Layout.named("schema_first")


def test_plan_codes_are_single_distinct_tokens_in_context(tokenizer):
    plan = build_plan(tokenizer, parse_schema(SIX_FIELD_SCHEMA),
                      [{"role": "user", "content": MESSAGE}], Options(formulation="codes"))
    for fp in plan.fields:
        assert len(set(fp.code_ids)) == len(fp.field.options)
        for code, code_id in zip(fp.codes, fp.code_ids):
            text = tokenizer.decode(list(fp.suffix_ids)) + code
            assert tokenizer.encode(text, add_special_tokens=False) == [*fp.suffix_ids, code_id]


def test_shared_context_is_the_rendered_chat_with_the_field_list(tokenizer):
    spec = parse_schema(SUPPORT_SCHEMA)
    plan = build_plan(tokenizer, spec, [{"role": "user", "content": MESSAGE}],
                      Options(formulation="codes"))
    text = tokenizer.decode(list(plan.shared_ids))
    assert MESSAGE in text and "topic (The main issue in the message): A = billing" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert plan.branch_ids(1)[: len(plan.shared_ids)] == list(plan.shared_ids)
    assert tokenizer.decode(list(plan.fields[1].suffix_ids)) == "refund_requested:"


def test_booleans_use_natural_words(tokenizer):
    field = FieldSpec("urgent", "boolean", (True, False))
    codes, ids = choose_codes(tokenizer, field)
    assert codes == (" true", " false") and len(set(ids)) == 2


class SplittingTokenizer:
    """Merges a space with the following lowercase letter into one token, but leaves a space
    before a capital as its own token: capital-letter codes split, forcing the fallback."""

    def encode(self, text, add_special_tokens=False):
        out = []
        for i, ch in enumerate(text):
            if ch.islower() and i and text[i - 1] == " ":
                out[-1] = 2000 + ord(ch)
            else:
                out.append(ord(ch))
        return out


def test_code_alphabet_falls_back_when_letters_split():
    field = FieldSpec("x", "enum", ("a", "b", "c"))
    codes, ids = choose_codes(SplittingTokenizer(), field)
    assert codes == (" a", " b", " c") and ids == (2097, 2098, 2099)


def test_too_many_options_for_every_alphabet_is_a_clear_error():
    field = FieldSpec("x", "enum", tuple(f"v{i}" for i in range(120)))
    with pytest.raises(SchemaError, match="sequence"):
        choose_codes(SplittingTokenizer(), field)


def test_prompt_token_limit(tokenizer):
    with pytest.raises(SchemaError) as info:
        build_plan(tokenizer, parse_schema(SUPPORT_SCHEMA),
                   [{"role": "user", "content": "word " * 5000}])
    assert info.value.rule == "max_prompt_tokens"
    build_plan(tokenizer, parse_schema(SUPPORT_SCHEMA),
               [{"role": "user", "content": "word " * 5000}], limits=Limits(max_prompt_tokens=8000))


def test_engine_requests_of_one_call_are_bounded(tokenizer):
    """32 enum fields of 8 multi-token values in sequence mode: one engine request per trie
    node, far more than 32 branches; refused with the count before any engine work."""
    wide = {"type": "object", "additionalProperties": False,
            "properties": {f"f{i}": {"enum": [f"option {i}-{j}" for j in range(8)]}
                           for i in range(32)}}
    wide["required"] = list(wide["properties"])
    plan = build_plan(tokenizer, parse_schema(wide), [{"role": "user", "content": MESSAGE}],
                      Options(mode="sequence"))
    needed = 1 + len(plan.scorings)
    assert needed > 32 * 8
    with pytest.raises(SchemaError) as info:
        build_plan(tokenizer, parse_schema(wide), [{"role": "user", "content": MESSAGE}],
                   Options(mode="sequence"), Limits(max_engine_requests=needed - 1))
    assert info.value.rule == "max_engine_requests" and str(needed) in str(info.value)
    # Conditioned, the same fields take 32 rounds of fewer requests each: the call's total is
    # what is bounded, before its first round runs.
    for joint in (True, False):
        with pytest.raises(SchemaError) as info:
            build_plan(tokenizer, parse_schema(wide), [{"role": "user", "content": MESSAGE}],
                       Options(mode="sequence", joint=joint),
                       Limits(max_engine_requests=needed - 1))
        assert info.value.rule == "max_engine_requests"
    first = build_plan(tokenizer, parse_schema(wide), [{"role": "user", "content": MESSAGE}],
                       Options(mode="sequence", joint=True))
    assert len(first.scorings) < needed / 16  # one field's trie: a round alone passes


@pytest.mark.parametrize("kwargs,rule", [
    ({"tokenize": True}, "reserved_template_kwarg"),
    ({"chat_template": "{{ x }}"}, "reserved_template_kwarg"),
    ({"add_generation_prompt": False}, "reserved_template_kwarg"),
    ({"conversation": []}, "reserved_template_kwarg"),
    ({"enable_thinking": True}, "reserved_template_kwarg"),
])
def test_template_kwargs_that_collide_with_pcds_are_refused(tokenizer, kwargs, rule):
    with pytest.raises(SchemaError) as info:
        build_plan(tokenizer, parse_schema(SUPPORT_SCHEMA),
                   [{"role": "user", "content": MESSAGE}], template_kwargs=kwargs)
    assert info.value.rule == rule


def test_a_template_that_fails_on_the_request_is_the_requests_fault(tokenizer):
    with pytest.raises(SchemaError) as info:
        build_plan(tokenizer, parse_schema(SUPPORT_SCHEMA),
                   [{"role": "user", "content": MESSAGE}],
                   chat_template="{{ raise_exception('no such role') }}")
    assert info.value.rule == "chat_template" and "no such role" in str(info.value)


def test_instruction_joins_the_last_user_turn_or_adds_one():
    document_first = Layout.named("document_first")
    assert document_first.with_instruction([{"role": "user", "content": "hi"}],
                                           "Q")[-1]["content"] == "hi\n\nQ"
    msgs = document_first.with_instruction([{"role": "user", "content": "hi"},
                                            {"role": "assistant", "content": "yo"}], "Q")
    assert msgs[-1] == {"role": "user", "content": "Q"} and len(msgs) == 3


def test_instruction_lists_every_option_with_its_code():
    field = FieldSpec("color", "enum", ("red", "green"), "Main colour")
    codes, layout = Formulation.named("codes"), Layout.named(DEFAULT_LAYOUT)
    assert instruction_text([(field, (" A", " B"))], codes, layout).endswith(
        "- color (Main colour): A = red, B = green")
    flag = FieldSpec("ok", "boolean", (True, False))
    assert instruction_text([(flag, (" true", " false"))], codes, layout).endswith(
        "- ok: true, false")
    assert instruction_text([(flag, (" yes", " no"))], codes, layout).endswith(
        "- ok: yes = true, no = false")


def test_json_formulation_continues_the_assistants_own_object(tokenizer):
    plan = build_plan(tokenizer, parse_schema(SIX_FIELD_SCHEMA),
                      [{"role": "user", "content": MESSAGE}], Options(formulation="json"))
    text = tokenizer.decode(list(plan.shared_ids))
    assert '- topic: "billing", "technical", "shipping", "account"' in text
    assert "- urgent (Whether the customer needs help today): true, false" in text
    assert all(isinstance(fp, SequenceFieldPlan) and fp.mode == "token" for fp in plan.fields)
    for fp in plan.fields:
        stem = tokenizer.decode([*plan.shared_ids, *fp.candidates[0][:fp.score_from[0]]])
        assert stem.split("<|im_start|>assistant\n")[-1].startswith(Formulation.named("json").stem(fp.field))
        assert fp.terminated == (fp.field.kind == "boolean")
        if fp.terminated:  # booleans: the whole value and the terminator
            assert [tokenizer.decode(list(seq[start:]))
                    for seq, start in zip(fp.candidates, fp.score_from)] == [" true\n", " false\n"]
            continue
        # enum values are cut right after the token that makes each unique
        for seq in fp.candidates:
            others = [o for o in fp.candidates if o != seq]
            assert all(o[:len(seq)] != seq for o in others)
            assert any(o[:len(seq) - 1] == seq[:-1] for o in others) or len(seq) == fp.score_from[0] + 1


def test_json_formulation_requests(tokenizer):
    """An enum whose values differ at the first token needs one request; a boolean three
    (its first token, then the terminator after each value). By default (unique prefixes)
    the boolean needs one too."""
    spec = parse_schema(SUPPORT_SCHEMA)
    plan = build_plan(tokenizer, spec, [{"role": "user", "content": MESSAGE}],
                      Options(formulation="json"))
    assert [fp.field.kind for fp in plan.fields] == ["enum", "boolean"]
    assert [len(fp.nodes) for fp in plan.fields] == [1, 3]
    assert len(plan.scorings) == 4
    default = build_plan(tokenizer, spec, [{"role": "user", "content": MESSAGE}])
    assert [len(fp.nodes) for fp in default.fields] == [1, 1]
    assert not any(fp.terminated for fp in default.fields)


def test_branch_stems():
    field = FieldSpec("naïve \"x\"", "boolean", (True, False))
    assert Formulation.named("json").stem(field) == '{"naïve \\"x\\"":'
    assert Formulation.named("codes").stem(field) == 'naïve "x":'


def test_thirty_two_token_fields_fit_one_microbatch(tokenizer):
    from vllm_pcd.engine import microbatches

    props = {f"field_{i}": ({"type": "boolean"} if i % 2 else
                            {"enum": ["credit_card", "credit_transfer", "cash"]})
             for i in range(32)}
    spec = parse_schema({"type": "object", "properties": props, "required": list(props),
                         "additionalProperties": False})
    for formulation in ("json", "codes"):
        plan = build_plan(tokenizer, spec, [{"role": "user", "content": MESSAGE}],
                          Options(formulation=formulation))
        assert len(microbatches(plan.scorings, 32)) == 1
    seq = build_plan(tokenizer, spec, [{"role": "user", "content": MESSAGE}],
                     Options(mode="sequence"))
    assert len(microbatches(seq.scorings, 32)) == math.ceil(spec.total_candidates / 32)


def test_schema_first_layout_puts_the_field_list_before_every_document(tokenizer):
    spec = parse_schema(SIX_FIELD_SCHEMA)
    plans = [build_plan(tokenizer, spec, [{"role": "user", "content": doc}],
                        Options(layout="schema_first"))
             for doc in (MESSAGE, "A short note about something else entirely.")]
    text = tokenizer.decode(list(plans[0].shared_ids))
    assert text.index("the conversation that follows") < text.index("- urgent") \
        < text.index(MESSAGE)
    common = next(i for i, (a, b) in enumerate(zip(*(p.shared_ids for p in plans))) if a != b)
    instruction = tokenizer.encode(instruction_text([(f, None) for f in spec.fields], JSON,
                                                    SCHEMA_FIRST), add_special_tokens=False)
    assert common > len(instruction)  # every document starts from the schema's tokens
    with_system = build_plan(tokenizer, spec, [{"role": "system", "content": "Be terse."},
                                               {"role": "user", "content": MESSAGE}],
                             Options(layout="schema_first"))
    assert "- urgent" in tokenizer.decode(list(with_system.shared_ids)).split("Be terse.")[0]
    with pytest.raises(SchemaError, match="pcd_layout"):
        build_plan(tokenizer, spec, [{"role": "user", "content": MESSAGE}], Options(layout=["x"]))


def test_the_restated_layout_shares_the_list_and_names_the_fields_after_the_document(
        tokenizer):
    spec = parse_schema(SIX_FIELD_SCHEMA)
    plans = [build_plan(tokenizer, spec, [{"role": "user", "content": doc}],
                        Options(layout="schema_first_restated"))
             for doc in (MESSAGE, "A short note about something else entirely.")]
    text = tokenizer.decode(list(plans[0].shared_ids))
    names = ", ".join(f.name for f in spec.fields)
    assert text.index("- urgent") < text.index(MESSAGE) < text.index(f"({names}) about it")
    plain = build_plan(tokenizer, spec, [{"role": "user", "content": MESSAGE}],
                       Options(layout="schema_first"))
    common = next(i for i, (a, b) in enumerate(zip(*(p.shared_ids for p in plans))) if a != b)
    assert plans[0].shared_ids[:common] == plain.shared_ids[:common]
    instruction = tokenizer.encode(instruction_text([(f, None) for f in spec.fields], JSON,
                                                    SCHEMA_FIRST), add_special_tokens=False)
    assert common > len(instruction)  # the field list stays the documents' shared prefix
    assert len(plans[0].shared_ids) > len(plain.shared_ids)


def test_the_recap_layout_adds_one_fixed_line_whatever_the_schema(tokenizer):
    """The recap names no field, so a schema of six fields and one of one add the same
    tokens after the document, and the field list stays the shared prefix."""
    six = parse_schema(SIX_FIELD_SCHEMA)
    one = parse_schema({"type": "object", "properties": {"urgent": {"type": "boolean"}},
                        "required": ["urgent"], "additionalProperties": False})
    messages = [{"role": "user", "content": MESSAGE}]
    added = []
    for spec in (six, one):
        recap = build_plan(tokenizer, spec, messages, Options(layout="schema_first_recap"))
        plain = build_plan(tokenizer, spec, messages, Options(layout="schema_first"))
        text = tokenizer.decode(list(recap.shared_ids))
        assert text.index("- urgent") < text.index(MESSAGE) < text.index(RECAP)
        common = next(i for i, (a, b) in enumerate(zip(recap.shared_ids, plain.shared_ids))
                      if a != b)
        instruction = instruction_text([(f, None) for f in spec.fields], JSON, SCHEMA_FIRST)
        assert common > len(tokenizer.encode(instruction, add_special_tokens=False))
        added.append(len(recap.shared_ids) - len(plain.shared_ids))
    assert added[0] == added[1] > 0


def test_the_auto_layout_names_a_lone_field_and_recaps_several(tokenizer):
    six = parse_schema(SIX_FIELD_SCHEMA)
    one = parse_schema({"type": "object", "properties": {"urgent": {"type": "boolean"}},
                        "required": ["urgent"], "additionalProperties": False})
    messages = [{"role": "user", "content": MESSAGE}]
    for spec, same_as in ((one, "schema_first_restated"), (six, "schema_first_recap")):
        auto = build_plan(tokenizer, spec, messages, Options(layout="schema_first_auto"))
        other = build_plan(tokenizer, spec, messages, Options(layout=same_as))
        assert auto.shared_ids == other.shared_ids
    text = tokenizer.decode(list(build_plan(tokenizer, one, messages,
                                            Options(layout="schema_first_auto")).shared_ids))
    assert "(urgent) about it" in text


def test_value_ends_per_formulation(tokenizer):
    """json_next: whole values, then what follows them in the object (`,` or, alone, `}`);
    json_prefix: each value up to its unique token, booleans included."""
    def endings(schema, formulation):
        plan = build_plan(tokenizer, parse_schema(schema), [{"role": "user", "content": MESSAGE}],
                          Options(formulation=formulation))
        return {fp.field.name: [tokenizer.decode(list(c[s:]))
                                for c, s in zip(fp.candidates, fp.score_from)]
                for fp in plan.fields}
    many = endings(SUPPORT_SCHEMA, "json_next")
    assert many["refund_requested"] == [" true,", " false,"]
    assert all(v.startswith(' "') and v.endswith('",') for v in many["topic"])
    alone = {**SUPPORT_SCHEMA, "properties": {"refund_requested": {"type": "boolean"}},
             "required": ["refund_requested"]}
    assert endings(alone, "json_next")["refund_requested"] == [" true}", " false}"]
    assert endings(SUPPORT_SCHEMA, "json_prefix")["refund_requested"] == [" true", " false"]


@pytest.mark.parametrize("layout", ["document_first", "schema_first"])
@pytest.mark.parametrize("formulation", ["json_prefix", "json", "json_next"])
def test_tokens_every_branch_opens_with_are_computed_once_in_the_shared_context(
        tokenizer, formulation, layout):
    plan = build_plan(tokenizer, parse_schema(SIX_FIELD_SCHEMA),
                      [{"role": "user", "content": MESSAGE}],
                      Options(formulation=formulation, layout=layout))
    text = tokenizer.decode(list(plan.shared_ids))
    assert text.endswith('<|im_start|>assistant\n{"'), text[-40:]
    # every scoring still adds tokens of its own, and no branch starts with the opening again
    assert all(s.suffix_ids for s in plan.scorings)
    assert not any(tokenizer.decode(list(s.suffix_ids)).startswith('{"') for s in plan.scorings)


def test_a_single_field_keeps_a_token_of_its_own_in_every_branch(tokenizer):
    schema = {"type": "object", "properties": {"urgent": {"type": "boolean"}},
              "required": ["urgent"], "additionalProperties": False}
    for formulation in ("json_prefix", "json", "codes"):
        plan = build_plan(tokenizer, parse_schema(schema), [{"role": "user", "content": MESSAGE}],
                          Options(formulation=formulation))
        assert all(s.suffix_ids for s in plan.scorings), formulation
