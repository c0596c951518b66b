"""The tokens each continuation adds to one rendered text, at a cost linear in the text.

Every branch's tokens are cut from the tokenization of the whole text the model reads
(context + continuation), never tokenized on their own: a SentencePiece dummy prefix or a
merge across the boundary would make them differ. Tokenizing the whole text once per
continuation costs length × continuations, so a long document with many fields would hold
the planner for seconds. Tokenizers split the text at their added tokens (the chat template's
`<|im_start|>`) and tokenize the pieces independently, so the text is cut at the last one:
the head before it is tokenized once, and each continuation only with the short tail after
it. The cut is kept only where the head and tail together give the context's own tokens;
otherwise (a tokenizer with no added tokens, or one that strips around them) every
continuation is tokenized with the whole text, as before.
"""

from __future__ import annotations

import functools
from array import array
from typing import Any, Callable, Sequence

from vllm_pcd.core.plan.sequence import common_prefix


class Cancelled(Exception):
    """The caller gave up (timeout, disconnect): planning stops between continuations."""


def _added_tokens(tokenizer: Any) -> list[str]:
    named = set(getattr(tokenizer, "all_special_tokens", None) or ())
    added = getattr(tokenizer, "get_added_vocab", None)
    if callable(added):
        named |= set(added())
    return [t for t in named if isinstance(t, str) and t]


# The tails (the assistant's header and a continuation) repeat across documents asked the same
# schema, so their tokens are kept: up to TAILS_KEPT texts of at most TAIL_CHARS characters,
# as packed arrays (a few MB at most, whatever clients send).
TAILS_KEPT = 4096
TAIL_CHARS = 512


@functools.lru_cache(maxsize=TAILS_KEPT)
def _kept_tail(tokenizer: Any, text: str) -> array:
    return array("q", tokenizer.encode(text, add_special_tokens=False))


def tail_ids(tokenizer: Any, text: str) -> list[int]:
    """`text`'s tokens, from the cache where it is a short tail and the tokenizer hashable."""
    try:
        if len(text) <= TAIL_CHARS:
            return list(_kept_tail(tokenizer, text))
    except TypeError:  # an unhashable tokenizer
        pass
    return tokenizer.encode(text, add_special_tokens=False)


def split_tail(tokenizer: Any, text: str, context: Sequence[int]) -> tuple[list[int], str]:
    """(head ids, tail text): the context's tokens before its last added token, and the text
    from that token on, such that head + tokens(tail) == `context`. ([], text) when no such
    cut exists."""
    cut = max((text.rfind(t) for t in _added_tokens(tokenizer)), default=-1)
    if cut <= 0:
        return [], text
    head = tokenizer.encode(text[:cut], add_special_tokens=False)
    tail = tail_ids(tokenizer, text[cut:])
    if head + tail != list(context):
        return [], text
    return head, text[cut:]


class InContext:
    """The shared context is the longest token prefix every whole text keeps, and it may run
    past the rendered text: tokens every branch begins with (the `{"` that opens each JSON
    stem) are then computed once, in the prefill, instead of once per branch. Each group is
    one field's continuations, its stem first; the shared context stops short of the last
    token a stem shares with each of its values, so that every branch and every value still
    adds a token of its own."""

    def __init__(self, tokenizer: Any, text: str, groups: Sequence[Sequence[str]],
                 context: Sequence[int] | None = None,
                 cancelled: Callable[[], bool] = lambda: False):
        # The template writes any BOS itself; adding special tokens again would double it.
        if context is None:
            context = tokenizer.encode(text, add_special_tokens=False)
        head, tail_text = split_tail(tokenizer, text, context)
        base = len(head)
        tails = {}
        for group in groups:
            if cancelled():
                raise Cancelled()
            for c in group:
                tails[c] = tail_ids(tokenizer, tail_text + c) if base \
                    else tokenizer.encode(tail_text + c, add_special_tokens=False)
        own_context = list(context[base:])
        first = next(iter(tails.values()))
        agreed = min(common_prefix(first, ids) for ids in tails.values())
        keep = min(len(own_context), common_prefix(own_context, first), agreed)
        if keep == len(own_context):
            own = [common_prefix(tails[group[0]], tails[c]) - 1
                   for group in groups for c in group[1:]]
            keep = max(keep, min([agreed, *own, *(len(ids) - 1 for ids in tails.values())]))
        self.shared_ids = tuple(head) + tuple(first[:keep])
        self._added = {c: tuple(ids[keep:]) for c, ids in tails.items()}

    def __call__(self, continuation: str) -> tuple[int, ...]:
        return self._added[continuation]
