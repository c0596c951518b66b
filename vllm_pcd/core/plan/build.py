"""schema + conversation → token-level plan: the shared context and short branches per field.

The shared context is the conversation plus the field list, rendered by the model's own chat
template up to the assistant's turn, so every branch starts from identical tokens and vLLM can
compute them once. A branch is the start of the assistant's answer for one field (`{"name":` or `name:`).
Every branch's tokens are cut from the tokenization of the whole text the model reads
(`InContext`), never tokenized on their own. In token mode option codes are each exactly one
token in that context; values (`sequence`) are scored whole or up to their unique
prefix, as the formulation says.
The plan also decides, per scoring request, whether the LM head may be projected onto its
token ids only (`Scoring.restricted`).
Only a tokenizer is needed here: this module knows nothing of vLLM or HTTP.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Sequence

from vllm_pcd.core import scoring
from vllm_pcd.core.plan.conditioning import (Answered, check, conditions, fork_reads, round_fields,
                                             rounds_needed, written)
from vllm_pcd.core.plan.in_context import InContext
from vllm_pcd.core.plan.options import Options
from vllm_pcd.core.plan.prompt import (Formulation, Tokenizer, check_conversation,
                                       instruction_text, raw_prefixes, render_text)
from vllm_pcd.core.plan.sequence import SequenceFieldPlan, build_sequence_field, candidate_texts
from vllm_pcd.core.schema import FieldSpec, Limits, SchemaError, SchemaSpec
from vllm_pcd.core.scoring import FieldResult, RequestReport

# Code alphabets tried in order for enum fields; each code is written after "name:" with a space.
_ENUM_ALPHABETS: tuple[tuple[str, ...], ...] = (
    tuple(" " + chr(c) for c in range(ord("A"), ord("Z") + 1)),
    tuple(" " + chr(c) for c in range(ord("a"), ord("z") + 1)),
    tuple(f" {d}" for d in range(10)) + tuple(f" {d}" for d in range(10, 100)),
)
# Codes are chosen where they are written: after `name:` (the codes formulation's stem).
_CODES = Formulation.named("codes")
# Booleans answer with the model's natural words when they are single tokens.
_BOOLEAN_ALPHABETS: tuple[tuple[str, str], ...] = ((" true", " false"), (" yes", " no"),
                                                   (" A", " B"))


@dataclass(frozen=True)
class FieldPlan:
    """A token-mode field: one branch, one next-token distribution over its codes."""

    field: FieldSpec
    suffix_ids: tuple[int, ...]  # the branch's own tokens, after the shared context
    codes: tuple[str, ...]       # code text per option, in schema order
    code_ids: tuple[int, ...]    # the single token each code adds in context
    mode: ClassVar[str] = "token"

    def score(self, reports: Sequence[RequestReport], normalization: str) -> FieldResult:
        return scoring.token_field(self.field, self.codes, self.code_ids, reports[0])


@dataclass(frozen=True)
class ConstantFieldPlan:
    """A field with one allowed value (`const`): answered without asking the engine."""

    field: FieldSpec
    mode: ClassVar[str] = "token"

    def score(self, reports: Sequence[RequestReport], normalization: str) -> FieldResult:
        return scoring.field_result(self.field, [0.0], {"mode": "constant"})


AnyFieldPlan = FieldPlan | SequenceFieldPlan | ConstantFieldPlan


@dataclass(frozen=True)
class Scoring:
    """One engine request: the branch tokens after the shared context, and the tokens whose
    log-probabilities are wanted at the next position."""

    field_index: int
    suffix_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    units: int  # branches (token fields) or candidates (sequence) it completes
    parent: int | None = None  # the scoring whose prompt is this one's minus its last token
    # The LM head may project onto `token_ids` only: the field's scores are renormalised over
    # exactly these ids at one position, and the caller does not want the mass outside them.
    restricted: bool = False


@dataclass(frozen=True)
class Plan:
    shared_ids: tuple[int, ...]
    fields: tuple[AnyFieldPlan, ...]
    scorings: tuple[Scoring, ...]  # every engine request after the shared context, in order
    # Conditioned calls (`conditioning`): per request (the shared context's, then each
    # scoring's) the earlier prompt lengths it forks from, and whether a later round will
    # fork from this round's prompts.
    reads: tuple[tuple[int, ...], ...] = ()
    leaves: bool = False
    # Whether one request computes the shared context before the branches. A later round
    # with one request computes its part of it itself, in its own step.
    context: bool = True

    def branch_ids(self, index: int) -> list[int]:
        """The whole prompt of token-mode field `index`'s branch."""
        fp = self.fields[index]
        if not isinstance(fp, FieldPlan):
            raise TypeError(f"{fp.field.name} is a sequence-mode field: it has one branch per "
                            "trie node, see scorings")
        return [*self.shared_ids, *fp.suffix_ids]

    def prompts(self) -> tuple[tuple[int, ...], ...]:
        """Every request's prompt: the shared context's, then each scoring's."""
        return (self.shared_ids, *(self.shared_ids + s.suffix_ids for s in self.scorings))

    @property
    def branch_tokens(self) -> int:
        """Distinct token positions the branches add to the shared context: the least any
        execution must compute beyond it."""
        positions = {(s.field_index, s.suffix_ids[:j + 1])
                     for s in self.scorings for j in range(len(s.suffix_ids))}
        return len(positions)

    @property
    def ideal_tokens(self) -> int:
        """The least any execution of this plan must compute: the shared context and the
        branch positions, less what the earlier rounds it forks from computed (`reads`)."""
        shared = len(self.shared_ids)
        covered = [max(r, default=0) for r in self.reads] or [0] * (1 + len(self.scorings))
        if not self.context:  # one request: its whole prompt, less what it forks
            return sum(len(p) - cover for p, cover in zip(self.prompts()[1:], covered[1:]))
        positions = {(s.field_index, s.suffix_ids[:j + 1])
                     for s, cover in zip(self.scorings, covered[1:])
                     for j in range(len(s.suffix_ids)) if shared + j + 1 > cover}
        return max(0, shared - covered[0]) + len(positions)

    def kv_blocks(self, block_size: int, held: int = 0) -> tuple[int, int]:
        """KV blocks the engine allocates to run this plan when its first `held` tokens are
        already cached: (the shared context's past those, its requests'). A request claims
        the blocks from the last whole one it forks (a forked tail block is copied, not
        shared); an upper bound, as a chained trie node forks its parent's longer prompt."""
        def blocks(tokens: int) -> int:
            return -(-tokens // block_size)

        shared = len(self.shared_ids)
        context = max(0, blocks(shared) - held // block_size) if self.context else 0
        forked = (shared if self.context else 0) // block_size
        return context, sum(blocks(shared + len(s.suffix_ids)) - forked for s in self.scorings)


def scorings_of(fields: Sequence[AnyFieldPlan], full_vocabulary: bool) -> tuple[Scoring, ...]:
    """The engine requests of `fields`. A token-mode field scored by one request may use the
    restricted head; sequence-mode and multi-node fields need full-vocabulary
    log-probabilities, and so does every field when the caller wants the mass outside the
    options (`full_vocabulary`)."""
    out: list[Scoring] = []
    for i, fp in enumerate(fields):
        if isinstance(fp, ConstantFieldPlan):
            continue
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
    requests = Counter(s.field_index for s in out)
    token_mode = [not isinstance(fp, SequenceFieldPlan) or fp.mode == "token" for fp in fields]
    return tuple(replace(s, restricted=not full_vocabulary and requests[s.field_index] == 1
                         and token_mode[s.field_index]) for s in out)


def _check_formulation(schema: SchemaSpec, formulation: Formulation) -> None:
    """A `raw` reply (guided choice) is one value's own text: one field of strings, none the
    start of another (with nothing after the reply to tell them apart)."""
    if not formulation.raw:
        return
    options = schema.fields[0].options if len(schema.fields) == 1 else (None,)
    if not all(isinstance(o, str) for o in options) or raw_prefixes(options):
        raise SchemaError(f"pcd_formulation {formulation.name} answers one field of string values, "
                          "none of which starts another", param="pcd_formulation",
                          rule="formulation")


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
    prefix = _CODES.stem(field)
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


def keys_beside(schema: SchemaSpec, field: FieldSpec) -> int:
    """How many keys the object that holds `field`'s value has (a label set's decisions are
    written as an object of its labels)."""
    parent = field.keys[:-1]
    return len({f.keys[len(parent)] for f in schema.fields if f.keys[:len(parent)] == parent})


@dataclass(frozen=True)
class _FieldText:
    """A field's plan before tokenization: its mode, stem, terminator and any codes."""

    field: FieldSpec
    mode: str
    stem: str
    terminator: str | None
    codes: tuple[str, ...] | None
    space: str = " "
    raw: bool = False

    def continuations(self) -> list[str]:
        if self.codes is not None:
            return [self.stem, *(self.stem + code for code in self.codes)]
        return candidate_texts(self.field, self.stem, self.terminator, self.space, self.raw)


def _field_text(tokenizer: Tokenizer, field: FieldSpec, mode: str, formulation: Formulation,
                beside: int, read: Sequence[tuple[FieldSpec, Any]] = ()) -> _FieldText:
    """`read`: the fields (and chosen values) the branch writes before this one's key."""
    stem = formulation.stem(field)
    if mode == "token" and formulation.codes:
        return _FieldText(field, mode, stem, None, choose_codes(tokenizer, field)[0])
    if read:  # json stems: `{"name":` becomes `{"a": true, "name":`
        head = formulation.opening
        stem = head + written(read, formulation.space, formulation.between) + stem[len(head):]
    terminator = ("\n" if mode == "sequence"
                  else formulation.value_end(field, beside, len(read)))
    return _FieldText(field, mode, stem, terminator, None, formulation.space, formulation.raw)


def _field_plan(encode: InContext, text: _FieldText, limits: Limits) -> AnyFieldPlan:
    """A token-mode field's plan: single-token codes, or values scored up to their unique
    prefix or whole with a terminator, as its formulation says (`Formulation.value_end`)."""
    field = text.field
    if len(field.options) == 1:
        return ConstantFieldPlan(field)
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
                                    terminator=text.terminator, space=text.space, raw=text.raw)
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
               options: Options = Options(), limits: Limits = Limits(),
               template_kwargs: dict[str, Any] | None = None, chat_template: str | None = None,
               cancelled: Callable[[], bool] = lambda: False,
               answered: Answered = Answered()) -> Plan:
    """`options.mode` is the request's default; a field's own `x-pcd-mode` wins. The size
    bounds are checked before the work they bound: characters before rendering, the
    context's tokens before any continuation is tokenized. `cancelled` stops planning early.
    Where fields are conditioned, the plan covers the round after `answered`."""
    check_conversation(messages, limits)
    formulation, layout = options.formulation, options.layout
    check(schema, options)
    _check_formulation(schema, formulation)
    texts = [_field_text(tokenizer, f, f.mode or options.mode, formulation,
                         keys_beside(schema, f)) for f in schema.fields]
    instruction = instruction_text([(t.field, t.codes) for t in texts], formulation, layout)
    rendered = render_text(tokenizer, layout.with_instruction(messages, instruction,
                                                              [t.field.name for t in texts]),
                           template_kwargs, chat_template)
    context = tokenizer.encode(rendered, add_special_tokens=False)
    if len(context) + 1 > limits.max_prompt_tokens:
        raise SchemaError(f"the prompt takes {len(context)} tokens with the rendered schema, "
                          f"before any answer; the limit is {limits.max_prompt_tokens}",
                          param="messages", rule="max_prompt_tokens")
    needs = conditions(schema, options.joint)
    if any(needs) and not answered.values:
        _check_call_requests(tokenizer, rendered, context, texts, schema, options, limits,
                             cancelled)
    now = round_fields(schema, options.joint, answered)
    texts = [_field_text(tokenizer, schema.fields[i], schema.fields[i].mode or options.mode,
                         formulation, keys_beside(schema, schema.fields[i]),
                         [(schema.fields[j], answered.values[schema.fields[j].name])
                          for j in needs[i]]) if needs[i] else texts[i] for i in now]
    encode = InContext(tokenizer, rendered, [t.continuations() for t in texts], context,
                       cancelled)
    fields = tuple(_field_plan(encode, t, limits) for t in texts)
    plan = Plan(encode.shared_ids, fields, scorings_of(fields, options.full_vocabulary))
    _check_requests(1 + len(plan.scorings), limits)  # the shared context, then each scoring
    total = len(plan.shared_ids) + max((len(s.suffix_ids) + 1 for s in plan.scorings), default=0)
    if total > limits.max_prompt_tokens:
        raise SchemaError(f"the prompt needs {total} tokens with the rendered schema; the limit "
                          f"is {limits.max_prompt_tokens}", param="messages",
                          rule="max_prompt_tokens")
    if len(now) + len(answered.values) == len(schema.fields) and not answered.prompts:
        return plan  # one round: nothing to fork from earlier rounds, nothing left for later
    return _conditioned(plan, answered, len(now) + len(answered.values) < len(schema.fields))


def _check_requests(requests: int, limits: Limits) -> None:
    if requests > limits.max_engine_requests:
        raise SchemaError(f"pcd_schema needs {requests} engine requests in this mode; the limit "
                          f"is {limits.max_engine_requests}", param="pcd_schema",
                          rule="max_engine_requests")


def _check_call_requests(tokenizer: Tokenizer, rendered: str, context: list[int],
                         texts: Sequence[_FieldText], schema: SchemaSpec, options: Options,
                         limits: Limits, cancelled: Callable[[], bool]) -> None:
    """A conditioned call's requests over all its rounds, bounded before its first round
    runs: every field's scorings (as if read unconditioned) and one context per round."""
    encode = InContext(tokenizer, rendered, [t.continuations() for t in texts], context,
                       cancelled)
    fields = tuple(_field_plan(encode, t, limits) for t in texts)
    _check_requests(rounds_needed(schema, options.joint)
                    + len(scorings_of(fields, options.full_vocabulary)), limits)


def _conditioned(plan: Plan, answered: Answered, more: bool) -> Plan:
    """A round's plan with the earlier prompts each request forks from, and whether later
    rounds fork from its own."""
    shared = plan.shared_ids
    context = not answered.prompts or len(plan.scorings) > 1
    floor = len(shared) if context else 0  # without a context request, a branch forks it all
    reads = (fork_reads(shared, answered.prompts, 0) if context else (),
             *(fork_reads(shared + s.suffix_ids, answered.prompts, floor)
               for s in plan.scorings))
    return replace(plan, reads=reads, leaves=more, context=context)
