"""The vocabulary of a parsed schema: field specs, the per-request limits, and the error a
refused schema raises. Parsing lives in `schema` (the object) and `fields` (each property)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

FieldKind = Literal["boolean", "enum"]
FieldMode = Literal["token", "sequence"]
MODES: tuple[str, ...] = ("token", "sequence")
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
    # A schema (or guided-choice list) is measured before it is read: its JSON values, and
    # characters of its keys and strings. Its interpretation work is then linear in them.
    max_schema_nodes: int = 8192
    max_schema_chars: int = 1 << 18

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
    # Where the value goes: the keys from the root object (empty: the top-level `name`).
    # A `member` field is one yes/no decision of a multi-label array: whether its last key
    # (an option of the array at the keys before it) is in the array.
    path: tuple[str, ...] = ()
    member: bool = False

    @property
    def keys(self) -> tuple[str, ...]:
        return self.path or (self.name,)

    @property
    def nested(self) -> bool:
        return len(self.keys) > 1


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


def fail(path: str, rule: str, message: str) -> SchemaError:
    return SchemaError(f"{path}: {message}", param=path, rule=rule)


def check_text(path: str, value: Any, *, what: str, max_chars: int, rule: str) -> str:
    if not isinstance(value, str):
        raise fail(path, rule, f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise fail(path, rule, f"{what} must not be empty")
    if len(value) > max_chars:
        raise fail(path, rule, f"{what} is longer than {max_chars} characters")
    if any(ord(c) < 32 and c not in "\t" for c in value):
        raise fail(path, rule, f"{what} {shown(value)} contains control characters")
    return value
