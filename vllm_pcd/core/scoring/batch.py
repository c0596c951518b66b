"""Batch calibration: divide out the prior a schema's wording adds, measured on the documents
themselves.

A schema asked of many documents (the offline batch API, or a stream of online requests)
shows its own label prior: the mean over those documents of each option's probability. Dividing it out of each document's
probabilities and renormalising removes the prior without a label and without an engine call
(Batch Calibration, Zhou et al., 2023, arXiv 2309.17249). A mean over few documents is mostly
their own labels, so a call with fewer than `MIN_DOCUMENTS` is answered uncalibrated, and its
diagnostics say why. Online, `RunningPriors` keeps that mean per tenant, schema and options
over the stream, so one tenant's documents never move another's answers.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Hashable, Sequence

from vllm_pcd.core.scoring.field_result import FieldResult
from vllm_pcd.core.scoring.content_free import Prior

MIN_DOCUMENTS = 16


def _prior(fields: Sequence[FieldResult], means: Sequence[Sequence[float]], documents: int
           ) -> Prior:
    """The prior `calibrate` subtracts: per field, the log of each option's mean probability."""
    return Prior(tuple(FieldResult(r.field, tuple(math.log(max(m, 1e-300)) for m in row))
                       for r, row in zip(fields, means)),
                 cached=False, tokens_computed=0, method="batch", documents=documents)


def batch_prior(documents: Sequence[Sequence[FieldResult]]) -> Prior | None:
    """The mean over `documents` (each the uncalibrated field results of one document, in
    schema order) as a prior; None below MIN_DOCUMENTS."""
    if len(documents) < MIN_DOCUMENTS:
        return None
    means = [[sum(math.exp(r.scores[k]) for r in column) / len(column)
              for k in range(len(column[0].scores))] for column in zip(*documents)]
    return _prior(documents[0], means, len(documents))


def too_few(documents: int) -> dict[str, object]:
    """The diagnostics of a call too small to calibrate by its own batch."""
    return {"method": "batch", "applied": False, "documents": documents,
            "needed": MIN_DOCUMENTS}


class RunningPriors:
    """The online batch: per key (a tenant with a schema and its options), the mean of each
    option's probability over the documents answered so far, this one included. The mean
    is exact over the first `window` documents, then moves with weight 1/`window`, so it
    follows a stream whose mix drifts. At most `keys` estimates are kept, the least recently
    used dropped first: memory stays bounded whatever tenants and schemas arrive."""

    def __init__(self, keys: int = 1024, window: int = 1024):
        self.keys, self.window = keys, window
        self._means: OrderedDict[Hashable, tuple[int, list[list[float]]]] = OrderedDict()

    def observe(self, key: Hashable, fields: Sequence[FieldResult]) -> tuple[int, Prior | None]:
        """Add one document's uncalibrated results; the estimate's size and, from
        MIN_DOCUMENTS on, the prior to calibrate that document by."""
        count, means = self._means.pop(key, (0, [[0.0] * len(r.scores) for r in fields]))
        count += 1
        weight = 1 / min(count, self.window)
        for row, result in zip(means, fields):
            for k, score in enumerate(result.scores):
                row[k] += weight * (math.exp(score) - row[k])
        self._means[key] = (count, means)
        while len(self._means) > self.keys:
            self._means.popitem(last=False)
        return count, (_prior(fields, means, count) if count >= MIN_DOCUMENTS else None)
