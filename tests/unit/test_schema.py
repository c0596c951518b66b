"""Every rule and limit of the pcd_schema contract."""

import copy

import pytest

from vllm_pcd.core.schema import Limits, SchemaError, parse_schema, shown

BASE = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "enum": ["billing", "technical"], "description": "Main issue"},
        "refund": {"type": "boolean"},
    },
    "required": ["topic", "refund"],
    "additionalProperties": False,
}


def schema(**changes):
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return raw


def with_field(name, field):
    raw = copy.deepcopy(BASE)
    raw["properties"][name] = field
    raw["required"].append(name)
    return raw


def test_valid_schema_parses_in_order():
    spec = parse_schema(BASE)
    assert [f.name for f in spec.fields] == ["topic", "refund"]
    assert spec.fields[0].kind == "enum" and spec.fields[0].options == ("billing", "technical")
    assert spec.fields[0].description == "Main issue"
    assert spec.fields[1].kind == "boolean" and spec.fields[1].options == (True, False)
    assert spec.total_candidates == 4


def test_enum_without_type_is_accepted():
    assert parse_schema(with_field("x", {"enum": ["a"]})).fields[2].options == ("a",)


@pytest.mark.parametrize("raw, rule", [
    ([], "schema_type"),
    ("object", "schema_type"),
    (None, "schema_type"),
    (schema(type="array"), "schema_type"),
    (schema(additionalProperties=True), "closed_object"),
    ({k: v for k, v in BASE.items() if k != "additionalProperties"}, "closed_object"),
    (schema(properties={}), "properties"),
    (schema(properties=[]), "properties"),
    (schema(required=["topic"]), "required"),
    (schema(required=["topic", "refund", "other"]), "required"),
    (schema(required=["topic", "refund", "refund"]), "required"),
    (schema(required="topic"), "required"),
    (schema(**{"$ref": "#/defs/x"}), "unsupported_keyword"),
    (schema(allOf=[]), "unsupported_keyword"),
    (schema(patternProperties={}), "unsupported_keyword"),
    (with_field("n", {"type": "number"}), "field_type"),
    (with_field("n", {"type": "integer", "enum": [1, "a"]}), "enum"),
    (with_field("n", {"enum": [1, [2]]}), "enum"),
    (with_field("n", {"type": "number", "minimum": 1, "maximum": 2}), "field_type"),
    (with_field("n", {"enum": [1, 2], "minimum": 1}), "unsupported_keyword"),
    (with_field("n", {"type": "integer", "minimum": 1}), "field_type"),
    (with_field("n", {"type": "integer", "minimum": 3, "maximum": 1}), "range"),
    (with_field("n", {"type": "integer", "minimum": 0, "maximum": 10**9}), "max_candidates"),
    (with_field("s", {"type": "string"}), "field_type"),
    (with_field("a", {"type": "array", "items": {"type": "boolean"}}), "field_type"),
    (with_field("a", {"type": "array", "uniqueItems": True, "items": {"enum": [1, 2]}}), "enum"),
    (with_field("a", {"type": "array", "uniqueItems": True, "items": {"enum": ["x"]},
                      "minItems": 1}), "unsupported_keyword"),
    (with_field("o", {"type": "object", "properties": {}}), "closed_object"),
    (with_field("o", {"type": "object", "properties": {}, "additionalProperties": False,
                      "required": []}), "properties"),
    (with_field("o", {"type": "object", "properties": {"x": {"type": "boolean"}},
                      "additionalProperties": False, "required": []}), "required"),
    (with_field("r", {"$ref": "#/x"}), "ref"),
    (with_field("r", {"anyOf": [{"type": "string"}, {"type": "null"}]}), "field_type"),
    (with_field("r", {"oneOf": [{"enum": ["a"]}, {"enum": ["a", "b"]}]}), "enum"),
    (with_field("b", {"type": "boolean", "enum": ["yes"]}), "enum"),
    (with_field("b", {"type": ["boolean", "object"]}), "field_type"),
    (with_field("e", {"type": "string", "enum": []}), "enum"),
    (with_field("e", {"type": "string", "enum": "abc"}), "enum"),
    (with_field("e", {"type": "string", "enum": ["a", "a"]}), "enum"),
    (with_field("e", {"type": "string", "enum": ["a", ""]}), "enum"),
    (with_field("e", {"type": "string", "enum": ["a", "  "]}), "enum"),
    (with_field("e", {"type": "string", "enum": ["a", None]}), "enum"),
    (with_field("e", {"type": "string", "enum": ["a", "b\nc"]}), "enum"),
    (with_field("e", {"type": "string", "enum": ["a", "x" * 300]}), "enum"),
    (with_field("e", {"type": "string", "enum": ["a"], "description": 3}), "description"),
    (with_field("e", {"type": "string", "enum": ["a"], "description": "d" * 2000}), "description"),
    (with_field("e", {"type": "string", "enum": ["a"], "x-pcd-mode": "fast"}), "mode"),
    (with_field("e", {"type": "string", "enum": ["a"], "x-pcd-mode": None}), "mode"),
    (with_field("e", {"type": "string", "enum": ["a"], "minLength": 1}), "unsupported_keyword"),
    (with_field("e", "boolean"), "field_type"),
    (with_field("", {"type": "boolean"}), "field_name"),
    (with_field("x" * 65, {"type": "boolean"}), "field_name"),
    # Accepted before as if the keyword were absent; each is invalid JSON Schema.
    (with_field("e", {"type": None, "enum": ["a", "b"]}), "json_schema"),
    (with_field("e", {"type": "boolean", "title": 5}), "json_schema"),
    (with_field("e", {"type": "boolean", "examples": "yes"}), "json_schema"),
    (with_field("e", {"type": "boolean", "$comment": ["x"]}), "json_schema"),
    (schema(**{"$schema": 7}), "json_schema"),
    (schema(title={"x": 1}), "json_schema"),
    (schema(description=3), "json_schema"),
])
def test_invalid_schemas_are_rejected_with_their_rule(raw, rule):
    with pytest.raises(SchemaError) as info:
        parse_schema(raw)
    assert info.value.rule == rule
    assert str(info.value).startswith("pcd_schema")


def test_field_limit():
    props = {f"f{i}": {"type": "boolean"} for i in range(33)}
    raw = schema(properties=props, required=list(props))
    with pytest.raises(SchemaError) as info:
        parse_schema(raw)
    assert info.value.rule == "max_fields" and "33" in str(info.value)
    assert len(parse_schema(raw, Limits(max_fields=33)).fields) == 33


def test_candidate_limit():
    props = {f"f{i}": {"enum": [f"v{j}" for j in range(10)]} for i in range(26)}
    raw = schema(properties=props, required=list(props))
    with pytest.raises(SchemaError) as info:
        parse_schema(raw)
    assert info.value.rule == "max_candidates" and "260" in str(info.value)
    assert parse_schema(raw, Limits(max_candidates=260)).total_candidates == 260


def test_error_messages_do_not_echo_unbounded_input():
    raw = with_field("e", {"type": "string", "enum": ["a", "a"], "x-evil" * 1000: 1})
    with pytest.raises(SchemaError) as info:
        parse_schema(raw)
    assert len(str(info.value)) < 300


def test_shown_bounds_and_escapes():
    assert shown("a\nb") == "a\\nb"
    assert len(shown("x" * 1000)) <= 41


def test_limits_from_mapping():
    assert Limits.from_mapping({"max_fields": 8}).max_fields == 8
    assert Limits.from_mapping(None) == Limits()
    with pytest.raises(ValueError, match="unknown"):
        Limits.from_mapping({"max_feilds": 8})
    with pytest.raises(ValueError, match="positive"):
        Limits.from_mapping({"max_fields": 0})
    with pytest.raises(ValueError, match="positive"):
        Limits.from_mapping({"max_fields": True})
