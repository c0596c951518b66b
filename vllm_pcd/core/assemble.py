"""Field results → the typed JSON object, and each field's diagnostics.

A field's scores come from `scoring`; here they only choose the value and are reported.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from vllm_pcd.core.schema import FieldSpec, SchemaSpec


@dataclass(frozen=True)
class FieldResult:
    field: FieldSpec
    scores: tuple[float, ...]  # log-probability of each option over the allowed set
    extra: dict[str, Any] = field(default_factory=dict)  # mode-specific diagnostics
    candidate_extra: tuple[dict[str, Any], ...] = ()     # per option, likewise

    @property
    def best_index(self) -> int:
        # max() keeps the first of equal scores: ties go to schema order.
        return max(range(len(self.scores)), key=self.scores.__getitem__)

    @property
    def value(self) -> Any:
        return self.field.options[self.best_index]

    @property
    def margin(self) -> float | None:
        """Log-probability gap between the best and the second-best option."""
        if len(self.scores) < 2:
            return None
        first, second = sorted(self.scores, reverse=True)[:2]
        return first - second

    def diagnostics(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "candidates": [
                {"value": option, "score": score, "probability": math.exp(score), **more}
                for option, score, more in zip(self.field.options, self.scores,
                                               self.candidate_extra or [{}] * len(self.scores))
            ],
            "margin": self.margin,
            **self.extra,
        }


def validate_object(schema: SchemaSpec, obj: dict[str, Any]) -> None:
    """The assembled object must satisfy the schema; a failure here is a bug, not bad input."""
    if list(obj) != [f.name for f in schema.fields]:
        raise AssertionError(f"keys {list(obj)} differ from the schema's fields")
    for f in schema.fields:
        value = obj[f.name]
        if f.kind == "boolean" and not isinstance(value, bool):
            raise AssertionError(f"{f.name}: {value!r} is not a boolean")
        if f.kind == "enum" and value not in f.options:
            raise AssertionError(f"{f.name}: {value!r} is not one of the enum values")


def assemble(schema: SchemaSpec, results: Sequence[FieldResult]) -> dict[str, Any]:
    obj = {r.field.name: r.value for r in results}
    validate_object(schema, obj)
    return obj


def to_json(obj: dict[str, Any]) -> str:
    """Compact JSON, keys in schema order, unicode kept as is."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
