"""Which option a field answers, given its options' scores.

`most_probable` answers the value the model gives the most probability. `greedy` answers
as a left-to-right decoder under the same constraint would: where values share leading tokens
(`search_screening_event`, `search_creative_work`, `get_weather`), it first takes the token
whose values together hold the most probability, then chooses among those. The two differ
only where a shared token's mass is split among the values that continue it; on the restricted
LM head each trie node is renormalised over its children, so a group's mass is exactly that
token's probability and `greedy` is the constrained greedy path token for token.
"""

from __future__ import annotations

import math
from typing import Callable, Hashable, Iterable, Sequence

Path = Sequence[Hashable]  # an option's tokens (any shared stem included)


def most_probable(scores: Sequence[float], paths: Sequence[Path]) -> int:
    """The highest score; `max` keeps the first of equal scores, so ties go to schema order."""
    return max(range(len(scores)), key=scores.__getitem__)


def greedy(scores: Sequence[float], paths: Sequence[Path]) -> int:
    """Token by token, the group of options whose summed probability is the largest (ties
    to the group holding the earlier option). Without paths (one token per option) it is
    `most_probable`."""
    if not paths:
        return most_probable(scores, paths)
    alive = list(range(len(scores)))
    for depth in range(max(len(p) for p in paths)):
        if len(alive) == 1:
            break
        groups: dict[Hashable, list[int]] = {}
        for i in alive:
            groups.setdefault(paths[i][depth] if depth < len(paths[i]) else None, []).append(i)
        alive = max(groups.values(),
                    key=lambda group: (mass(scores[i] for i in group), -group[0]))
    # Identical paths cannot reach here (plans refuse them); keep the order rule anyway.
    return max(alive, key=scores.__getitem__)


def mass(logprobs: Iterable[float]) -> float:
    return sum(math.exp(lp) for lp in logprobs)


DECISIONS: dict[str, Callable[[Sequence[float], Sequence[Path]], int]] = {
    "most_probable": most_probable, "greedy": greedy}
