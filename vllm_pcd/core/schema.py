"""pcd_schema → typed field specs.

The contract is deliberately narrow: a closed, flat object whose every field is required and
is either a boolean or a string enum. Anything outside it is rejected, never ignored, because
a silently dropped keyword would change the meaning of the answer the user gets back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

FieldKind = Literal["boolean", "enum"]
FieldMode = Literal["token", "sequence"]
MODES: tuple[str, ...] = ("token", "sequence")

# Keywords that only annotate; they never change which values are valid.
_ANNOTATIONS = {"title", "description", "$comment", "examples", "default"}
_OBJECT_KEYS = {"type", "properties", "required", "additionalProperties", "$schema"} | _ANNOTATIONS
_FIELD_KEYS = {"type", "enum", "x-pcd-mode", "x-pcd-after"} | _ANNOTATIONS
_MAX_NAME_CHARS = 64
_MAX_VALUE_CHARS = 256
_MAX_DESCRIPTION_CHARS = 1000
_SHOWN_CHARS = 40  # error messages quote at most this much user input


@dataclass(frozen=True)
class Limits:
    """Per-request budgets, checked before any engine work. Configurable at server start."""

    max_fields: int = 32
    max_candidates: int = 256
    max_prompt_tokens: int = 4096
    max_value_tokens: int = 64
    max_branches_per_batch: int = 32
    max_engine_requests: int = 1024  # one PCD call's requests to the engine, context included
    max_request_seconds: int = 600   # a PCD call still running then is aborted (HTTP 504)
    max_prompt_chars: int = 0  # characters of conversation text; 0: 16 per max_prompt_tokens
    max_messages: int = 256
    max_queued_plans: int = 64  # PCD calls waiting for or in planning; more get HTTP 429

    @property
    def prompt_chars(self) -> int:
        """A text over 16 characters per allowed token is refused before it is tokenized."""
        return self.max_prompt_chars or 16 * self.max_prompt_tokens

    @classmethod
    def from_mapping(cls, raw: dict[str, Any] | None) -> "Limits":
        raw = dict(raw or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown PCD limit(s) {unknown}; known: {sorted(known)}")
        values = {}
        for name, value in raw.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PCD limit {name} must be a positive integer, got {value!r}")
            values[name] = value
        return cls(**values)


@dataclass(frozen=True)
class FieldSpec:
    """One answerable field. `options` are the JSON values, in schema order."""

    name: str
    kind: FieldKind
    options: tuple[Any, ...]
    description: str | None = None
    mode: FieldMode | None = None  # None: the request's default mode
    after: tuple[str, ...] = ()  # `x-pcd-after`: fields answered first, whose values it reads


@dataclass(frozen=True)
class SchemaSpec:
    fields: tuple[FieldSpec, ...]

    @property
    def total_candidates(self) -> int:
        return sum(len(f.options) for f in self.fields)


class SchemaError(ValueError):
    """A request the server refuses before inference (HTTP 400)."""

    def __init__(self, message: str, *, param: str = "pcd_schema", rule: str = "invalid"):
        super().__init__(message)
        self.param = param
        self.rule = rule


def shown(value: Any) -> str:
    """A bounded rendering of user input for error messages (never echo unbounded input)."""
    text = value if isinstance(value, str) else repr(value)
    text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def _fail(path: str, rule: str, message: str) -> SchemaError:
    return SchemaError(f"{path}: {message}", param=path, rule=rule)


def _check_text(path: str, value: Any, *, what: str, max_chars: int, rule: str) -> str:
    if not isinstance(value, str):
        raise _fail(path, rule, f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise _fail(path, rule, f"{what} must not be empty")
    if len(value) > max_chars:
        raise _fail(path, rule, f"{what} is longer than {max_chars} characters")
    if any(ord(c) < 32 and c not in "\t" for c in value):
        raise _fail(path, rule, f"{what} {shown(value)} contains control characters")
    return value


def _parse_field(name: str, raw: Any) -> FieldSpec:
    path = f"pcd_schema.properties.{shown(name)}"
    if not isinstance(raw, dict):
        raise _fail(path, "field_type", "each property must be a schema object")
    unknown = sorted(set(raw) - _FIELD_KEYS)
    if unknown:
        raise _fail(path, "unsupported_keyword",
                    f"unsupported keyword(s) {', '.join(shown(k) for k in unknown)}; "
                    "a field is a boolean or a string enum")
    description = raw.get("description")
    if description is not None:
        description = _check_text(path + ".description", description, what="description",
                                  max_chars=_MAX_DESCRIPTION_CHARS, rule="description")
    mode = raw.get("x-pcd-mode")
    if "x-pcd-mode" in raw and mode not in MODES:
        raise _fail(path + ".x-pcd-mode", "mode", f"must be one of {list(MODES)}, got {shown(mode)}")
    after = _after(path, raw)
    kind = raw.get("type")
    if kind == "boolean":
        if "enum" in raw:
            raise _fail(path, "field_type", "a boolean field takes no enum")
        return FieldSpec(name, "boolean", (True, False), description, mode, after)
    if kind not in ("string", None) or "enum" not in raw:
        raise _fail(path, "field_type",
                    f"type {shown(kind)} is not supported; use \"boolean\" or a string \"enum\"")
    options = raw["enum"]
    if not isinstance(options, list) or not options:
        raise _fail(path + ".enum", "enum", "enum must be a non-empty list")
    seen: set[str] = set()
    for i, option in enumerate(options):
        _check_text(f"{path}.enum[{i}]", option, what="enum value",
                    max_chars=_MAX_VALUE_CHARS, rule="enum")
        if option in seen:
            raise _fail(f"{path}.enum[{i}]", "enum", f"duplicate enum value {shown(option)}")
        seen.add(option)
    return FieldSpec(name, "enum", tuple(options), description, mode, after)


def _after(path: str, raw: dict[str, Any]) -> tuple[str, ...]:
    after = raw.get("x-pcd-after", [])
    if not isinstance(after, list) or not all(isinstance(n, str) for n in after) \
            or len(set(after)) != len(after):
        raise _fail(path + ".x-pcd-after", "after", "must be a list of distinct property names")
    return tuple(after)


def _check_dependencies(fields: tuple[FieldSpec, ...]) -> None:
    """`x-pcd-after` names other properties of the schema, and never leads back to itself."""
    names = {f.name for f in fields}
    after = {f.name: f.after for f in fields}
    for f in fields:
        path = f"pcd_schema.properties.{shown(f.name)}.x-pcd-after"
        for other in f.after:
            if other not in names or other == f.name:
                raise _fail(path, "after", f"{shown(other)} is not another property")
    state: dict[str, int] = {}

    def visit(name: str) -> None:
        state[name] = 1
        for other in after[name]:
            if state.get(other) == 1:
                raise _fail(f"pcd_schema.properties.{shown(name)}.x-pcd-after", "after",
                            f"{shown(other)} is answered after {shown(name)} already (a cycle)")
            if other not in state:
                visit(other)
        state[name] = 2

    for f in fields:
        if f.name not in state:
            visit(f.name)


def _check_json_schema(raw: dict[str, Any]) -> None:
    """What passes the PCD contract must also be valid JSON Schema: an annotation of the wrong
    type (`"type": null`, a numeric `title`) is an invalid schema, not an absent keyword."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError as InvalidJSONSchema

    try:
        Draft202012Validator.check_schema(raw)
    except InvalidJSONSchema as err:
        where = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in err.path)
        raise SchemaError(f"pcd_schema{shown(where)} is not valid JSON Schema: "
                          f"{shown(err.message)}", param=f"pcd_schema{where[:80]}",
                          rule="json_schema") from None


def parse_schema(raw: Any, limits: Limits = Limits()) -> SchemaSpec:
    """Validate `raw` against the PCD contract and the field/candidate limits."""
    if not isinstance(raw, dict):
        raise SchemaError(f"pcd_schema must be a JSON object, got {type(raw).__name__}",
                          rule="schema_type")
    unknown = sorted(set(raw) - _OBJECT_KEYS)
    if unknown:
        raise SchemaError("pcd_schema: unsupported keyword(s) "
                          f"{', '.join(shown(k) for k in unknown)}", rule="unsupported_keyword")
    if raw.get("type") != "object":
        raise SchemaError('pcd_schema.type must be "object"', param="pcd_schema.type",
                          rule="schema_type")
    if raw.get("additionalProperties", None) is not False:
        raise SchemaError("pcd_schema.additionalProperties must be false (closed object)",
                          param="pcd_schema.additionalProperties", rule="closed_object")
    properties = raw.get("properties")
    if not isinstance(properties, dict) or not properties:
        raise SchemaError("pcd_schema.properties must be a non-empty object",
                          param="pcd_schema.properties", rule="properties")
    if len(properties) > limits.max_fields:
        raise SchemaError(f"pcd_schema has {len(properties)} fields; the limit is "
                          f"{limits.max_fields}", param="pcd_schema.properties", rule="max_fields")
    required = raw.get("required")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaError("pcd_schema.required must list every property",
                          param="pcd_schema.required", rule="required")
    missing = [n for n in properties if n not in required]
    extra = [r for r in required if r not in properties]
    if missing or extra or len(set(required)) != len(required):
        detail = (f"not required: {', '.join(shown(n) for n in missing[:5])}" if missing else
                  f"unknown or repeated: {', '.join(shown(n) for n in (extra or required)[:5])}")
        raise SchemaError(f"pcd_schema.required must name every property exactly once ({detail})",
                          param="pcd_schema.required", rule="required")
    fields = []
    for name, field in properties.items():
        _check_text("pcd_schema.properties", name, what="property name",
                    max_chars=_MAX_NAME_CHARS, rule="field_name")
        fields.append(_parse_field(name, field))
    _check_json_schema(raw)
    spec = SchemaSpec(tuple(fields))
    _check_dependencies(spec.fields)
    if spec.total_candidates > limits.max_candidates:
        raise SchemaError(f"pcd_schema has {spec.total_candidates} candidate values in all; "
                          f"the limit is {limits.max_candidates}",
                          param="pcd_schema.properties", rule="max_candidates")
    return spec
