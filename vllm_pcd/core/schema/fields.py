"""One property of a schema → the field specs that answer it: the schemas users really write.

Pydantic and the OpenAI SDK write finite choices in many shapes: `Literal`s as `enum` or
`const`, `Enum` classes behind `$ref` into `$defs`, `Optional[...]` as `anyOf` with
`{"type": "null"}`, ratings as integer ranges, nested models as closed objects, and sets of
labels as arrays of unique enum items. Each shape is reduced here to what PCD answers: an
ordered, finite tuple of JSON values per field (a nested field keeps its keys; a label set
becomes one yes/no decision per label). A keyword that would change which values are valid
and is not understood is refused by name, never ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from vllm_pcd.core.schema.cost import WorkBudget
from vllm_pcd.core.schema.spec import MODES, FieldSpec, Limits, check_text, fail, shown

# Keywords that only annotate; they never change which values are valid.
ANNOTATIONS = frozenset({"title", "description", "$comment", "examples", "default"})
_PCD = frozenset({"x-pcd-mode", "x-pcd-after"})
_BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_SCALAR = frozenset({"type", "enum", "const"}) | _BOUNDS
_UNION = frozenset({"anyOf", "oneOf"})
_OBJECT = frozenset({"type", "properties", "required", "additionalProperties"})
_ARRAY = frozenset({"type", "items", "uniqueItems"})
_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,),
                                       "number": (int, float), "boolean": (bool,),
                                       "null": (type(None),)}
MAX_NAME_CHARS = 64
MAX_VALUE_CHARS = 256
MAX_DESCRIPTION_CHARS = 1000
MAX_DEPTH = 8  # nested objects, unions and `$ref` hops, together
_ANNOTATION_TYPES: dict[str, type] = {"title": str, "description": str, "$comment": str,
                                      "examples": list, "$schema": str}
_KIND_NAMES = {str: "a string", list: "an array"}


@dataclass(frozen=True)
class Parsing:
    """What a property's parse reads besides the property: the root's definitions (by
    `$ref` string), the limits that bound what a range may expand to, and the work the
    schema may still cause. A `$ref`'s values are computed once per depth (`ref_values`),
    so a schema whose unions share definitions costs their number, not their paths."""

    definitions: Mapping[str, Any]
    limits: Limits
    budget: WorkBudget
    ref_values: dict[tuple[str, int], tuple[Any, ...]] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)


def value_key(value: Any) -> tuple[str, Any]:
    """A JSON value as JSON Schema compares it: `1` equals `1.0` and `0` equals `-0.0`, but
    `true` is not `1`."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return type(value).__name__, value
    if isinstance(value, float) and value.is_integer():
        return "number", int(value)
    return "number", value


def definitions_of(root: Mapping[str, Any]) -> dict[str, Any]:
    """`#/$defs/Name` (and the older `#/definitions/Name`) → the schema it names."""
    out = {}
    for key in ("$defs", "definitions"):
        table = root.get(key, {})
        if not isinstance(table, dict):
            raise fail(f"pcd_schema.{key}", "ref", "must be an object of schemas")
        for name, target in table.items():
            pointer = str(name).replace("~", "~0").replace("/", "~1")
            out[f"#/{key}/{pointer}"] = target
    return out


def property_fields(name: str, raw: Any, parsing: Parsing, parents: tuple[str, ...] = ()
                    ) -> list[FieldSpec]:
    """The fields one property answers: one for a finite scalar, one per leaf of a nested
    object, one yes/no decision per label of a label set."""
    keys = (*parents, name)
    path = "pcd_schema.properties." + ".".join(shown(k) for k in keys)
    check_text(path, name, what="property name", max_chars=MAX_NAME_CHARS, rule="field_name")
    raw = _resolved(path, raw, parsing, len(parents))
    kind = raw.get("type")
    if kind == "object" or "properties" in raw:
        return _object_fields(path, raw, parsing, keys)
    if kind == "array" or "items" in raw:
        return _label_set(path, raw, parsing, keys)
    _only(path, raw, _SCALAR | _UNION | _PCD)
    options = finite_values(path, raw, parsing, len(parents))
    kind = "boolean" if options == (True, False) and raw.get("type") == "boolean" else "enum"
    return [FieldSpec(".".join(keys), kind, options, _description(path, raw), _mode(path, raw),
                      _after(path, raw, nested=bool(parents)), keys if parents else ())]


def _resolved(path: str, raw: Any, parsing: Parsing, depth: int) -> dict[str, Any]:
    """`raw` with its `$ref` (or a one-schema `allOf`, as older Pydantic writes a described
    reference) replaced by the schema it names; annotations beside it win."""
    seen: list[str] = []
    while isinstance(raw, dict) and ("$ref" in raw or "allOf" in raw):
        if depth + len(seen) >= MAX_DEPTH:
            raise fail(path, "depth", f"more than {MAX_DEPTH} levels of $ref and nesting")
        if "$ref" in raw:
            ref = raw["$ref"]
            if not isinstance(ref, str) or ref not in parsing.definitions:
                raise fail(path, "ref", f"$ref {shown(ref)} names no schema in this schema's "
                           "own $defs")
            if ref in seen:
                raise fail(path, "ref", f"$ref {shown(ref)} refers to itself (a cycle)")
            seen.append(ref)
            parsing.used.add(ref)
            parsing.budget.spend()
            target, rest = parsing.definitions[ref], {k: v for k, v in raw.items() if k != "$ref"}
        else:
            parts = raw["allOf"]
            if not isinstance(parts, list) or len(parts) != 1:
                raise fail(path, "unsupported_keyword", "allOf is supported with one schema only")
            seen.append("allOf")
            target, rest = parts[0], {k: v for k, v in raw.items() if k != "allOf"}
        _only(path, rest, ANNOTATIONS | _PCD)
        if not isinstance(target, dict):
            raise fail(path, "field_type", "a $ref must name a schema object")
        raw = {**target, **rest}
    if not isinstance(raw, dict):
        raise fail(path, "field_type", "each property must be a schema object")
    return raw


def _only(path: str, raw: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(raw) - allowed - ANNOTATIONS)
    if unknown:
        raise fail(path, "unsupported_keyword",
                   f"unsupported keyword(s) {', '.join(shown(k) for k in unknown)}; a field is "
                   "a finite choice (boolean, enum, const, bounded integer, nullable), a closed "
                   "object of such fields, or a unique array of enum values")
    check_annotations(path, raw)


def check_annotations(path: str, raw: Mapping[str, Any], description_rule: str = "description"
                      ) -> None:
    """What JSON Schema requires of the keywords PCD reads and of the annotations beside
    them: a schema PCD accepts is valid JSON Schema, checked in one look at each object PCD
    reads (an annotation of the wrong type is an invalid schema, not an absent keyword)."""
    for key, kind in _ANNOTATION_TYPES.items():
        if key in raw and not isinstance(raw[key], kind):
            rule = description_rule if key == "description" else "json_schema"
            raise fail(f"{path}.{key}", rule, f"is not valid JSON Schema: {key} must be "
                       f"{_KIND_NAMES[kind]}, got {type(raw[key]).__name__}")
    if "type" in raw and not isinstance(raw["type"], (str, list)):
        raise fail(f"{path}.type", "json_schema", "is not valid JSON Schema: type must be a "
                   f"string or a list of strings, got {type(raw['type']).__name__}")


def finite_values(path: str, raw: dict[str, Any], parsing: Parsing, depth: int
                  ) -> tuple[Any, ...]:
    """The values a scalar schema allows, in schema order; refused where they are not a
    small finite set."""
    if _UNION & set(raw):
        return _union(path, raw, parsing, depth)
    types = _declared_types(path, raw.get("type"))
    if "const" in raw and "enum" in raw:
        raise fail(path, "unsupported_keyword", "const and enum together are not supported")
    if "const" in raw:
        values: list[Any] = [raw["const"]]
    elif "enum" in raw:
        values = raw["enum"]
        if not isinstance(values, list) or not values:
            raise fail(path + ".enum", "enum", "enum must be a non-empty list")
    elif types == {"boolean"} or types == {"boolean", "null"}:
        values = [True, False] + ([None] if "null" in types else [])
    elif types and types <= {"integer", "null"} and "integer" in types:
        values = _integer_range(path, raw, parsing.limits) + ([None] if "null" in types else [])
    elif types == {"null"}:
        values = [None]
    else:
        raise fail(path, "field_type", f"type {shown(raw.get('type'))} is not a finite choice; "
                   'use "boolean", an "enum", a "const" or an integer with both bounds')
    if _BOUNDS & set(raw) and ("enum" in raw or "const" in raw or "integer" not in types):
        raise fail(path, "unsupported_keyword", "minimum and maximum bound an integer range only")
    return _checked_values(path, values, types, parsing)


def _declared_types(path: str, declared: Any) -> set[str]:
    """The `type` keyword as a set of names (empty when absent)."""
    if declared is None:
        return set()
    names = declared if isinstance(declared, list) else [declared]
    if not names or not all(isinstance(n, str) and n in _TYPES for n in names):
        raise fail(path, "field_type", f"type {shown(declared)} is not supported for a field")
    return set(names)


def _checked_values(path: str, values: list[Any], types: set[str], parsing: Parsing
                    ) -> tuple[Any, ...]:
    if len(values) > parsing.limits.max_candidates:
        raise fail(path, "max_candidates", f"{len(values)} values; the limit is "
                   f"{parsing.limits.max_candidates}")
    parsing.budget.spend(len(values))
    seen: set[tuple[str, Any]] = set()
    for i, value in enumerate(values):
        where = f"{path}.enum[{i}]"
        if isinstance(value, str):
            check_text(where, value, what="enum value", max_chars=MAX_VALUE_CHARS, rule="enum")
        elif isinstance(value, float) and not math.isfinite(value):
            raise fail(where, "enum", "a number value must be finite")
        elif value is not None and not isinstance(value, (bool, int, float)):
            raise fail(where, "enum", f"{type(value).__name__} values are not supported; a "
                       "value is a string, number, boolean or null")
        if types and not any(_is(value, t) for t in types):
            raise fail(where, "enum", f"{shown(value)} is not of the declared type "
                       f"{'/'.join(sorted(types))}")
        key = value_key(value)
        if key in seen:
            raise fail(where, "enum", f"duplicate enum value {shown(value)}")
        seen.add(key)
    return tuple(values)


def _is(value: Any, type_name: str) -> bool:
    if isinstance(value, bool):
        return type_name == "boolean"
    if type_name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[type_name])


def _integer_range(path: str, raw: dict[str, Any], limits: Limits) -> list[int]:
    """`minimum`..`maximum` (or the exclusive bounds), refused before it is expanded when it
    holds more values than `limits.max_candidates`."""
    low, high = _bound(path, raw, "minimum", "exclusiveMinimum", math.ceil, +1), \
        _bound(path, raw, "maximum", "exclusiveMaximum", math.floor, -1)
    if low is None or high is None:
        raise fail(path, "field_type", "an integer field needs both a minimum and a maximum "
                   "(or an enum)")
    if high < low:
        raise fail(path, "range", f"the range {low}..{high} holds no integer")
    if high - low + 1 > limits.max_candidates:
        raise fail(path, "max_candidates", f"the range {low}..{high} holds {high - low + 1} "
                   f"values; the limit is {limits.max_candidates}")
    return list(range(low, high + 1))


def _bound(path: str, raw: dict[str, Any], inclusive: str, exclusive: str, rounding: Any,
           step: int) -> int | None:
    bounds = []
    for key, shift in ((inclusive, 0), (exclusive, step)):
        if key in raw:
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise fail(f"{path}.{key}", "range", f"{key} must be a finite number")
            edge = rounding(value)
            bounds.append(edge + shift if edge == value else edge)
    if not bounds:
        return None
    return max(bounds) if step > 0 else min(bounds)


def _union(path: str, raw: dict[str, Any], parsing: Parsing, depth: int) -> tuple[Any, ...]:
    """`anyOf`/`oneOf` of finite scalars (`Optional[...]` is one): their values together.
    `oneOf` means exactly one alternative, so a value two alternatives allow is refused. The
    union is refused as soon as it holds more values than a request may score."""
    _only(path, raw, _UNION | _PCD)
    if len(_UNION & set(raw)) > 1:
        raise fail(path, "unsupported_keyword", "anyOf and oneOf together are not supported")
    key = "anyOf" if "anyOf" in raw else "oneOf"
    alternatives = raw[key]
    if not isinstance(alternatives, list) or not alternatives:
        raise fail(f"{path}.{key}", "field_type", f"{key} must be a non-empty list")
    values: dict[tuple[str, Any], Any] = {}
    for i, alternative in enumerate(alternatives):
        where = f"{path}.{key}[{i}]"
        found = _alternative_values(where, alternative, parsing, depth + 1)
        parsing.budget.spend(len(found))
        for value in found:
            if value_key(value) in values:
                if key == "oneOf":
                    raise fail(where, "enum", f"{shown(value)} is allowed by two oneOf "
                               "alternatives, so it would be invalid")
                continue
            values[value_key(value)] = value
        if len(values) > parsing.limits.max_candidates:
            raise fail(path, "max_candidates", f"the {key} allows more than "
                       f"{parsing.limits.max_candidates} values (the limit)")
    return tuple(values.values())


def _alternative_values(where: str, alternative: Any, parsing: Parsing, depth: int
                        ) -> tuple[Any, ...]:
    """One union alternative's values; a plain `$ref` is expanded once per depth, however
    many alternatives name it."""
    ref = alternative.get("$ref") if isinstance(alternative, dict) else None
    key = (ref, depth) if isinstance(ref, str) and ref in parsing.definitions else None
    if key is not None and key in parsing.ref_values:
        _only(where, {k: v for k, v in alternative.items() if k != "$ref"}, ANNOTATIONS)
        parsing.budget.spend()
        return parsing.ref_values[key]
    resolved = _resolved(where, alternative, parsing, depth)
    _only(where, resolved, _SCALAR | _UNION)
    found = finite_values(where, resolved, parsing, depth)
    if key is not None:
        parsing.ref_values[key] = found
    return found


def _object_fields(path: str, raw: dict[str, Any], parsing: Parsing, keys: tuple[str, ...]
                   ) -> list[FieldSpec]:
    """A nested object: closed, every property required; its leaves keep their keys."""
    _only(path, raw, _OBJECT)
    if len(keys) >= MAX_DEPTH:
        raise fail(path, "depth", f"objects nest deeper than {MAX_DEPTH} levels")
    properties = check_closed(path, raw)
    return [f for name, sub in properties.items()
            for f in property_fields(name, sub, parsing, keys)]


def check_closed(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    """An object's properties, where it is closed and requires every one of them."""
    if raw.get("type") != "object":
        raise fail(f"{path}.type", "schema_type", 'type must be "object"')
    if raw.get("additionalProperties", None) is not False:
        raise fail(f"{path}.additionalProperties", "closed_object",
                   "additionalProperties must be false (closed object)")
    properties = raw.get("properties")
    if not isinstance(properties, dict) or not properties:
        raise fail(f"{path}.properties", "properties", "properties must be a non-empty object")
    required = raw.get("required")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise fail(f"{path}.required", "required", "required must list every property")
    missing = [n for n in properties if n not in required]
    extra = [r for r in required if r not in properties]
    if missing or extra or len(set(required)) != len(required):
        detail = (f"not required: {', '.join(shown(n) for n in missing[:5])}" if missing else
                  f"unknown or repeated: {', '.join(shown(n) for n in (extra or required)[:5])}")
        raise fail(f"{path}.required", "required",
                   f"required must name every property exactly once ({detail})")
    return properties


def _label_set(path: str, raw: dict[str, Any], parsing: Parsing, keys: tuple[str, ...]
               ) -> list[FieldSpec]:
    """A unique array of enum strings: one yes/no decision per label, in enum order."""
    _only(path, raw, _ARRAY | {"x-pcd-mode"})
    if raw.get("type") != "array" or raw.get("uniqueItems") is not True:
        raise fail(path, "field_type", 'a label set is {"type": "array", "uniqueItems": true, '
                   '"items": {"enum": [...]}}')
    items = _resolved(f"{path}.items", raw.get("items"), parsing, len(keys))
    _only(f"{path}.items", items, _SCALAR | _UNION)
    labels = finite_values(f"{path}.items", items, parsing, len(keys))
    if not all(isinstance(label, str) for label in labels):
        raise fail(f"{path}.items", "enum", "a label set's items are string enum values")
    description, mode = _description(path, raw), _mode(path, raw)
    return [FieldSpec(".".join((*keys, label)), "boolean", (True, False), description, mode,
                      (), (*keys, label), member=True) for label in labels]


def _description(path: str, raw: dict[str, Any]) -> str | None:
    description = raw.get("description")
    if description is None:
        return None
    return check_text(path + ".description", description, what="description",
                      max_chars=MAX_DESCRIPTION_CHARS, rule="description")


def _mode(path: str, raw: dict[str, Any]) -> str | None:
    mode = raw.get("x-pcd-mode")
    if "x-pcd-mode" in raw and mode not in MODES:
        raise fail(path + ".x-pcd-mode", "mode", f"must be one of {list(MODES)}, got {shown(mode)}")
    return mode


def _after(path: str, raw: dict[str, Any], nested: bool) -> tuple[str, ...]:
    after = raw.get("x-pcd-after", [])
    if not isinstance(after, list) or not all(isinstance(n, str) for n in after) \
            or len(set(after)) != len(after):
        raise fail(path + ".x-pcd-after", "after", "must be a list of distinct property names")
    if after and nested:
        raise fail(path + ".x-pcd-after", "after", "conditioning is for top-level fields")
    return tuple(after)
