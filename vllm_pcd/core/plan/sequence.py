"""Candidates as token sequences: scored by full-vocabulary log-likelihood over a trie.

A candidate is its JSON value, written after the field's stem (`name:` or `{"name":`). Its
tokens are cut from the tokenization of the whole text the model reads (context, stem and
value together: `in_context.InContext`), so they are the ones the model would see, whatever merges
or prefix rules apply at the boundaries. The candidates of a field form a token trie: each
internal node is one engine request (the path so far as prompt, one output token) that
returns the log-probabilities of exactly its children, so a token shared by several
candidates is scored once and every node reads the shared context from the KV cache.

With a terminator, whole values are scored and then the text that ends them (sequence mode
always has one). Without, each candidate is scored only up to the token where it becomes
unique among the field's candidates (usually one request with the real first tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from vllm_pcd.core.scoring import FieldResult, Node, RequestReport, trie_field

Encode = Callable[[str], tuple[int, ...]]

# The engine returns log-probabilities for at most this many token ids per request.
MAX_IDS_PER_REQUEST = 128


def serialize(value: Any, terminator: str = "\n", space: str = " ", raw: bool = False) -> str:
    """`space` separates the value from its key's colon; `raw` writes a string as itself."""
    text = value if raw and isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return space + text + terminator


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class SequenceFieldPlan:
    """A field scored over its candidates' token trie (`scoring.trie_field`)."""

    field: Any  # FieldSpec
    mode: str   # "sequence": whole candidates; "token": each up to its unique prefix
    terminator: str | None  # scored after each whole value; None: unique prefixes only
    space: str  # written between the stem and each value
    stem_ids: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...]  # stem + value tokens, jointly tokenized
    score_from: tuple[int, ...]              # first scored position of each candidate
    nodes: tuple[Node, ...]

    @property
    def terminated(self) -> bool:
        return self.terminator is not None

    def value_tokens(self, index: int) -> int:
        return len(self.candidates[index]) - self.score_from[index]

    def score(self, reports: Sequence[RequestReport], normalization: str) -> FieldResult:
        """The field's result from its nodes' reports (one per node, in order)."""
        return trie_field(self.field, self.mode, self.candidates, self.score_from, self.nodes,
                          reports, normalization)


def _unique_prefixes(candidates: Sequence[tuple[int, ...]],
                     starts: Sequence[int]) -> list[tuple[int, ...]]:
    """Each candidate cut after the first token no other candidate shares with it."""
    cut = []
    for seq, start in zip(candidates, starts):
        end = start + 1
        while end < len(seq) and any(o != seq and o[:end] == seq[:end] for o in candidates):
            end += 1
        cut.append(seq[:end])
    return cut


def candidate_texts(field: Any, stem: str, terminator: str | None, space: str = " ",
                    raw: bool = False) -> list[str]:
    """The continuations of the context a field's plan tokenizes: its stem, then each value."""
    return [stem, *(stem + serialize(option, terminator or "", space, raw)
                    for option in field.options)]


def build_sequence_field(encode: Encode, field: Any, stem: str, *, mode: str = "sequence",
                         terminator: str | None = "\n", space: str = " ", raw: bool = False
                         ) -> SequenceFieldPlan:
    """`encode` gives the tokens a continuation of the context adds (see `candidate_texts`).
    Sequence mode always scores whole values and their terminator."""
    if mode == "sequence" and terminator is None:
        terminator = "\n"
    stem_ids, *values = (encode(text) for text in candidate_texts(field, stem, terminator, space,
                                                                       raw))
    candidates, starts = [], []
    for option, ids in zip(field.options, values):
        # Normally the stem's tokens survive intact; if the value merges into the stem's last
        # token, scoring starts where the two tokenizations part.
        start = common_prefix(stem_ids, ids)
        if start == len(ids):
            raise ValueError(f"{field.name}: candidate {option!r} adds no token")
        candidates.append(tuple(ids))
        starts.append(start)
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"{field.name}: two candidates tokenize identically")
    if terminator is None:
        # Tokens every candidate shares add the same log-probability to each: they move no
        # renormalised score, so they join the branch's prompt instead of being scored.
        common = min(common_prefix(candidates[0], c) for c in candidates)
        starts = [max(start, common) for start in starts]
        candidates = _unique_prefixes(candidates, starts)
        if len(set(candidates)) != len(candidates):
            raise ValueError(f"{field.name}: a candidate is a token prefix of another; "
                             "score this field in sequence mode")
    children: dict[tuple[int, ...], dict[int, int]] = {}
    for seq, start in zip(candidates, starts):
        for j in range(start, len(seq)):
            units = children.setdefault(seq[:j], {})
            units[seq[j]] = units.get(seq[j], 0) + (1 if j == len(seq) - 1 else 0)
    nodes = []
    for prefix, kids in children.items():
        ids = sorted(kids)
        for at in range(0, len(ids), MAX_IDS_PER_REQUEST):
            part = ids[at:at + MAX_IDS_PER_REQUEST]
            nodes.append(Node(prefix, tuple(part), sum(kids[t] for t in part)))
    return SequenceFieldPlan(field, mode, terminator, space, tuple(stem_ids), tuple(candidates),
                             tuple(starts), tuple(nodes))
