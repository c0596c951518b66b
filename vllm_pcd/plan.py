"""schema + conversation → token-level plan: the shared context and short branches per field.

The shared context is the conversation plus the field list, rendered by the model's own chat
template up to the assistant's turn, so every branch starts from identical tokens and vLLM can
compute them once. A branch is the start of the assistant's answer for one field (`{"name":` or `name:`).
Every branch's tokens are cut from the tokenization of the whole text the model reads
(`InContext`), never tokenized on their own. In token mode option codes are each exactly one
token in that context; values (`vllm_pcd.sequence`) are scored whole or up to their unique
prefix, as the formulation says.
Only a tokenizer is needed here: this module knows nothing of vLLM or HTTP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from vllm_pcd.in_context import InContext
from vllm_pcd.schema import MODES, FieldSpec, Limits, SchemaError, SchemaSpec, shown
from vllm_pcd.sequence import SequenceFieldPlan, build_sequence_field, candidate_texts, serialize

# Code alphabets tried in order for enum fields; each code is written after "name:" with a space.
_ENUM_ALPHABETS: tuple[tuple[str, ...], ...] = (
    tuple(" " + chr(c) for c in range(ord("A"), ord("Z") + 1)),
    tuple(" " + chr(c) for c in range(ord("a"), ord("z") + 1)),
    tuple(f" {d}" for d in range(10)) + tuple(f" {d}" for d in range(10, 100)),
)
# Booleans answer with the model's natural words when they are single tokens.
_BOOLEAN_ALPHABETS: tuple[tuple[str, str], ...] = ((" true", " false"), (" yes", " no"),
                                                   (" A", " B"))

JSON_HEADER = ("Answer about the conversation above with a JSON object that has exactly the "
               "fields below, each set to one of the values listed for it.")
CODES_HEADER = ("Answer about the conversation above. For each field below, choose exactly one "
                "option; where options have codes, answer with the code.")
# Where the field list goes: after the conversation (in its last user turn), or before it in
# a system turn, so that documents asked the same schema share its tokens (and their KV).
LAYOUTS = ("document_first", "schema_first")
NEXT_IN_OBJECT = "json"  # a terminator: what follows the value in the object (`,` or `}`)


@dataclass(frozen=True)
class Formulation:
    """How a token-mode field is posed and what is scored. `json*`: the model continues its
    own JSON object (`{"name": ` then the value it would write), each value scored up to
    `boolean_end` / `enum_end` (None: its unique prefix; NEXT_IN_OBJECT: the whole value and
    the character that follows it in the object). `codes`: per-field questions answered
    with single-token option codes."""

    header: str
    json_stem: bool
    boolean_end: str | None = None
    enum_end: str | None = None
    space: str = " "  # between the key's colon and the value


FORMULATIONS = {
    "json": Formulation(JSON_HEADER, True, boolean_end="\n"),
    "json_next": Formulation(JSON_HEADER, True, NEXT_IN_OBJECT, NEXT_IN_OBJECT),
    "json_prefix": Formulation(JSON_HEADER, True),
    # as compact JSON writes it (and AR JSON under `disable_any_whitespace`): `{"name":true`
    "json_tight": Formulation(JSON_HEADER, True, space=""),
    "codes": Formulation(CODES_HEADER, False),
}
# Picked on the public tasks (benchmarks.evaluate, Qwen2.5-Coder-1.5B, 900 cases): unique
# prefixes 60.9% field accuracy, the newline terminator 56.5% (it leans to `false` there:
# 21% `true` against 49% in the gold, though it won on the dev set it was tuned on), whole
# values with the object's next character 60.0%; AR JSON 61.2%. It is also the cheapest: one
# request per field, on the restricted head.
DEFAULT_FORMULATION = "json_prefix"
# The field list first: documents asked the same schema share its KV (the prefix cache), and on
# the same public tasks it scored +0.6 points [-1.8, +2.9] over document first (+5.6 on dev).
DEFAULT_LAYOUT = "schema_first"


class Tokenizer(Protocol):
    """The slice of a Hugging Face tokenizer the planner needs."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class FieldPlan:
    """A token-mode field: one branch, one next-token distribution over its codes."""

    field: FieldSpec
    suffix_ids: tuple[int, ...]  # the branch's own tokens, after the shared context
    codes: tuple[str, ...]       # code text per option, in schema order
    code_ids: tuple[int, ...]    # the single token each code adds in context


AnyFieldPlan = FieldPlan | SequenceFieldPlan


@dataclass(frozen=True)
class Scoring:
    """One engine request: the branch tokens after the shared context, and the tokens whose
    log-probabilities are wanted at the next position."""

    field_index: int
    suffix_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    units: int  # branches (token fields) or candidates (sequence) it completes
    parent: int | None = None  # the scoring whose prompt is this one's minus its last token


@dataclass(frozen=True)
class Plan:
    shared_ids: tuple[int, ...]
    fields: tuple[AnyFieldPlan, ...]

    def branch_ids(self, index: int) -> list[int]:
        """The whole prompt of token-mode field `index`'s branch."""
        fp = self.fields[index]
        if not isinstance(fp, FieldPlan):
            raise TypeError(f"{fp.field.name} is a sequence-mode field: it has one branch per "
                            "trie node, see scorings()")
        return [*self.shared_ids, *fp.suffix_ids]

    def scorings(self) -> list[Scoring]:
        out = []
        for i, fp in enumerate(self.fields):
            if isinstance(fp, FieldPlan):
                out.append(Scoring(i, fp.suffix_ids, fp.code_ids, 1))
            elif fp.mode == "token":  # one branch, however many trie nodes it needs
                out += [Scoring(i, n.prefix, n.children, int(k == 0))
                        for k, n in enumerate(fp.nodes)]
            else:  # a sequence-mode trie: each node may extend its parent's KV
                first = len(out)
                at = {n.prefix: first + k for k, n in reversed(list(enumerate(fp.nodes)))}
                out += [Scoring(i, n.prefix, n.children, n.units, at.get(n.prefix[:-1]))
                        for n in fp.nodes]
        return out

    @property
    def branch_tokens(self) -> int:
        """Distinct token positions the branches add to the shared context: the least any
        execution must compute beyond it."""
        positions = {(s.field_index, s.suffix_ids[:j + 1])
                     for s in self.scorings() for j in range(len(s.suffix_ids))}
        return len(positions)


def _option_label(field: FieldSpec, code: str | None, option: Any) -> str:
    if code is None:
        return serialize(option).strip()
    value = "true" if option is True else "false" if option is False else option
    return value if field.kind == "boolean" and code.strip() == value else f"{code.strip()} = {value}"


def instruction_text(fields: Sequence[tuple[FieldSpec, Sequence[str] | None]],
                     formulation: str = "codes", layout: str = DEFAULT_LAYOUT) -> str:
    """The field list given with the conversation; shared by every branch. Fields with codes
    show them; the others (codes None) show their JSON values."""
    header = FORMULATIONS[formulation].header
    if layout == "schema_first":
        header = header.replace("the conversation above", "the conversation that follows")
    lines = [header]
    for field, codes in fields:
        about = f" ({field.description})" if field.description else ""
        shown_codes = codes if codes is not None else [None] * len(field.options)
        options = ", ".join(_option_label(field, c, o) for c, o in zip(shown_codes, field.options))
        lines.append(f"- {field.name}{about}: {options}")
    return "\n".join(lines)


def branch_text(field: FieldSpec, formulation: str = "codes") -> str:
    """The start of the assistant's answer for one field: its stem."""
    if FORMULATIONS[formulation].json_stem:
        return "{" + json.dumps(field.name, ensure_ascii=False) + ":"
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


def with_instruction(messages: list[dict[str, Any]], instruction: str,
                     layout: str = DEFAULT_LAYOUT) -> list[dict[str, Any]]:
    """The conversation with the field list: appended to the last user turn (or as a new
    one, keeping roles alternating), or schema-first at the head of the system turn."""
    messages = [dict(m) for m in messages]
    if layout == "schema_first":
        first = messages[0] if messages else None
        if first is not None and first.get("role") == "system" \
                and isinstance(first.get("content"), str):
            first["content"] = f"{instruction}\n\n{first['content']}"
        else:
            messages.insert(0, {"role": "system", "content": instruction})
        return messages
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "user" and isinstance(last.get("content"), str):
        last["content"] = f"{last['content']}\n\n{instruction}"
    else:
        messages.append({"role": "user", "content": instruction})
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
    string in every message, so any content shape counts)."""
    if len(messages) > limits.max_messages:
        raise SchemaError(f"messages: {len(messages)} messages; the limit is "
                          f"{limits.max_messages} (limits.max_messages)", param="messages",
                          rule="max_messages")
    chars = sum(_chars(m) for m in messages)
    if chars > limits.prompt_chars:
        raise SchemaError(f"messages: {chars} characters of text; the limit is "
                          f"{limits.prompt_chars} (limits.max_prompt_chars)", param="messages",
                          rule="max_prompt_chars")


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_chars(v) for v in value)
    return 0


def _value_end(field: FieldSpec, formulation: str, fields: int) -> str | None:
    end = getattr(FORMULATIONS[formulation], f"{field.kind}_end")
    if end == NEXT_IN_OBJECT:  # every branch is posed as the object's first key
        return "," if fields > 1 else "}"
    return end


@dataclass(frozen=True)
class _FieldText:
    """A field's plan before tokenization: its mode, stem, terminator and any codes."""

    field: FieldSpec
    mode: str
    stem: str
    terminator: str | None
    codes: tuple[str, ...] | None
    space: str = " "

    def continuations(self) -> list[str]:
        if self.codes is not None:
            return [self.stem, *(self.stem + code for code in self.codes)]
        return candidate_texts(self.field, self.stem, self.terminator, self.space)


def _field_text(tokenizer: Tokenizer, field: FieldSpec, mode: str, formulation: str,
                fields: int) -> _FieldText:
    stem = branch_text(field, formulation)
    if mode == "token" and formulation == "codes":
        return _FieldText(field, mode, stem, None, choose_codes(tokenizer, field)[0])
    terminator = "\n" if mode == "sequence" else _value_end(field, formulation, fields)
    return _FieldText(field, mode, stem, terminator, None, FORMULATIONS[formulation].space)


def _field_plan(encode: InContext, text: _FieldText, limits: Limits) -> AnyFieldPlan:
    """A token-mode field's plan: single-token codes, or values scored up to their unique
    prefix or whole with a terminator, as its formulation says (`FORMULATIONS`)."""
    field = text.field
    if text.codes is not None:
        suffix = encode(text.stem)
        ids = []
        for code in text.codes:
            added = encode(text.stem + code)
            if len(added) != len(suffix) + 1 or added[:-1] != suffix:
                raise SchemaError(f"pcd_schema.properties.{field.name}: option code {code!r} is "
                                  "not one token in this context; use \"x-pcd-mode\": "
                                  '"sequence" for this field',
                                  param=f"pcd_schema.properties.{field.name}", rule="codes")
            ids.append(added[-1])
        return FieldPlan(field, suffix, text.codes, tuple(ids))
    try:
        plan = build_sequence_field(encode, field, text.stem, mode=text.mode,
                                    terminator=text.terminator, space=text.space)
    except ValueError as err:
        raise SchemaError(f"pcd_schema.properties.{field.name}: {err}",
                          param=f"pcd_schema.properties.{field.name}", rule="candidates")
    for i, option in enumerate(field.options):
        if plan.value_tokens(i) > limits.max_value_tokens:
            raise SchemaError(
                f"pcd_schema.properties.{field.name}.enum[{i}]: the serialized value takes "
                f"{plan.value_tokens(i)} tokens; the limit is {limits.max_value_tokens}",
                param=f"pcd_schema.properties.{field.name}", rule="max_value_tokens")
    return plan


def build_plan(tokenizer: Tokenizer, schema: SchemaSpec, messages: list[dict[str, Any]],
               limits: Limits = Limits(), template_kwargs: dict[str, Any] | None = None,
               chat_template: str | None = None, mode: str = "token",
               formulation: str = DEFAULT_FORMULATION, layout: str = DEFAULT_LAYOUT,
               cancelled: Callable[[], bool] = lambda: False) -> Plan:
    """`mode` is the request's default; a field's own `x-pcd-mode` wins. The size bounds are
    checked before the work they bound: characters before rendering, the context's tokens
    before any continuation is tokenized. `cancelled` stops planning early."""
    if mode not in MODES:
        raise SchemaError(f"pcd_mode must be one of {list(MODES)}", param="pcd_mode", rule="mode")
    if not isinstance(formulation, str) or formulation not in FORMULATIONS:
        raise SchemaError(f"pcd_formulation must be one of {list(FORMULATIONS)}",
                          param="pcd_formulation", rule="formulation")
    if layout not in LAYOUTS:
        raise SchemaError(f"pcd_layout must be one of {list(LAYOUTS)}", param="pcd_layout",
                          rule="layout")
    check_conversation(messages, limits)
    texts = [_field_text(tokenizer, f, f.mode or mode, formulation, len(schema.fields))
             for f in schema.fields]
    instruction = instruction_text([(t.field, t.codes) for t in texts], formulation, layout)
    rendered = render_text(tokenizer, with_instruction(messages, instruction, layout),
                           template_kwargs, chat_template)
    context = tokenizer.encode(rendered, add_special_tokens=False)
    if len(context) + 1 > limits.max_prompt_tokens:
        raise SchemaError(f"the prompt takes {len(context)} tokens with the rendered schema, "
                          f"before any answer; the limit is {limits.max_prompt_tokens}",
                          param="messages", rule="max_prompt_tokens")
    encode = InContext(tokenizer, rendered, [t.continuations() for t in texts], context,
                       cancelled)
    plan = Plan(encode.shared_ids, tuple(_field_plan(encode, t, limits) for t in texts))
    requests = 1 + len(plan.scorings())  # the shared context, then every scoring request
    if requests > limits.max_engine_requests:
        raise SchemaError(f"pcd_schema needs {requests} engine requests in this mode; the limit "
                          f"is {limits.max_engine_requests}", param="pcd_schema",
                          rule="max_engine_requests")
    total = len(plan.shared_ids) + max(len(s.suffix_ids) + 1 for s in plan.scorings())
    if total > limits.max_prompt_tokens:
        raise SchemaError(f"the prompt needs {total} tokens with the rendered schema; the limit "
                          f"is {limits.max_prompt_tokens}", param="messages",
                          rule="max_prompt_tokens")
    return plan
