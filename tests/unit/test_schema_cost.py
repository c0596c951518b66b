"""A schema is a program: every one is answered or refused in work linear in its size, and
never with anything but a SchemaError (a 4xx). Work is counted as Python calls made during
the parse (an operation count independent of the parser's own budget), never as wall time."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.hostile_schemas import (SCHEMA_FAMILIES, closed, guided_choices, ref_fanout,
                                        surrogate_description)
from vllm_pcd.core.schema import (MAX_JSON_DEPTH, Limits, SchemaError, measure, parse as
                                  schema_module, parse_schema)
from vllm_pcd.core.plan import raw_prefixes

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

# Calls a parse may make: a few per byte of the body, plus a constant for expanding up to
# max_candidates values and meta-checking up to 16 unused definitions. Measured at 0.05-1.9
# per byte over every family.
CALLS_PER_BYTE = 4
CALLS_FLOOR = 24_000


class TooMuchWork(Exception):
    pass


def calls_of(work, *args, bound: int) -> tuple[int, object]:
    """(calls made, result or the SchemaError raised); stops the work past `bound` calls."""
    made = [0]

    def tracer(frame, event, arg):
        made[0] += 1
        if made[0] > bound:
            raise TooMuchWork(f"more than {bound} calls")
        return None

    schema_module._parse_kept.cache_clear()
    sys.settrace(tracer)
    try:
        result = work(*args)
    except SchemaError as err:
        result = err
    finally:
        sys.settrace(None)
    return made[0], result


def bound_for(raw) -> int:
    return CALLS_PER_BYTE * len(json.dumps(raw)) + CALLS_FLOOR


@pytest.mark.parametrize("family", sorted(SCHEMA_FAMILIES))
def test_every_hostile_family_costs_work_linear_in_its_size(family):
    build, sizes = SCHEMA_FAMILIES[family]
    parse_schema(closed({"warm": {"type": "boolean"}}))  # imports happen before counting
    for size in sizes:
        raw = build(size)
        calls, result = calls_of(parse_schema, raw, bound=bound_for(raw))
        assert calls <= bound_for(raw)
        assert isinstance(result, (SchemaError, schema_module.SchemaSpec))


def test_ref_fanout_is_answered_once_per_definition():
    """7 definitions of 10 references each (10**6 paths) parse to their two values."""
    spec = parse_schema(ref_fanout(10))
    assert spec.fields[0].options == ("a", "b")


def test_integer_ranges_are_refused_at_the_first_range_past_the_limit():
    raw = SCHEMA_FAMILIES["range_union"][0](12)
    with pytest.raises(SchemaError) as err:
        parse_schema(raw)
    assert err.value.rule == "max_candidates" and "anyOf" in str(err.value)


@pytest.mark.parametrize("depth", [300, 400])
def test_deep_nesting_is_a_400_not_a_recursion_error(depth):
    for build in (SCHEMA_FAMILIES["nested_definition"][0], SCHEMA_FAMILIES["nested_union"][0]):
        with pytest.raises(SchemaError) as err:
            parse_schema(build(depth))
        assert err.value.rule == "depth" and str(MAX_JSON_DEPTH) in str(err.value)


def test_a_lone_surrogate_is_refused_by_name_and_the_message_is_text():
    with pytest.raises(SchemaError) as err:
        parse_schema(surrogate_description())
    assert err.value.rule == "encoding"
    str(err.value).encode("utf-8")  # answerable as a JSON error body
    with pytest.raises(SchemaError) as err:
        parse_schema(closed({"\udc00key": {"type": "boolean"}}))
    assert err.value.rule == "encoding" and "\\udc00" in str(err.value)


@pytest.mark.parametrize("values", [[{"const": 1}, {"const": 1.0}],
                                    [{"const": 0}, {"const": -0.0}]])
def test_one_of_values_equal_under_json_schema_are_refused(values):
    """JSON Schema compares numbers by value: `1` and `1.0` are one value, valid under both
    alternatives, so no answer could satisfy `oneOf`."""
    with pytest.raises(SchemaError, match="two oneOf alternatives"):
        parse_schema(closed({"n": {"oneOf": values}}))


def test_any_of_keeps_the_first_of_equal_numbers_and_true_is_not_one():
    assert parse_schema(closed({"n": {"anyOf": [{"const": 1}, {"const": 1.0}]}})
                        ).fields[0].options == (1,)
    assert parse_schema(closed({"n": {"enum": [True, 1]}})).fields[0].options == (True, 1)


def test_refusals_are_kept_so_a_replay_costs_its_lookup():
    raw = SCHEMA_FAMILIES["range_union"][0](16)
    first, _ = calls_of(parse_schema, raw, bound=10**6)
    made = [0]
    sys.settrace(lambda *a: made.__setitem__(0, made[0] + 1))
    try:
        with pytest.raises(SchemaError):
            parse_schema(json.loads(json.dumps(raw)))
    finally:
        sys.settrace(None)
    assert made[0] < first / 4


def test_guided_choice_prefix_check_is_n_log_n():
    choices = guided_choices(30_000)
    calls, found = calls_of(raw_prefixes, choices, bound=2 * len(choices))
    assert found is False  # one look at each sorted neighbour, not 9e8 comparisons
    assert raw_prefixes(["ab", "b", "a"]) and not raw_prefixes(["a", "b", "a"])


def test_size_limits_are_the_operators():
    raw = SCHEMA_FAMILIES["long_enum"][0](200)
    with pytest.raises(SchemaError) as err:
        parse_schema(raw, Limits(max_schema_nodes=100))
    assert err.value.rule == "size" and "100" in str(err.value)
    with pytest.raises(SchemaError) as err:
        parse_schema(raw, Limits(max_schema_chars=1000))
    assert err.value.rule == "size"


def test_measure_counts_what_it_reads():
    size = measure({"a": [1, "xy", None], "b": {}}, "x", max_nodes=99, max_chars=99)
    assert (size.nodes, size.objects, size.chars, size.depth) == (6, 2, 4, 3)


# Schemas as graphs: definitions referring to later definitions (or, rarely, back: a cycle),
# unions of references, constants, ranges and label sets, with any text (surrogates too).
_text = st.text(st.characters(blacklist_categories=()), max_size=6)
_leaf = st.one_of(
    st.builds(lambda v: {"const": v}, st.one_of(st.integers(-3, 3), st.floats(-2, 2), _text)),
    st.builds(lambda lo, n: {"type": "integer", "minimum": lo, "maximum": lo + n},
              st.integers(-50, 50), st.integers(0, 300)),
    st.builds(lambda vs: {"enum": vs}, st.lists(st.one_of(_text, st.integers(0, 2)),
                                                max_size=5)),
    st.builds(lambda d: {"type": "boolean", "description": d}, _text),
)


@st.composite
def schema_graphs(draw):
    count = draw(st.integers(1, 6))
    defs = {}
    for k in range(count):
        refs = st.sampled_from([f"#/$defs/d{j}" for j in range(count)]
                               + ["#/$defs/missing"])
        alternatives = draw(st.lists(st.one_of(_leaf, refs.map(lambda r: {"$ref": r})),
                                     min_size=1, max_size=8))
        defs[f"d{k}"] = {draw(st.sampled_from(["anyOf", "oneOf"])): alternatives}
    properties = {f"p{i}": draw(st.one_of(
        _leaf, st.sampled_from([{"$ref": f"#/$defs/d{k}"} for k in range(count)]),
        st.builds(lambda enum: {"type": "array", "uniqueItems": True, "items": {"enum": enum}},
                  st.lists(_text, max_size=4))))
        for i in range(draw(st.integers(1, 4)))}
    return closed(properties, **{"$defs": defs})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema_graphs())
def test_any_schema_graph_is_answered_or_refused_within_its_work(raw):
    try:
        bound = bound_for(raw)
    except UnicodeEncodeError:  # a surrogate: json.dumps escapes it, so this cannot happen
        raise
    calls, result = calls_of(parse_schema, raw, bound=bound)
    assert calls <= bound
    assert isinstance(result, (SchemaError, schema_module.SchemaSpec))
    if isinstance(result, SchemaError):
        str(result).encode("utf-8")
