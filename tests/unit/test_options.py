"""The request options: one value, checked when it is built, carried whole."""

import dataclasses

import pytest

from tests.conftest import MESSAGE, SIX_FIELD_SCHEMA
from vllm_pcd.core.plan import KEYS, Options, build_plan
from vllm_pcd.core.schema import SchemaError, parse_schema


@pytest.mark.parametrize("name", sorted(KEYS))
@pytest.mark.parametrize("bad", ["nonsense", None, ["token"], 1, {"a": 1}])
def test_every_option_is_checked_by_the_constructor(name, bad):
    with pytest.raises(SchemaError) as err:
        Options(**{name: bad})
    assert err.value.param == KEYS[name] and KEYS[name] in str(err.value)


def test_options_are_frozen_and_replacing_one_checks_it_again():
    options = Options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.mode = "sequence"
    with pytest.raises(SchemaError, match="pcd_mode"):
        dataclasses.replace(options, mode="tokens")
    with pytest.raises(SchemaError, match="full_vocabulary"):
        Options(full_vocabulary="yes")


def test_template_kwargs_give_up_their_options_and_keep_the_rest():
    kwargs = {"pcd_schema": {}, "pcd_mode": "sequence", "pcd_layout": "document_first",
              "enable_thinking": False}
    options = Options.from_template_kwargs(kwargs)
    assert (options.mode, options.layout.name) == ("sequence", "document_first")
    assert options.formulation == Options().formulation  # unset options keep their defaults
    assert kwargs == {"pcd_schema": {}, "enable_thinking": False}


def test_the_offline_keywords_are_options_and_nothing_else():
    assert Options.of({"mode": "sequence"}) == Options(mode="sequence")
    with pytest.raises(TypeError, match="modes"):
        Options.of({"modes": "sequence"})


def test_full_vocabulary_is_a_planning_decision(tokenizer):
    """The plan marks which scorings may use the restricted head; asking for the whole
    vocabulary unmarks them all and changes nothing else."""
    spec = parse_schema(SIX_FIELD_SCHEMA)
    messages = [{"role": "user", "content": MESSAGE}]
    restricted = build_plan(tokenizer, spec, messages, Options(formulation="codes"))
    full = build_plan(tokenizer, spec, messages,
                      Options(formulation="codes", full_vocabulary=True))
    assert all(s.restricted for s in restricted.scorings)
    assert not any(s.restricted for s in full.scorings)
    assert [dataclasses.replace(s, restricted=False) for s in restricted.scorings] \
        == list(full.scorings)


def test_the_offline_api_takes_the_options_whole_or_as_keywords_not_both():
    from vllm_pcd import constrained

    with pytest.raises(TypeError, match="not both"):
        constrained(None, MESSAGE, SIX_FIELD_SCHEMA, Options(), mode="sequence")


def test_formulation_and_layout_are_resolved_once_and_written_back_by_name():
    options = Options(formulation="codes", layout="schema_first_recap")
    assert options.formulation.codes and not options.formulation.json_stem
    assert options.layout.schema_first and options.layout.after == "recap"
    assert Options(formulation=options.formulation, layout=options.layout) == options
    assert options.settings(("formulation", "layout", "mode")) == {
        "formulation": "codes", "layout": "schema_first_recap", "mode": "token"}
    with pytest.raises(SchemaError) as info:
        Options(layout="schema_last")
    assert info.value.param == "pcd_layout"
