"""What a request's JSON may cost before PCD interprets it.

A schema is a small program, and every part of a body is hostile. `measure` walks a JSON value
once, without recursion (so no nesting can overflow the stack), before any other code reads
it: it counts the value's nodes and the characters of its keys and strings, bounds its depth,
and refuses a lone surrogate (no tokenizer can encode one). Whatever interprets the value
afterwards spends from a `WorkBudget` sized from that measure, so the work a schema causes is
linear in its size, and a refusal costs no more than reading the body once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_pcd.core.schema.spec import SchemaError, shown

# JSON nesting a value may have: a schema of MAX_DEPTH nested objects and unions stays far
# below it; recursive readers (the cache key, vLLM's own validators) stay far below Python's
# recursion limit.
MAX_JSON_DEPTH = 64


@dataclass(frozen=True)
class Size:
    """One JSON value's size as `measure` counted it."""

    nodes: int  # objects, arrays and scalars
    objects: int
    chars: int  # characters of keys and strings
    depth: int


def _where(param: str, link: tuple | None) -> str:
    keys: list[Any] = []
    while link is not None:
        link, key = link
        keys.append(key)
    where = param + "".join(f"[{k}]" if isinstance(k, int) else f".{shown(k)}"
                            for k in reversed(keys))
    return where if len(where) <= 120 else where[:120] + "…"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def measure(value: Any, param: str, *, max_nodes: int, max_chars: int,
            max_depth: int = MAX_JSON_DEPTH) -> Size:
    """`value`'s size, refused (HTTP 400 naming `param` and the place) past `max_nodes` nodes,
    `max_chars` characters, `max_depth` levels, at a lone surrogate, or at anything that is
    not JSON. Stops at the first node past a bound, so a refusal costs at most the bound."""
    nodes = objects = chars = deepest = 0
    stack: list[tuple[Any, int, tuple | None]] = [(value, 1, None)]
    while stack:
        item, depth, link = stack.pop()
        nodes += 1
        deepest = max(deepest, depth)
        if depth > max_depth:
            raise SchemaError(f"{_where(param, link)}: nests deeper than {max_depth} levels",
                              param=param, rule="depth")
        if nodes > max_nodes:
            raise SchemaError(f"{param}: more than {max_nodes} JSON values (the limit)",
                              param=param, rule="size")
        if isinstance(item, dict):
            objects += 1
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise SchemaError(f"{_where(param, link)}: object keys must be strings",
                                      param=param, rule="json")
                chars += len(key)
                if not _encodable(key):
                    raise SchemaError(f"{_where(param, (link, key))}: a key holds a lone "
                                      "surrogate, which is not text", param=param,
                                      rule="encoding")
                stack.append((sub, depth + 1, (link, key)))
        elif isinstance(item, (list, tuple)):
            stack.extend((sub, depth + 1, (link, i)) for i, sub in enumerate(item))
        elif isinstance(item, str):
            chars += len(item)
            if not _encodable(item):
                raise SchemaError(f"{_where(param, link)}: a string holds a lone surrogate, "
                                  "which is not text", param=param, rule="encoding")
        elif item is not None and not isinstance(item, (bool, int, float)):
            raise SchemaError(f"{_where(param, link)}: {type(item).__name__} is not a JSON "
                              "value", param=param, rule="json")
        if chars > max_chars:
            raise SchemaError(f"{param}: more than {max_chars} characters of keys and strings "
                              "(the limit)", param=param, rule="size")
    return Size(nodes, objects, chars, deepest)


class WorkBudget:
    """Units of interpretation work a schema may cause (values expanded and compared,
    alternatives and references followed), fixed from its measured size before any is
    spent; past it the schema is refused, whatever it would have expanded to."""

    # Units a schema may spend per JSON value it holds: a legitimate schema spends a few
    # (a field's values once, a shared `$ref` once per use); a hostile one runs out early.
    PER_NODE = 16
    FLOOR = 1024

    def __init__(self, size: Size, param: str = "pcd_schema"):
        self.left = self.PER_NODE * size.nodes + self.FLOOR
        self.param = param

    def spend(self, units: int = 1) -> None:
        self.left -= units
        if self.left < 0:
            raise SchemaError(f"{self.param}: expands to more work than its size allows (each "
                              "value, alternative and $ref use counts); share fewer "
                              "definitions across fewer alternatives", param=self.param,
                              rule="schema_cost")
