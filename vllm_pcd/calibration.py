"""Content-free calibration: divide out what the model answers when there is no document.

A model's option probabilities mix evidence from the document with a prior for the options
themselves (their order, their words, `true` over `false`). Asking the same schema about a
content-free document ("N/A") measures that prior; subtracting its log-probabilities from a
document's and renormalising removes it (the "calibrate before use" idea of Zhao et al.,
2021). The prior depends only on the schema and the request's options, never on a document,
so one engine call per schema serves every document asked it: the priors are cached here.
Only a plan and scores are needed: this module knows nothing of vLLM or HTTP.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Sequence

from vllm_pcd.assemble import FieldResult, log_softmax
from vllm_pcd.plan import Plan
from vllm_pcd.schema import SchemaError, shown

CALIBRATIONS = ("none", "content_free")
DEFAULT_CALIBRATION = "none"
CONTENT_FREE_TEXT = "N/A"


def check_calibration(name: Any) -> str:
    if not isinstance(name, str) or name not in CALIBRATIONS:
        raise SchemaError(f"pcd_calibration must be one of {list(CALIBRATIONS)}, got "
                          f"{shown(name)}", param="pcd_calibration", rule="calibration")
    return name


def content_free_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation's system turns (they belong to every document), then one user turn
    with no content to speak of."""
    return [*(dict(m) for m in messages if m.get("role") == "system"),
            {"role": "user", "content": CONTENT_FREE_TEXT}]


def prior_key(plan: Plan, normalization: str, cache_salt: str | None) -> Hashable:
    """Everything a prior depends on, as the engine sees it: the content-free plan's tokens
    (schema, options, template, system turns) and the scoring. The tenant's salt keeps one
    tenant from learning, by timing, which schemas another asked."""
    return (cache_salt, normalization, plan.shared_ids,
            tuple((s.field_index, s.suffix_ids, s.token_ids) for s in plan.scorings()))


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


def calibrate(results: Sequence[FieldResult], prior: Sequence[FieldResult]
              ) -> tuple[FieldResult, ...]:
    """Each field's scores minus its prior's, renormalised; the uncalibrated score and the
    prior stay in each candidate's diagnostics."""
    out = []
    for result, empty in zip(results, prior):
        scores = log_softmax([s - e for s, e in zip(result.scores, empty.scores)])
        extra = result.candidate_extra or tuple({} for _ in result.scores)
        out.append(FieldResult(result.field, tuple(scores), result.extra, tuple(
            {**more, "uncalibrated_score": raw, "prior_score": base}
            for more, raw, base in zip(extra, result.scores, empty.scores))))
    return tuple(out)
