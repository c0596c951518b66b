"""The schema room: a request's JSON Schema → its finite-choice fields, and back to objects.

`parse_schema` checks a schema against the `Limits` at a cost bounded before it runs
(`cost`) and reduces each property to its finite values (`fields`); `objects` builds and
reads the typed object those fields describe. Everything outside imports from here.
"""

from vllm_pcd.core.schema.spec import MODES, FieldSpec, Limits, SchemaError, SchemaSpec, shown
from vllm_pcd.core.schema.cost import MAX_JSON_DEPTH, measure
from vllm_pcd.core.schema.parse import parse_schema
from vllm_pcd.core.schema.objects import object_of, option_index, to_json, value_at

__all__ = [
    "MODES", "FieldSpec", "Limits", "SchemaError", "SchemaSpec", "shown", "MAX_JSON_DEPTH",
    "measure", "parse_schema", "object_of", "option_index", "to_json", "value_at"]
