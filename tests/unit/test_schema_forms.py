"""The schemas users really write (Pydantic, the OpenAI SDK's strict schemas, hand-written
JSON Schema): each shape parses to the fields PCD answers, and every object PCD can assemble
from their options is valid under the schema as sent (checked by `jsonschema`, an
independent validator). Mutated schemas are either refused with a SchemaError or hold that
same property."""

import copy
import enum
import itertools
from typing import Literal, Optional

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel

from tests.helpers import closed
from vllm_pcd.core.schema import Limits, SchemaError, option_index, parse_schema, value_at
from vllm_pcd.core.scoring import FieldResult, assemble


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Stars(enum.IntEnum):
    ONE = 1
    TWO = 2


class Customer(BaseModel):
    tier: Literal["free", "pro"]
    churn_risk: bool


class Ticket(BaseModel):
    """A support ticket."""

    priority: Priority
    kind: Literal["ticket"]
    topic: Literal["billing", "technical", "other"]
    refund: bool
    stars: Stars
    escalate_to: Optional[Literal["legal", "sales"]]
    customer: Customer


def every_object(spec, limit=200):
    """Objects assembled from every combination of options (up to `limit`)."""
    for choice in itertools.islice(itertools.product(*(range(len(f.options))
                                                       for f in spec.fields)), limit):
        results = [FieldResult(f, tuple(0.0 if i == k else -1.0 for i in range(len(f.options))))
                   for f, k in zip(spec.fields, choice)]
        yield assemble(spec, results)


def assert_every_answer_valid(raw):
    spec = parse_schema(raw)
    for obj in every_object(spec):
        jsonschema.validate(obj, raw)
    return spec


def test_the_sdk_strict_schema_of_a_pydantic_model_parses():
    raw = to_strict_json_schema(Ticket)
    assert "$defs" in raw  # Pydantic puts the Enum classes and the nested model there
    spec = assert_every_answer_valid(raw)
    by_name = {f.name: f for f in spec.fields}
    assert by_name["priority"].options == ("low", "high")
    assert by_name["kind"].options == ("ticket",)
    assert by_name["stars"].options == (1, 2)
    assert by_name["escalate_to"].options == ("legal", "sales", None)
    assert by_name["customer.tier"].keys == ("customer", "tier")
    assert by_name["customer.churn_risk"].kind == "boolean"
    obj = next(every_object(spec))
    assert Ticket.model_validate(obj).customer.tier == "free"


def test_plain_pydantic_schema_parses_too():
    assert_every_answer_valid(Customer.model_json_schema() | {"additionalProperties": False})


@pytest.mark.parametrize("field, options", [
    ({"type": "integer", "minimum": 1, "maximum": 5}, (1, 2, 3, 4, 5)),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3}, (1, 2)),
    ({"type": "integer", "minimum": 0.5, "maximum": 2.5}, (1, 2)),
    ({"type": ["integer", "null"], "minimum": 1, "maximum": 2}, (1, 2, None)),
    ({"enum": ["a", None]}, ("a", None)),
    ({"type": ["string", "null"], "enum": ["a", None]}, ("a", None)),
    ({"anyOf": [{"enum": ["a", "b"]}, {"type": "null"}]}, ("a", "b", None)),
    ({"anyOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}]}, ("a", "b", "c")),
    ({"oneOf": [{"const": 1}, {"const": 2.5}]}, (1, 2.5)),
    ({"type": ["boolean", "null"]}, (True, False, None)),
    ({"enum": [1, True]}, (1, True)),  # JSON: 1 is not true
    ({"const": "x", "title": "X", "default": "x", "examples": ["x"]}, ("x",)),
    ({"allOf": [{"enum": ["a", "b"]}], "description": "old Pydantic"}, ("a", "b")),
])
def test_finite_scalar_forms(field, options):
    spec = assert_every_answer_valid(closed({"f": field}))
    assert spec.fields[0].options == options
    assert [type(o) for o in spec.fields[0].options] == [type(o) for o in options]


def test_a_label_set_is_one_decision_per_label():
    raw = closed({"topics": {"type": "array", "uniqueItems": True, "description": "all that apply",
                             "items": {"$ref": "#/$defs/Topic"}}, "urgent": {"type": "boolean"}})
    raw["$defs"] = {"Topic": {"enum": ["sport", "tech", "politics"]}}
    spec = assert_every_answer_valid(raw)
    assert [f.name for f in spec.fields] == ["topics.sport", "topics.tech", "topics.politics",
                                             "urgent"]
    assert all(f.member and f.kind == "boolean" for f in spec.fields[:3])
    yes = {"topics.sport": 0, "topics.tech": 1, "topics.politics": 0, "urgent": 1}
    results = [FieldResult(f, (0.0, -9.0) if yes[f.name] == 0 else (-9.0, 0.0))
               for f in spec.fields]
    obj = assemble(spec, results)
    assert obj == {"topics": ["sport", "politics"], "urgent": False}
    assert [value_at(obj, f) for f in spec.fields] == [True, False, True, False]


def test_nested_objects_keep_their_keys_in_order():
    raw = closed({"a": closed({"b": {"type": "boolean"}, "c": closed({"d": {"const": 3}})}),
                  "e": {"enum": ["x", "y"]}})
    spec = assert_every_answer_valid(raw)
    assert [f.keys for f in spec.fields] == [("a", "b"), ("a", "c", "d"), ("e",)]
    assert list(next(every_object(spec))) == ["a", "e"]
    assert option_index(spec.fields[1], 3) == 0 and option_index(spec.fields[1], True) is None


@pytest.mark.parametrize("raw, rule", [
    ({**closed({"a": {"$ref": "#/$defs/A"}}), "$defs": {"A": {"$ref": "#/$defs/A"}}}, "ref"),
    ({**closed({"a": {"$ref": "#/$defs/B"}}), "$defs": {"A": {"enum": ["x"]}}}, "ref"),
    ({**closed({"a": {"$ref": "#/$defs/A", "minimum": 1}}), "$defs": {"A": {"enum": [1]}}},
     "unsupported_keyword"),
    (closed({"a": closed({"b": {"type": "boolean"}}), "a.b": {"type": "boolean"}}), "field_name"),
    (closed({"a": closed({"b": {"type": "boolean", "x-pcd-after": ["c"]}}),
             "c": {"type": "boolean"}}), "after"),
    (closed({"a": {"type": "array", "uniqueItems": True,
                   "items": {"enum": [f"l{i}" for i in range(40)]}}}), "max_fields"),
    (closed({"a": {"allOf": [{"enum": ["x"]}, {"enum": ["y"]}]}}), "unsupported_keyword"),
])
def test_forms_that_are_refused_by_name(raw, rule):
    with pytest.raises(SchemaError) as info:
        parse_schema(raw)
    assert info.value.rule == rule


def test_deep_nesting_and_long_ref_chains_are_bounded():
    raw = {"type": "boolean"}
    for depth in range(12):
        raw = closed({f"k{depth}": raw})
    with pytest.raises(SchemaError) as info:
        parse_schema(raw)
    assert info.value.rule == "depth"
    chain = {f"D{i}": {"$ref": f"#/$defs/D{i + 1}"} for i in range(20)} | {"D20": {"const": 1}}
    with pytest.raises(SchemaError) as info:
        parse_schema({**closed({"a": {"$ref": "#/$defs/D0"}}), "$defs": chain})
    assert info.value.rule == "depth"


# Fuzz: each new keyword, mutated into the Pydantic schema.
_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True),
                    st.text(max_size=4), st.lists(st.integers(0, 2), max_size=2),
                    st.just({}), st.just({"type": "null"}), st.just({"$ref": "#/$defs/Priority"}))
_keywords = st.sampled_from(["$ref", "const", "enum", "minimum", "maximum", "exclusiveMinimum",
                             "exclusiveMaximum", "anyOf", "oneOf", "allOf", "type", "items",
                             "uniqueItems", "properties", "required", "additionalProperties",
                             "$defs", "title", "default", "nullable"])
_types = st.sampled_from(["integer", "number", "string", "boolean", "null", "array", "object",
                          ["integer", "null"], ["string", "null"], "x"])


@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_schemas_are_refused_or_every_answer_is_valid(data):
    raw = copy.deepcopy(to_strict_json_schema(Ticket))
    for _ in range(data.draw(st.integers(1, 3))):
        places = [raw, *(v for table in (raw.get("properties"), raw.get("$defs"))
                         if isinstance(table, dict) for v in table.values() if isinstance(v, dict))]
        place = data.draw(st.sampled_from(places))
        key = data.draw(_keywords)
        value = data.draw(_types if key == "type" else
                          st.lists(_values, max_size=3) if key in ("enum", "anyOf", "oneOf",
                                                                   "allOf") else _values)
        place[key] = value
    try:
        spec = parse_schema(raw, Limits(max_candidates=64))
    except SchemaError as err:
        assert str(err).startswith("pcd_schema") and len(str(err)) < 400
        return
    for obj in every_object(spec, limit=50):
        jsonschema.validate(obj, raw)
