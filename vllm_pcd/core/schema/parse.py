"""pcd_schema → typed field specs.

The contract is deliberately narrow: a closed object whose every field is required and is a
finite choice (`fields` says which shapes count). Anything outside it is rejected, never
ignored, because a silently dropped keyword would change the meaning of the answer the user
gets back.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_pcd.core.schema.cost import Size, WorkBudget, measure
from vllm_pcd.core.schema.fields import (ANNOTATIONS, Parsing, check_annotations, check_closed,
                                         definitions_of, property_fields)
from vllm_pcd.core.schema.spec import (MODES, FieldKind, FieldMode, FieldSpec, Limits, SchemaError,
                                       SchemaSpec, fail, shown)

# The vocabulary is spec's; every caller reads it from here, beside the parser.
__all__ = ["MODES", "FieldKind", "FieldMode", "FieldSpec", "Limits", "SchemaError", "SchemaSpec",
           "parse_schema", "shown"]
_ROOT_KEYS = {"type", "properties", "required", "additionalProperties", "$schema", "$defs",
              "definitions"} | ANNOTATIONS


def _check_dependencies(fields: tuple[FieldSpec, ...]) -> None:
    """`x-pcd-after` names other properties of the schema, and never leads back to itself."""
    names = {f.name for f in fields}
    after = {f.name: f.after for f in fields}
    for f in fields:
        path = f"pcd_schema.properties.{shown(f.name)}.x-pcd-after"
        for other in f.after:
            if other not in names or other == f.name:
                raise fail(path, "after", f"{shown(other)} is not another property")
    state: dict[str, int] = {}

    def visit(name: str) -> None:
        state[name] = 1
        for other in after[name]:
            if state.get(other) == 1:
                raise fail(f"pcd_schema.properties.{shown(name)}.x-pcd-after", "after",
                            f"{shown(other)} is answered after {shown(name)} already (a cycle)")
            if other not in state:
                visit(other)
        state[name] = 2

    for f in fields:
        if f.name not in state:
            visit(f.name)


# Unused `$defs` entries are checked by the JSON-Schema meta-check (about 0.3 ms and 1,000
# Python calls a subschema on a 2-core x86 CPU), so they may hold at most this many objects.
MAX_UNUSED_DEFINITION_OBJECTS = 16


def _check_json_schema(raw: dict[str, Any], unused: dict[str, Any], limits: Limits) -> None:
    """What passes the PCD contract must also be valid JSON Schema. What PCD reads it checks
    itself as it reads (`fields.check_annotations`); the definitions it never reads are
    meta-checked here, within a bound, since their content is not PCD's to judge."""
    check_annotations("pcd_schema", raw, description_rule="json_schema")
    if not unused:
        return
    size = measure(unused, "pcd_schema.$defs", max_nodes=limits.max_schema_nodes,
                   max_chars=limits.max_schema_chars)  # within the whole schema's bounds
    if size.objects > MAX_UNUSED_DEFINITION_OBJECTS:
        raise SchemaError(f"pcd_schema.$defs: the definitions no field uses hold more than "
                          f"{MAX_UNUSED_DEFINITION_OBJECTS} schema objects; leave them out",
                          param="pcd_schema.$defs", rule="size")
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError as InvalidJSONSchema

    try:
        Draft202012Validator.check_schema({"$defs": unused})
    except InvalidJSONSchema as err:
        where = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in err.path)
        raise SchemaError(f"pcd_schema{shown(where)} is not valid JSON Schema: "
                          f"{shown(err.message)}", param=f"pcd_schema{where[:80]}",
                          rule="json_schema") from None


# Parsed schemas kept for the next call asking the same one (a tenant's documents share their
# schema): the JSON-Schema meta-check alone costs milliseconds a call. Only schemas of at most
# CACHED_SCHEMA_CHARS characters of keys and strings are kept, so the cache stays a few MB
# whatever clients send.
CACHED_SCHEMAS = 128
CACHED_SCHEMA_CHARS = 1 << 14


def parse_schema(raw: Any, limits: Limits = Limits()) -> SchemaSpec:
    """Validate `raw` against the PCD contract and the field/candidate limits, in work linear
    in its size (`cost`). A schema parsed or refused before (the same JSON values, keys in
    the same order) is answered from the cache."""
    size = measure(raw, "pcd_schema", max_nodes=limits.max_schema_nodes,
                   max_chars=limits.max_schema_chars)
    key = frozen(raw, [CACHED_SCHEMA_CHARS])
    parsed = _parse(raw, limits, size) if key is None else _parse_kept(key, limits, size)
    if isinstance(parsed, SchemaError):
        raise parsed
    return parsed


# Deeper values are never kept: the parser refuses them with a 4xx, where building their
# key would recurse first.
CACHED_SCHEMA_DEPTH = 32


def frozen(value: Any, budget: list[int], depth: int = 0) -> Any:
    """A hashable copy of a JSON value that tells apart what JSON tells apart (`1`, `1.0`,
    `true`, `"1"`, `-0.0`; key order), or None for anything else, past `budget` characters
    or past CACHED_SCHEMA_DEPTH levels."""
    budget[0] -= len(value) + 1 if isinstance(value, str) else 1
    if budget[0] < 0 or depth > CACHED_SCHEMA_DEPTH:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return ("float", repr(value))
    if value is None or isinstance(value, (bool, int)):
        return (type(value).__name__, value)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return None
        budget[0] -= sum(len(k) for k in value)
        items = tuple((k, frozen(v, budget, depth + 1)) for k, v in value.items())
        return None if budget[0] < 0 or any(v is None for _, v in items) \
            else ("object", items)
    if isinstance(value, list):
        items = tuple(frozen(v, budget, depth + 1) for v in value)
        return None if budget[0] < 0 or any(v is None for v in items) else ("array", items)
    return None


def _thawed(key: Any) -> Any:
    if isinstance(key, str):
        return key
    kind, body = key
    if kind == "object":
        return {k: _thawed(v) for k, v in body}
    if kind == "array":
        return [_thawed(v) for v in body]
    return float(body) if kind == "float" else body


@functools.lru_cache(maxsize=CACHED_SCHEMAS)
def _parse_kept(key: Any, limits: Limits, size: Size) -> SchemaSpec | SchemaError:
    try:
        return _parse(_thawed(key), limits, size)
    except SchemaError as err:  # kept too: a replayed refusal costs its lookup only
        return err


def _parse(raw: Any, limits: Limits, size: Size) -> SchemaSpec:
    if not isinstance(raw, dict):
        raise SchemaError(f"pcd_schema must be a JSON object, got {type(raw).__name__}",
                          rule="schema_type")
    unknown = sorted(set(raw) - _ROOT_KEYS)
    if unknown:
        raise SchemaError("pcd_schema: unsupported keyword(s) "
                          f"{', '.join(shown(k) for k in unknown)}", rule="unsupported_keyword")
    properties = check_closed("pcd_schema", raw)
    if len(properties) > limits.max_fields:
        raise SchemaError(f"pcd_schema has {len(properties)} fields; the limit is "
                          f"{limits.max_fields}", param="pcd_schema.properties", rule="max_fields")
    definitions = definitions_of(raw)
    parsing = Parsing(definitions, limits, WorkBudget(size))
    fields = []
    for name, field in properties.items():
        fields += property_fields(name, field, parsing)
        if len(fields) > limits.max_fields:
            raise SchemaError(f"pcd_schema answers more than {limits.max_fields} fields (nested "
                              "fields and each label of a label set count); the limit is "
                              f"{limits.max_fields}", param="pcd_schema.properties",
                              rule="max_fields")
    _check_json_schema(raw, {ref: target for ref, target in definitions.items()
                             if ref not in parsing.used}, limits)
    spec = SchemaSpec(tuple(fields))
    _check_names(spec.fields)
    _check_dependencies(spec.fields)
    if spec.total_candidates > limits.max_candidates:
        raise SchemaError(f"pcd_schema has {spec.total_candidates} candidate values in all; "
                          f"the limit is {limits.max_candidates}",
                          param="pcd_schema.properties", rule="max_candidates")
    return spec


def _check_names(fields: tuple[FieldSpec, ...]) -> None:
    """A field's name (its keys joined by dots) is how diagnostics, profiles and
    `x-pcd-after` name it, so two fields may not share one (`"a.b"` beside `a: {b}`)."""
    seen: set[str] = set()
    for f in fields:
        if f.name in seen:
            raise fail(f"pcd_schema.properties.{shown(f.name)}", "field_name",
                       f"two fields are both named {shown(f.name)}")
        seen.add(f.name)
