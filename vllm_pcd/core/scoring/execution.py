"""What the engine said about a PCD call's requests: the facts scores and diagnostics are
computed from. Filled by `vllm_pcd.engine`; read by the core."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestReport:
    """What the engine said about one of our requests."""

    prompt_tokens: int
    cached_tokens: int
    step_ts: float | None  # engine-core timestamp of the step that produced its token
    logprobs: dict[int, float]
    asked_restricted: bool = False  # it asked for the restricted LM head (and the probe)
    restricted: bool = False  # the worker projected its LM head onto the allowed ids only
    sampled: int | None = None  # the greedy token it produced (the argmax of its head)

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class Execution:
    prefill: RequestReport | None  # None: a conditioned round that runs no context request
    branches: tuple[RequestReport, ...]  # one per `Plan.scorings` entry, in order
    prefill_s: float
    branches_s: float

    @property
    def requests(self) -> tuple[RequestReport, ...]:
        return (*((self.prefill,) if self.prefill is not None else ()), *self.branches)

    @property
    def tokens_computed(self) -> int:
        return sum(r.computed_tokens for r in self.requests)

    @property
    def backbone_calls(self) -> int | None:
        """Distinct engine steps our requests ran in; None when the engine keeps no stats."""
        stamps = [r.step_ts for r in self.requests]
        if any(s is None for s in stamps):
            return None
        return len(set(stamps))
