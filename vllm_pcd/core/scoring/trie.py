"""A field scored over its candidates' token trie: each node's report → each value's score.

A sequence-mode field (and a token-mode field whose values share first tokens) asks one engine
request per trie node (`Node`); each returns the log-probabilities of exactly that node's
children. A value's score is the sum over its edges, from the first token where the values'
tokenizations part; `among_children` gives the same sums as a decoder held to the values sees
them, token by token, which a greedy decision walks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from vllm_pcd.core.scoring.execution import RequestReport
from vllm_pcd.core.scoring.field_result import FieldResult
from vllm_pcd.core.scoring.scores import log_sum_exp, sequence_field


@dataclass(frozen=True)
class Node:
    """One engine request: the branch tokens so far, and the next tokens to score there."""

    prefix: tuple[int, ...]
    children: tuple[int, ...]
    units: int  # candidates whose last token this node scores (for microbatching)


Edges = dict[tuple[tuple[int, ...], int], float]  # (node prefix, child token) → log-prob


def edge_logprobs(nodes: Sequence[Node], results: Sequence[Mapping[int, float]]) -> Edges:
    """Each scored edge's log-probability, as its node's request returned it."""
    table = {}
    for node, got in zip(nodes, results):
        for token in node.children:
            if token not in got or math.isnan(got[token]):
                raise RuntimeError(f"engine returned no log-probability for token {token}")
            table[(node.prefix, token)] = got[token]
    return table


def among_children(edges: Edges) -> Edges:
    """Each edge renormalised over its node's children (a prefix's chunks together), as a
    decoder held to the values sees it."""
    siblings: dict[tuple[int, ...], list[float]] = {}
    for (prefix, _), value in edges.items():
        siblings.setdefault(prefix, []).append(value)
    totals = {prefix: log_sum_exp(values) for prefix, values in siblings.items()}
    return {(prefix, t): v - totals[prefix] for (prefix, t), v in edges.items()}


def candidate_logprobs(candidates: Sequence[tuple[int, ...]], score_from: Sequence[int],
                       edges: Edges) -> list[float]:
    """Summed log-probability of each candidate's tokens from `score_from` on."""
    return [sum(edges[(seq[:j], seq[j])] for j in range(start, len(seq)))
            for seq, start in zip(candidates, score_from)]


def trie_field(field: Any, mode: str, candidates: Sequence[tuple[int, ...]],
               score_from: Sequence[int], nodes: Sequence[Node],
               reports: Sequence[RequestReport], normalization: str) -> FieldResult:
    """The field's result from its nodes' reports (one per node, in order)."""
    edges = edge_logprobs(nodes, [r.logprobs for r in reports])
    sums = candidate_logprobs(candidates, score_from, edges)
    stepwise = candidate_logprobs(candidates, score_from, among_children(edges))
    # the first scored position: the nodes with the shortest prefix (one request per chunk)
    root = min(len(n.prefix) for n in nodes)
    first = [n for n in nodes if len(n.prefix) == root]
    return sequence_field(
        field, mode, sums, [len(seq) - start for seq, start in zip(candidates, score_from)],
        normalization, reports, reports[list(nodes).index(first[0])],
        {t for n in first for t in n.children}, candidates, stepwise)
