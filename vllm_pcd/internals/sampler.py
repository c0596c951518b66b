"""A mixed batch keeps every row's own log-probabilities.

vLLM's V1 sampler builds one log-probability tensor per step. Once any request of the step
asks for exact ids (`SamplingParams.logprob_token_ids`, which every PCD branch does), it
returns the exact-id gather for the whole batch: a neighbour that asked for `logprobs` /
`top_logprobs` gets back only its sampled token and `-inf` padding. Here the exact-id gather
is merged row by row with vLLM's own top-k gather, so rows that asked for exact ids get
them and every other row gets what the stock sampler gives it alone. The output processor
reads each row's first `1 + num_logprobs` columns, so the wider merged tensor changes
nothing for either kind. A row that asked for the whole vocabulary (`logprobs=-1`) gets all
of it, sorted, as vLLM's own top-k gives it where the engine states that as the vocabulary's
size (both supported versions do). A step without exact ids is left to vLLM as it is.

Runs in: the worker process.
Changes: `Sampler.forward`, `gather_specific_token_logprobs` and `gather_logprobs` keep each
  row's own log-probabilities.
Remove when: vLLM's sampler keeps per-row log-probability kinds in a mixed batch.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

import torch

from vllm_pcd.compat import require_methods

# The step's sampling metadata, read by the exact-id gather that the sampler calls.
_METADATA: contextvars.ContextVar[Any] = contextvars.ContextVar("pcd_sampling", default=None)


def merged_rows(exact: Any, top_k: Any, exact_rows: list[int]) -> Any:
    """One LogprobsTensors: `exact`'s rows where exact ids were asked for, `top_k`'s others,
    padded to the wider of the two (ids 0, log-probabilities -inf)."""
    width = max(exact.logprobs.shape[1], top_k.logprobs.shape[1])

    def padded(t: torch.Tensor, fill: float) -> torch.Tensor:
        extra = width - t.shape[1]
        return t if not extra else torch.nn.functional.pad(t, (0, extra), value=fill)

    ids = padded(top_k.logprob_token_ids.to(torch.int32), 0)
    logprobs = padded(top_k.logprobs, float("-inf"))
    rows = torch.tensor(exact_rows, dtype=torch.long, device=ids.device)
    ids = ids.index_copy(0, rows, padded(exact.logprob_token_ids.to(torch.int32), 0)[rows])
    logprobs = logprobs.index_copy(0, rows, padded(exact.logprobs, float("-inf"))[rows])
    return type(exact)(ids, logprobs, exact.selected_token_ranks)


def patch_sampler(sampler_cls: Any) -> None:
    forward = sampler_cls.forward
    gather_exact = sampler_cls.gather_specific_token_logprobs

    @functools.wraps(forward)
    def forward_keeping_rows(self: Any, logits: Any, sampling_metadata: Any, *args: Any,
                             **kwargs: Any) -> Any:
        token = _METADATA.set(sampling_metadata)
        try:
            return forward(self, logits, sampling_metadata, *args, **kwargs)
        finally:
            _METADATA.reset(token)

    @functools.wraps(gather_exact)
    def gather_exact_and_top_k(self: Any, logprobs: Any, logprob_token_ids: Any,
                               sampled: Any) -> Any:
        exact = gather_exact(self, logprobs, logprob_token_ids, sampled)
        metadata = _METADATA.get()
        top = getattr(metadata, "max_num_logprobs", None)
        if exact is None or top is None:
            return exact
        if top < 0:  # the whole vocabulary
            top = logprobs.shape[-1]
        top_k = self.gather_logprobs(logprobs, top, token_ids=sampled)
        return merged_rows(exact, top_k, sorted(logprob_token_ids))

    sampler_cls.forward = forward_keeping_rows
    sampler_cls.gather_specific_token_logprobs = gather_exact_and_top_k


def apply() -> None:
    from vllm.v1.sample.sampler import Sampler

    require_methods(Sampler, "forward", "gather_specific_token_logprobs", "gather_logprobs",
                    patch="sampler")
    patch_sampler(Sampler)
