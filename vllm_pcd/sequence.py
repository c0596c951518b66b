"""Sequence mode: whole serialized candidates scored by full-vocabulary log-likelihood.

A candidate is its JSON value plus a newline terminator, written after the field's stem
(`name:`). The stem and candidate are tokenized together, so the tokens scored are the ones
the model would see, whatever merges happen at the boundary. The candidates of a field form a
token trie: each internal node is one engine request (the path so far as prompt, one output
token) that returns the log-probabilities of exactly its children, so a token shared by
several candidates is scored once and every node reads the shared context from the KV cache.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

NORMALIZATIONS = ("sum", "mean")
# The engine returns log-probabilities for at most this many token ids per request.
MAX_IDS_PER_REQUEST = 128


def serialize(value: Any) -> str:
    return " " + json.dumps(value, ensure_ascii=False) + "\n"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Node:
    """One engine request: the branch tokens so far, and the next tokens to score there."""

    prefix: tuple[int, ...]
    children: tuple[int, ...]
    units: int  # candidates whose last token this node scores (for microbatching)


@dataclass(frozen=True)
class SequenceFieldPlan:
    field: Any  # FieldSpec
    stem_ids: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...]  # stem + value tokens, jointly tokenized
    score_from: tuple[int, ...]              # first scored position of each candidate
    nodes: tuple[Node, ...]

    def value_tokens(self, index: int) -> int:
        return len(self.candidates[index]) - self.score_from[index]

    def candidate_logprobs(self, lookup: Callable[[tuple[int, ...], int], float]) -> list[float]:
        """Summed log-probability of each candidate's tokens, from node results."""
        return [sum(lookup(seq[:j], seq[j]) for j in range(start, len(seq)))
                for seq, start in zip(self.candidates, self.score_from)]

    def scores(self, sums: Sequence[float], normalization: str) -> list[float]:
        if normalization == "sum":
            return list(sums)
        return [s / self.value_tokens(i) for i, s in enumerate(sums)]


def build_sequence_field(tokenizer: Any, field: Any, stem: str) -> SequenceFieldPlan:
    stem_ids = tokenizer.encode(stem, add_special_tokens=False)
    candidates, starts = [], []
    for option in field.options:
        ids = tokenizer.encode(stem + serialize(option), add_special_tokens=False)
        # Normally the stem's tokens survive intact; if the value merges into the stem's last
        # token, scoring starts where the two tokenizations part.
        start = _common_prefix(stem_ids, ids)
        if start == len(ids):
            raise ValueError(f"{field.name}: candidate {option!r} adds no token")
        candidates.append(tuple(ids))
        starts.append(start)
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"{field.name}: two candidates tokenize identically")
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
    return SequenceFieldPlan(field, tuple(stem_ids), tuple(candidates), tuple(starts),
                             tuple(nodes))


def node_lookup(nodes: Sequence[Node],
                results: Sequence[Mapping[int, float]]) -> Callable[[tuple[int, ...], int], float]:
    table = {}
    for node, got in zip(nodes, results):
        for token in node.children:
            if token not in got or math.isnan(got[token]):
                raise RuntimeError(f"engine returned no log-probability for token {token}")
            table[(node.prefix, token)] = got[token]
    return lambda prefix, token: table[(prefix, token)]
