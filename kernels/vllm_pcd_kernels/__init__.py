"""Restricted LM-head projection for Parallel Constrained Decoding.

`project(hidden, weight, allowed)` returns the logits of the allowed token ids only and the
route that computed them; see kernels/vllm_pcd_kernels/projection.py for the routes and their
selection. The repository's `kernels/` folder has no `__init__.py`: this package is installed
as `vllm_pcd_kernels`, so Hugging Face's `kernels` package (which transformers imports) keeps
its name.
"""

from vllm_pcd_kernels.projection import (ROUTES, SCHEMES, HeadRows, ProjectionResult,
                                         head_for_projection, project, select_route,
                                         snapshot_rows)
from vllm_pcd_kernels.w4a8 import QuantizedHead, quantize_head

__all__ = ["ROUTES", "SCHEMES", "HeadRows", "ProjectionResult", "QuantizedHead",
           "head_for_projection", "project", "quantize_head", "select_route", "snapshot_rows"]
