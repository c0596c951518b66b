"""schema + conversation → token-level plan: the shared context and one short branch per field.

The shared context is the conversation plus the field list, rendered by the model's own chat
template up to the assistant's turn, so every branch starts from identical tokens and vLLM can
compute them once. A branch is the start of the assistant's answer for one field
(`name:`); its option codes are chosen so that each is exactly one token *in that context*.
Only a tokenizer is needed here: this module knows nothing of vLLM or HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from vllm_pcd.schema import FieldSpec, Limits, SchemaError, SchemaSpec

# Code alphabets tried in order for enum fields; each code is written after "name:" with a space.
_ENUM_ALPHABETS: tuple[tuple[str, ...], ...] = (
    tuple(" " + chr(c) for c in range(ord("A"), ord("Z") + 1)),
    tuple(" " + chr(c) for c in range(ord("a"), ord("z") + 1)),
    tuple(f" {d}" for d in range(10)) + tuple(f" {d}" for d in range(10, 100)),
)
# Booleans answer with the model's natural words when they are single tokens.
_BOOLEAN_ALPHABETS: tuple[tuple[str, str], ...] = ((" true", " false"), (" yes", " no"),
                                                   (" A", " B"))

INSTRUCTION_HEADER = ("Answer about the conversation above. For each field below, choose "
                      "exactly one option and answer with its code.")


class Tokenizer(Protocol):
    """The slice of a Hugging Face tokenizer the planner needs."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class FieldPlan:
    field: FieldSpec
    suffix_ids: tuple[int, ...]  # the branch's own tokens, after the shared context
    codes: tuple[str, ...]       # code text per option, in schema order
    code_ids: tuple[int, ...]    # the single token each code adds in context


@dataclass(frozen=True)
class Plan:
    shared_ids: tuple[int, ...]
    fields: tuple[FieldPlan, ...]

    def branch_ids(self, index: int) -> list[int]:
        return [*self.shared_ids, *self.fields[index].suffix_ids]

    @property
    def branch_tokens(self) -> int:
        return sum(len(f.suffix_ids) for f in self.fields)


def _option_label(field: FieldSpec, code: str, option: Any) -> str:
    value = "true" if option is True else "false" if option is False else option
    return value if field.kind == "boolean" and code.strip() == value else f"{code.strip()} = {value}"


def instruction_text(fields: Sequence[tuple[FieldSpec, Sequence[str]]]) -> str:
    """The field list appended to the conversation; shared by every branch."""
    lines = [INSTRUCTION_HEADER]
    for field, codes in fields:
        about = f" ({field.description})" if field.description else ""
        options = ", ".join(_option_label(field, c, o) for c, o in zip(codes, field.options))
        lines.append(f"- {field.name}{about}: {options}")
    return "\n".join(lines)


def branch_text(field: FieldSpec) -> str:
    return f"{field.name}:"


def _codes_in_context(tokenizer: Tokenizer, prefix: str, codes: Sequence[str]) -> list[int] | None:
    """Each code's single token after `prefix`, or None if any code splits or two collide."""
    base = tokenizer.encode(prefix, add_special_tokens=False)
    ids = []
    for code in codes:
        full = tokenizer.encode(prefix + code, add_special_tokens=False)
        if len(full) != len(base) + 1 or full[: len(base)] != base:
            return None
        ids.append(full[-1])
    return ids if len(set(ids)) == len(ids) else None


def choose_codes(tokenizer: Tokenizer, field: FieldSpec) -> tuple[tuple[str, ...], tuple[int, ...]]:
    alphabets = _BOOLEAN_ALPHABETS if field.kind == "boolean" else _ENUM_ALPHABETS
    prefix = branch_text(field)
    for alphabet in alphabets:
        if len(alphabet) < len(field.options):
            continue
        codes = tuple(alphabet[: len(field.options)])
        ids = _codes_in_context(tokenizer, prefix, codes)
        if ids is not None:
            return codes, tuple(ids)
    raise SchemaError(f"pcd_schema.properties.{field.name}: no alphabet of single-token option "
                      f"codes fits {len(field.options)} options with this tokenizer; use "
                      '"x-pcd-mode": "sequence" for this field',
                      param=f"pcd_schema.properties.{field.name}", rule="codes")


def with_instruction(messages: list[dict[str, Any]], instruction: str) -> list[dict[str, Any]]:
    """Append the field list to the last user turn (or add one), keeping roles alternating."""
    messages = [dict(m) for m in messages]
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "user" and isinstance(last.get("content"), str):
        last["content"] = f"{last['content']}\n\n{instruction}"
    else:
        messages.append({"role": "user", "content": instruction})
    return messages


def render_ids(tokenizer: Tokenizer, messages: list[dict[str, Any]],
               template_kwargs: dict[str, Any] | None = None,
               chat_template: str | None = None) -> list[int]:
    """The model's own chat template, thinking off, up to the start of the assistant's reply."""
    kwargs = {**(template_kwargs or {}), "enable_thinking": False}
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                         chat_template=chat_template, **kwargs)
    # The template writes any BOS itself; adding special tokens again would double it.
    return tokenizer.encode(text, add_special_tokens=False)


def build_plan(tokenizer: Tokenizer, schema: SchemaSpec, messages: list[dict[str, Any]],
               limits: Limits = Limits(), template_kwargs: dict[str, Any] | None = None,
               chat_template: str | None = None) -> Plan:
    coded = [(field, *choose_codes(tokenizer, field)) for field in schema.fields]
    instruction = instruction_text([(field, codes) for field, codes, _ in coded])
    shared = render_ids(tokenizer, with_instruction(messages, instruction), template_kwargs,
                        chat_template)
    fields = tuple(
        FieldPlan(field, tuple(tokenizer.encode(branch_text(field), add_special_tokens=False)),
                  codes, ids)
        for field, codes, ids in coded)
    plan = Plan(tuple(shared), fields)
    total = len(plan.shared_ids) + max(len(f.suffix_ids) + 1 for f in fields)
    if total > limits.max_prompt_tokens:
        raise SchemaError(f"the prompt needs {total} tokens with the rendered schema; the limit "
                          f"is {limits.max_prompt_tokens}", param="messages",
                          rule="max_prompt_tokens")
    return plan
