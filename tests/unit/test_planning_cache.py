"""What planning keeps between calls (parsed schemas, the tails' tokens) answers exactly as
planning from scratch, tells apart what JSON tells apart, and stays bounded."""

import json
import uuid

import pytest

from vllm_pcd.core.plan import Options, build_plan, in_context
from vllm_pcd.core.schema import Limits, SchemaError, parse as schema_module, parse_schema


def fresh_schema(**properties):
    """A schema no earlier test parsed (a field name of its own), then `properties`."""
    own = {f"f{uuid.uuid4().hex[:8]}": {"type": "boolean"}}
    props = {**own, **properties}
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


@pytest.fixture
def checks(monkeypatch):
    """How many times the JSON-Schema meta-check ran."""
    calls = []
    real = schema_module._check_json_schema
    monkeypatch.setattr(schema_module, "_check_json_schema",
                        lambda *args: (calls.append(1), real(*args))[1])
    return calls


def test_a_schema_asked_again_is_not_checked_again(checks):
    raw = fresh_schema(topic={"enum": ["a", "b"]})
    first = parse_schema(raw)
    again = parse_schema(fresh_copy(raw))
    assert again is first and len(checks) == 1


def fresh_copy(raw):
    return json.loads(json.dumps(raw))


def test_what_json_tells_apart_is_parsed_apart():
    raw = fresh_schema(n={"enum": [1, 2]})
    floats = fresh_copy(raw)
    floats["properties"]["n"]["enum"] = [1.0, 2.0]
    assert [type(o) for o in parse_schema(raw).fields[1].options] == [int, int]
    assert [type(o) for o in parse_schema(floats).fields[1].options] == [float, float]
    swapped = fresh_copy(raw)
    swapped["properties"] = dict(reversed(list(raw["properties"].items())))
    assert [f.name for f in parse_schema(swapped).fields] == \
        [f.name for f in reversed(parse_schema(raw).fields)]


def test_limits_are_part_of_what_is_kept():
    raw = fresh_schema(a={"type": "boolean"}, b={"type": "boolean"})
    parse_schema(raw)
    with pytest.raises(SchemaError, match="limit is 2"):
        parse_schema(raw, Limits(max_fields=2))


def test_refusals_are_kept_and_large_schemas_are_not(checks):
    bad = fresh_schema(a={"type": "boolean", "x-unknown": 1})
    for _ in range(2):
        with pytest.raises(SchemaError, match="x-unknown"):
            parse_schema(bad)
    assert schema_module._parse_kept.cache_info().hits >= 1
    kept = schema_module._parse_kept.cache_info().currsize
    many = schema_module.CACHED_SCHEMA_CHARS // 900 + 1
    large = fresh_schema(**{f"a{k}": {"type": "boolean", "description": "d" * 900}
                            for k in range(many)})
    before = len(checks)
    assert parse_schema(large) == parse_schema(large)
    assert len(checks) - before == 2  # checked on each call: never kept
    assert schema_module._parse_kept.cache_info().currsize == kept


@pytest.mark.parametrize("where", ["keyword", "enum"])
def test_deeply_nested_schemas_are_refused_as_before(where):
    """Building a cache key must not recurse where the parser refuses at the top."""
    deep = []
    for _ in range(950):
        deep = [deep]
    raw = fresh_schema(**({"a": {"enum": [deep, 1]}} if where == "enum" else {}))
    if where == "keyword":
        raw["x"] = deep
    with pytest.raises(SchemaError):
        parse_schema(raw)


class Unhashable:
    """A tokenizer wrapper that cannot be a cache key."""

    __hash__ = None

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


@pytest.mark.parametrize("layout", ["schema_first", "schema_first_restated", "schema_first_recap",
                                    "document_first"])
def test_kept_tails_plan_exactly_as_planning_from_scratch(tokenizer, layout):
    spec = parse_schema(fresh_schema(topic={"enum": ["billing", "tech support", "other"]},
                                     refund={"type": "boolean"}))
    options = Options(layout=layout)
    documents = ["My card was charged twice.", "The app crashes on start, " * 20]
    warm = [build_plan(tokenizer, spec, [{"role": "user", "content": d}], options)
            for d in documents for _ in range(2)]
    assert in_context._kept_tail.cache_info().hits > 0
    in_context._kept_tail.cache_clear()
    cold = [build_plan(Unhashable(tokenizer), spec, [{"role": "user", "content": d}], options)
            for d in documents for _ in range(2)]
    assert in_context._kept_tail.cache_info().currsize == 0
    assert warm == cold


def test_the_planning_benchmark_runs_and_plans_alike(model_path):
    """It raises if the kept caches plan differently; no timing is asserted."""
    from benchmarks import bench_planning

    rows = bench_planning.main(["--model", str(model_path), "--fields", "4", "--docs", "2"])
    assert [r["fields"] for r in rows] == [4] and rows[0]["kept_ms"] > 0
