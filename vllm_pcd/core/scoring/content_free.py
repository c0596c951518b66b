"""Content-free calibration: divide out what the model answers when there is no document.

A model's option probabilities mix evidence from the document with a prior for the options
themselves (their order, their words, `true` over `false`). Asking the same schema about a
content-free document ("N/A") measures that prior; subtracting its log-probabilities from a
document's and renormalising removes it (the "calibrate before use" idea of Zhao et al.,
2021). The prior depends only on the schema and the request's options, never on a document,
so one engine call per schema serves every document asked it: the priors are cached here.
The subtraction itself is `scoring.calibrate`; this module finds the prior.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

from vllm_pcd.core.scoring.field_result import FieldResult
from vllm_pcd.core.scoring.execution import Execution
from vllm_pcd.core.scoring.scores import ScoredPlan, field_results

CONTENT_FREE_TEXT = "N/A"


def content_free_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation's system turns (they belong to every document), then one user turn
    with no content to speak of."""
    return [*(dict(m) for m in messages if m.get("role") == "system"),
            {"role": "user", "content": CONTENT_FREE_TEXT}]


def prior_key(plan: ScoredPlan, normalization: str, cache_salt: str | None) -> Hashable:
    """Everything a prior depends on, as the engine sees it: the content-free plan's tokens
    (schema, options, template, system turns) and the scoring. The tenant's salt keeps one
    tenant from learning, by timing, which schemas another asked."""
    return (cache_salt, normalization, plan.shared_ids,
            tuple((s.field_index, s.suffix_ids, s.token_ids) for s in plan.scorings))


class PriorCache:
    """The most recently used priors, per `prior_key`."""

    def __init__(self, size: int = 1024):
        self.size = size
        self._priors: OrderedDict[Hashable, tuple[FieldResult, ...]] = OrderedDict()

    def get(self, key: Hashable) -> tuple[FieldResult, ...] | None:
        prior = self._priors.get(key)
        if prior is not None:
            self._priors.move_to_end(key)
        return prior

    def put(self, key: Hashable, prior: tuple[FieldResult, ...]) -> None:
        self._priors[key] = prior
        self._priors.move_to_end(key)
        while len(self._priors) > self.size:
            self._priors.popitem(last=False)

    def pending(self, plan: ScoredPlan, normalization: str, cache_salt: str | None) -> PendingPrior:
        """The prior of content-free `plan`: cached, or to be computed by executing it."""
        key = prior_key(plan, normalization, cache_salt)
        return PendingPrior(plan, key, normalization, self.get(key), self)


@dataclass(frozen=True)
class Prior:
    """A schema's content-free scores, and what obtaining them cost this request."""

    fields: tuple[FieldResult, ...]
    cached: bool
    tokens_computed: int
    method: str = "content_free"  # or "batch": the mean over the call's documents
    documents: int = 0  # what a batch prior was measured on


@dataclass(frozen=True)
class PendingPrior:
    """A prior one call needs, the same way for the offline and the online path: from the
    cache, or from the execution of its plan, which then fills the cache."""

    plan: ScoredPlan
    key: Hashable
    normalization: str
    cached: tuple[FieldResult, ...] | None
    cache: PriorCache

    def resolve(self, execution: Execution | None = None) -> Prior:
        if self.cached is not None:
            return Prior(self.cached, True, 0)
        if execution is None:
            raise ValueError("an uncached prior needs the execution of its plan")
        fields = field_results(self.plan, execution.branches, self.normalization)
        self.cache.put(self.key, fields)
        return Prior(fields, False, execution.tokens_computed)
