"""Hostile request bodies by family, each at a chosen size: what the cost model must refuse or
answer in work linear in the body's size. Pure JSON builders (no vLLM), shared by the
regression tests and `benchmarks.bench_refusals`."""

from __future__ import annotations

from typing import Any, Callable


def closed(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": list(properties),
            "properties": properties, **extra}


def ref_fanout(fan: int, levels: int = 7) -> dict[str, Any]:
    """`levels` definitions, each an `anyOf` of `fan` references to the next: fan**levels
    paths through a schema of about 30 * fan * levels bytes."""
    defs: dict[str, Any] = {f"d{k}": {"anyOf": [{"$ref": f"#/$defs/d{k + 1}"}] * fan}
                            for k in range(levels - 1)}
    defs[f"d{levels - 1}"] = {"enum": ["a", "b"]}
    return closed({"x": {"$ref": "#/$defs/d0"}}, **{"$defs": defs})


def range_union(ranges: int) -> dict[str, Any]:
    """An `anyOf` of integer ranges, each within the candidate limit alone."""
    return closed({"n": {"anyOf": [{"type": "integer", "minimum": 256 * i,
                                    "maximum": 256 * i + 255} for i in range(ranges)]}})


def long_enum(values: int) -> dict[str, Any]:
    return closed({"c": {"enum": [f"choice {i}" for i in range(values)]}})


def one_of_consts(values: int) -> dict[str, Any]:
    return closed({"c": {"oneOf": [{"const": f"choice {i}"} for i in range(values)]}})


def label_set(labels: int) -> dict[str, Any]:
    return closed({"tags": {"type": "array", "uniqueItems": True,
                            "items": {"enum": [f"label {i}" for i in range(labels)]}}})


def unused_definitions(count: int) -> dict[str, Any]:
    return closed({"a": {"type": "boolean"}}, **{"$defs": {f"d{i}": {} for i in range(count)}})


def nested_definition(depth: int) -> dict[str, Any]:
    """One `$defs` entry nested `depth` levels deep (never referenced)."""
    inner: dict[str, Any] = {"type": "boolean"}
    for _ in range(depth):
        inner = {"anyOf": [inner]}
    return closed({"a": {"type": "boolean"}}, **{"$defs": {"deep": inner}})


def nested_union(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {"type": "boolean"}
    for _ in range(depth):
        inner = {"anyOf": [inner]}
    return closed({"a": inner})


def surrogate_description(_: int = 0) -> dict[str, Any]:
    return closed({"a": {"type": "boolean", "description": "is \ud800 urgent"}})


def guided_choices(count: int) -> list[str]:
    return [f"option {i}." for i in range(count)]


# family → (builder, sizes the growth table uses)
SCHEMA_FAMILIES: dict[str, tuple[Callable[[int], Any], tuple[int, ...]]] = {
    "ref_fanout": (ref_fanout, (2, 4, 8, 16)),
    "range_union": (range_union, (2, 4, 8, 16)),
    "long_enum": (long_enum, (256, 1024, 4096, 16384)),
    "one_of_consts": (one_of_consts, (64, 256, 1024, 4096)),
    "label_set": (label_set, (64, 256, 1024, 4096)),
    "unused_definitions": (unused_definitions, (100, 1000, 4000, 8000)),
    "nested_definition": (nested_definition, (50, 150, 300, 400)),
    "nested_union": (nested_union, (4, 8, 150, 300)),
}
