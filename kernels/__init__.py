"""Restricted LM-head projection for Parallel Constrained Decoding.

`project(hidden, weight, allowed)` returns the logits of the allowed token ids only and the
route that computed them; see kernels/projection.py for the routes and their selection.
"""

from kernels.projection import (ROUTES, SCHEMES, HeadRows, ProjectionResult, head_for_projection,
                                project, select_route, snapshot_rows)
from kernels.w4a8 import QuantizedHead, quantize_head

__all__ = ["ROUTES", "SCHEMES", "HeadRows", "ProjectionResult", "QuantizedHead",
           "head_for_projection", "project", "quantize_head", "select_route", "snapshot_rows"]
