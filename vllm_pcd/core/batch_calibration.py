"""Batch calibration: divide out the prior a schema's wording adds, measured on the documents
themselves.

A schema asked of many documents (the offline batch API) shows its own label prior: the mean
over those documents of each option's probability. Dividing it out of each document's
probabilities and renormalising removes the prior without a label and without an engine call
(Batch Calibration, Zhou et al., 2023, arXiv 2309.17249). A mean over few documents is mostly
their own labels, so a call with fewer than `MIN_DOCUMENTS` is answered uncalibrated, and its
diagnostics say why.
"""

from __future__ import annotations

import math
from typing import Sequence

from vllm_pcd.core.assemble import FieldResult
from vllm_pcd.core.calibration import Prior

MIN_DOCUMENTS = 16


def batch_prior(documents: Sequence[Sequence[FieldResult]]) -> Prior | None:
    """Per field, the log of each option's mean probability over `documents` (each the
    uncalibrated field results of one document, in schema order), as the prior `calibrate`
    subtracts; None below MIN_DOCUMENTS."""
    if len(documents) < MIN_DOCUMENTS:
        return None
    fields = []
    for column in zip(*documents):
        width = len(column[0].scores)
        means = [sum(math.exp(r.scores[k]) for r in column) / len(column) for k in range(width)]
        fields.append(FieldResult(column[0].field, tuple(math.log(max(m, 1e-300))
                                                         for m in means)))
    return Prior(tuple(fields), cached=False, tokens_computed=0, method="batch",
                 documents=len(documents))


def too_few(documents: int) -> dict[str, object]:
    """The diagnostics of a call too small to calibrate by its own batch."""
    return {"method": "batch", "applied": False, "documents": documents,
            "needed": MIN_DOCUMENTS}
