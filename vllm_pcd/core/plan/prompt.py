"""How a schema is posed to the model: the field list, where it goes, and the rendered prompt.

The field list is given with the conversation (after it, or schema-first in a system turn)
and rendered by the model's own chat template, thinking off, up to the assistant's turn.
A formulation says how each field's answer starts and what of it is scored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from vllm_pcd.core.schema import FieldSpec, Limits, SchemaError, measure, shown
from vllm_pcd.core.plan.sequence import serialize

JSON_HEADER = ("Answer about the conversation above with a JSON object that has exactly the "
               "fields below, each set to one of the values listed for it.")
CODES_HEADER = ("Answer about the conversation above. For each field below, choose exactly one "
                "option; where options have codes, answer with the code.")
RESTATEMENT = "Now answer the fields listed before the conversation ({names}) about it."
RECAP = "Now answer the fields listed before the conversation about it."
NEXT_IN_OBJECT = "json"  # a terminator: what follows the value in the object (`,` or `}`)


@dataclass(frozen=True)
class Formulation:
    """How a token-mode field is posed and what is scored. `json*`: the model continues its
    own JSON object (`{"name": ` then the value it would write), each value scored up to
    `boolean_end` / `enum_end` (None: its unique prefix; NEXT_IN_OBJECT: the whole value and
    the character that follows it in the object). `codes`: per-field questions answered
    with single-token option codes. `raw` (guided choice): the reply is the value's own
    text, with no stem and no JSON quoting."""

    name: str
    header: str
    json_stem: bool
    boolean_end: str | None = None
    enum_end: str | None = None
    space: str = " "  # between the key's colon and the value
    raw: bool = False
    indent: str = ""  # one level of an indented object's keys ("": the object on one line)

    @classmethod
    def named(cls, name: str) -> Formulation:
        return _FORMULATIONS_BY_NAME[name]

    @property
    def codes(self) -> bool:
        """Token-mode fields answer with single-token option codes, not their values."""
        return not self.json_stem and not self.raw

    @property
    def opening(self) -> str:
        return self.opening_at(1)

    def opening_at(self, depth: int) -> str:
        """What opens an object nested `depth` deep up to its first key: `{`, or `{` and a
        line indented `depth` levels."""
        return "{\n" + self.indent * depth if self.indent else "{"

    @property
    def between(self) -> str:
        """What follows a value's comma before the next key."""
        return "\n" + self.indent if self.indent else self.space

    def stem(self, field: FieldSpec) -> str:
        """The start of the assistant's answer for one field: `{"a": {"b":` for a nested
        field, `name:` for codes, nothing where the reply is the value itself."""
        if self.raw:
            return ""
        if self.json_stem:
            levels = [self.opening_at(depth) + json.dumps(key, ensure_ascii=False)
                      for depth, key in enumerate(field.keys, start=1)]
            return (":" + self.space).join(levels) + ":"
        return f"{field.name}:"

    def value_end(self, field: FieldSpec, beside: int, before: int) -> str | None:
        """What a token-mode value is scored up to (None: its unique prefix). `beside`: the
        keys of the object that holds the field's value; `before`: the keys the branch writes
        ahead of this one. A field whose values are text prefixes of each other (`1` and `10`)
        is scored whole, up to what follows it."""
        end = self.boolean_end if field.kind == "boolean" else self.enum_end
        if end is None and raw_prefixes([serialize(o, "", "") for o in field.options]):
            end = NEXT_IN_OBJECT
        if end == NEXT_IN_OBJECT:  # the object closes after its last key (on a line of its own)
            return "," if beside > before + 1 else "\n" if self.indent else "}"
        return end


FORMULATIONS = (
    Formulation("json", JSON_HEADER, True, boolean_end="\n"),
    Formulation("json_next", JSON_HEADER, True, NEXT_IN_OBJECT, NEXT_IN_OBJECT),
    Formulation("json_prefix", JSON_HEADER, True),
    # as compact JSON writes it (and AR JSON under `disable_any_whitespace`): `{"name":true`
    Formulation("json_tight", JSON_HEADER, True, space=""),
    # as instruction models write it (and AR JSON did here): `{\n  "name": ` on its own line
    Formulation("json_indented", JSON_HEADER, True, indent="  "),
    Formulation("codes", CODES_HEADER, False),
    Formulation("choice", JSON_HEADER, False, space="", raw=True),
)
_FORMULATIONS_BY_NAME = {f.name: f for f in FORMULATIONS}


@dataclass(frozen=True)
class Layout:
    """Where the field list goes. After the conversation (in its last user turn), or
    `schema_first`: before it in a system turn, so that documents asked the same schema share
    its tokens (and their KV). A schema-first layout may add one line after the conversation
    (`after`): `restated` names the fields again, so the model reads the question after the
    text as well and the list stays shared; `recap` says the same in one fixed line that
    names no field, so what it adds to each document does not grow with the schema; `auto`
    restates a lone field by name and recaps two or more (each read better there: README,
    Accuracy). `bare` adds nothing: the conversation as the client sent it, for clients that
    wrote their prompt for vLLM's own grammar decoding (structured outputs), which shows the
    model no schema."""

    name: str
    schema_first: bool = False
    after: str | None = None  # None, "restated", "recap" or "auto"
    bare: bool = False

    @classmethod
    def named(cls, name: str) -> Layout:
        return _LAYOUTS_BY_NAME[name]

    def header(self, header: str) -> str:
        """A formulation's header, pointing where the conversation is."""
        if self.schema_first:
            return header.replace("the conversation above", "the conversation that follows")
        return header

    def with_instruction(self, messages: list[dict[str, Any]], instruction: str,
                         names: Sequence[str] = ()) -> list[dict[str, Any]]:
        """The conversation with the field list (`instruction`) placed as this layout says;
        `names` are the fields a restatement names."""
        messages = [dict(m) for m in messages]
        if self.bare:
            return messages
        if not self.schema_first:
            return _after_the_conversation(messages, instruction)
        first = messages[0] if messages else None
        if first is not None and first.get("role") == "system" \
                and isinstance(first.get("content"), str):
            first["content"] = f"{instruction}\n\n{first['content']}"
        else:
            messages.insert(0, {"role": "system", "content": instruction})
        after = self.after
        if after == "auto":
            after = "restated" if len(names) == 1 else "recap"
        if after == "restated":
            return _after_the_conversation(messages, RESTATEMENT.format(names=", ".join(names)))
        if after == "recap":
            return _after_the_conversation(messages, RECAP)
        return messages


LAYOUTS = (
    Layout("document_first"),
    Layout("schema_first", schema_first=True),
    Layout("schema_first_restated", schema_first=True, after="restated"),
    Layout("schema_first_recap", schema_first=True, after="recap"),
    Layout("schema_first_auto", schema_first=True, after="auto"),
    Layout("bare", bare=True),
)
_LAYOUTS_BY_NAME = {layout.name: layout for layout in LAYOUTS}
FORMULATION_NAMES = tuple(_FORMULATIONS_BY_NAME)
LAYOUT_NAMES = tuple(_LAYOUTS_BY_NAME)
# Picked on the public tasks (benchmarks.evaluate, Qwen2.5-Coder-1.5B, 900 cases): unique
# prefixes 60.9% field accuracy, the newline terminator 56.5% (it leans to `false` there:
# 21% `true` against 49% in the gold, though it won on the dev set it was tuned on), whole
# values with the object's next character 60.0%; AR JSON 61.2%. It is also the cheapest: one
# request per field, on the restricted head.
DEFAULT_FORMULATION = "json_prefix"
# The field list first, so documents asked the same schema share its KV (the prefix cache),
# then one line after the document: the lone field named again, or for two or more fields a
# fixed recap. Chosen by the README's rules on data nothing was tuned on (Qwen2.5-Coder-1.5B):
# naming one field won on entailed_polarity and sentence_ambiguity (+3.2 [+0.6, +6.4] over the
# list alone); the recap won on two multi-field sets (+4.3 [+2.3, +6.7] over naming them all)
# and again on fresh cases of them (+2.3 [+0.2, +4.5]), where naming one field beat it.
DEFAULT_LAYOUT = "schema_first_auto"


class Tokenizer(Protocol):
    """The slice of a Hugging Face tokenizer the planner needs."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


def _option_label(field: FieldSpec, code: str | None, option: Any) -> str:
    if code is None:
        return serialize(option).strip()
    value = "true" if option is True else "false" if option is False else option
    return value if field.kind == "boolean" and code.strip() == value else f"{code.strip()} = {value}"


def instruction_text(fields: Sequence[tuple[FieldSpec, Sequence[str] | None]],
                     formulation: Formulation, layout: Layout) -> str:
    """The field list given with the conversation; shared by every branch. Fields with codes
    show them; the others (codes None) show their JSON values."""
    lines = [layout.header(formulation.header)]
    for field, codes in fields:
        about = f" ({field.description})" if field.description else ""
        shown_codes = codes if codes is not None else [None] * len(field.options)
        options = ", ".join(_option_label(field, c, o) for c, o in zip(shown_codes, field.options))
        lines.append(f"- {field.name}{about}: {options}")
    return "\n".join(lines)


def raw_prefixes(choices: Sequence[str]) -> bool:
    """Whether one choice's text starts another's. In sorted order a text that starts
    another also starts the one right after it, so neighbours suffice (n log n)."""
    ordered = sorted(set(choices))
    return any(b.startswith(a) for a, b in zip(ordered, ordered[1:]))


def _after_the_conversation(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "user" and isinstance(last.get("content"), str):
        last["content"] = f"{last['content']}\n\n{text}"
    else:
        messages.append({"role": "user", "content": text})
    return messages


# Arguments PCD itself gives the template call, or that would change what it returns; a
# request may not set them (vLLM's chat route refuses `chat_template` and `tokenize` too).
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "add_generation_prompt", "continue_final_message", "tokenize",
    "chat_template", "return_dict", "return_tensors", "return_assistant_tokens_mask",
    "tokenizer_kwargs", "padding", "truncation", "max_length", "tools"})


def check_template_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request's remaining `chat_template_kwargs`, refused if they collide with PCD's own
    arguments. Thinking stays off: `enable_thinking` may only repeat that."""
    for key, value in kwargs.items():
        if not isinstance(key, str) or key in RESERVED_TEMPLATE_KWARGS:
            raise SchemaError(f"chat_template_kwargs.{shown(key)} is set by PCD and cannot "
                              "be given with pcd_schema", param=f"chat_template_kwargs.{shown(key)}",
                              rule="reserved_template_kwarg")
        if key == "enable_thinking" and value is not False:
            raise SchemaError("chat_template_kwargs.enable_thinking: PCD renders with thinking "
                              "off", param="chat_template_kwargs.enable_thinking",
                              rule="reserved_template_kwarg")
    return kwargs


def render_text(tokenizer: Tokenizer, messages: list[dict[str, Any]],
                template_kwargs: dict[str, Any] | None = None,
                chat_template: str | None = None) -> str:
    """The model's own chat template, thinking off, up to the start of the assistant's reply.
    A template that fails on this request's input is the request's fault (HTTP 400)."""
    kwargs = {**check_template_kwargs(dict(template_kwargs or {})), "enable_thinking": False}
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=False, chat_template=chat_template,
                                             **kwargs)
    except Exception as err:  # a Jinja error, or a template raising on the request's input
        raise SchemaError(f"the chat template failed on this request: {shown(str(err))}",
                          param="chat_template_kwargs", rule="chat_template") from err
    if not isinstance(text, str):
        raise SchemaError("the chat template did not render text", param="chat_template_kwargs",
                          rule="chat_template")
    return text


def check_conversation(messages: Sequence[Any], limits: Limits) -> None:
    """Bounds a conversation before it is rendered: messages, and characters of text (every
    string in every message, so any content shape counts), read once without recursion; a
    lone surrogate, which no tokenizer encodes, is refused by where it is."""
    if len(messages) > limits.max_messages:
        raise SchemaError(f"messages: {len(messages)} messages; the limit is "
                          f"{limits.max_messages} (limits.max_messages)", param="messages",
                          rule="max_messages")
    try:
        measure(list(messages), "messages", max_nodes=limits.prompt_chars + len(messages),
                max_chars=limits.prompt_chars)
    except SchemaError as err:
        if err.rule != "size":
            raise
        raise SchemaError(f"messages: more than {limits.prompt_chars} characters of text, the "
                          "limit (limits.max_prompt_chars)", param="messages",
                          rule="max_prompt_chars") from None
