"""The typed object a schema describes: built from one value per field, read back, checked.

Every door writes its answer with `object_of` and `to_json`; evaluation reads gold and
answers back with `value_at` and `option_index`.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from vllm_pcd.core.schema.spec import FieldSpec, SchemaSpec


def validate_object(schema: SchemaSpec, obj: dict[str, Any]) -> None:
    """The assembled object must satisfy the schema; a failure here is a bug, not bad input."""
    if list(obj) != list(dict.fromkeys(f.keys[0] for f in schema.fields)):
        raise AssertionError(f"keys {list(obj)} differ from the schema's fields")
    for f in schema.fields:
        value = value_at(obj, f)
        if f.kind == "boolean" and not isinstance(value, bool):
            raise AssertionError(f"{f.name}: {value!r} is not a boolean")
        if f.kind == "enum" and not any(_same(value, o) for o in f.options):
            raise AssertionError(f"{f.name}: {value!r} is not one of the enum values")


def _same(a: Any, b: Any) -> bool:
    """JSON equality: `1` is not `true`."""
    return type(a) is type(b) and a == b


MISSING = object()  # what `value_at` gives for a field the object does not hold


def value_at(obj: Any, field: FieldSpec) -> Any:
    """The field's value in an object of its schema (a label-set decision: whether its label
    is in the array), or MISSING."""
    *parents, last = field.keys
    for key in parents:
        if not isinstance(obj, dict) or key not in obj:
            return MISSING
        obj = obj[key]
    if field.member:
        return last in obj if isinstance(obj, list) else MISSING
    return obj[last] if isinstance(obj, dict) and last in obj else MISSING


def option_index(field: FieldSpec, value: Any) -> int | None:
    """Which option `value` is (by JSON equality), or None."""
    return next((i for i, o in enumerate(field.options) if _same(o, value)), None)


def object_of(schema: SchemaSpec, values: Sequence[Any]) -> dict[str, Any]:
    """The object holding one value per field (in schema order). Nested fields go under their
    keys; a label set lists the labels decided true, in its enum order."""
    obj: dict[str, Any] = {}
    for f, value in zip(schema.fields, values, strict=True):
        *parents, last = f.keys
        place = obj
        for key in parents[:-1] if f.member else parents:
            place = place.setdefault(key, {})
        if f.member:
            labels = place.setdefault(parents[-1], [])
            if value is True:
                labels.append(last)
        else:
            place[last] = value
    validate_object(schema, obj)
    return obj


def to_json(obj: dict[str, Any]) -> str:
    """Compact JSON, keys in schema order, unicode kept as is."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
