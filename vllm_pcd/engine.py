"""The only module that submits work to vLLM: prefill the shared context, then the branches.

Both the offline `vllm.LLM` and the server's `EngineClient` go through the same two steps:
1. one request over the shared context, so its KV blocks are in the prefix cache;
2. every branch (shared context + the field's own tokens) submitted together, one token of
   output each, asking the engine for the log-probabilities of exactly the option codes.
What the engine reports (cached tokens, the step each request ran in) is turned into the
token accounting and the backbone-call count; nothing here is assumed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from vllm_pcd.internals.admission import group_args
from vllm_pcd.plan import Plan


@dataclass(frozen=True)
class RequestReport:
    """What the engine said about one of our requests."""

    prompt_tokens: int
    cached_tokens: int
    step_ts: float | None  # engine-core timestamp of the step that produced its token
    logprobs: dict[int, float]

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class Execution:
    prefill: RequestReport
    branches: tuple[RequestReport, ...]
    prefill_s: float
    branches_s: float

    @property
    def tokens_computed(self) -> int:
        return self.prefill.computed_tokens + sum(b.computed_tokens for b in self.branches)

    @property
    def backbone_calls(self) -> int | None:
        """Distinct engine steps our requests ran in; None when the engine keeps no stats."""
        stamps = [r.step_ts for r in (self.prefill, *self.branches)]
        if any(s is None for s in stamps):
            return None
        return len(set(stamps))

    def code_logprobs(self, index: int, code_ids: Sequence[int]) -> list[float]:
        got = self.branches[index].logprobs
        missing = [t for t in code_ids if t not in got]
        if missing:
            raise RuntimeError(f"engine returned no log-probability for token(s) {missing}")
        return [got[t] for t in code_ids]


def _report(output: Any, wanted: Sequence[int] = ()) -> RequestReport:
    completion = output.outputs[0]
    logprobs: dict[int, float] = {}
    if wanted:
        step = completion.logprobs[0] if completion.logprobs else {}
        logprobs = {t: step[t].logprob for t in wanted if t in step}
    metrics = output.metrics
    return RequestReport(
        prompt_tokens=len(output.prompt_token_ids),
        cached_tokens=output.num_cached_tokens or 0,
        step_ts=getattr(metrics, "first_token_ts", None) if metrics is not None else None,
        logprobs=logprobs,
    )


def prefill_params() -> SamplingParams:
    return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)


def branch_params(code_ids: Sequence[int], group: dict[str, Any] | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                          logprob_token_ids=list(code_ids), extra_args=group)


def _prompt(ids: Sequence[int], cache_salt: str | None) -> TokensPrompt:
    prompt = TokensPrompt(prompt_token_ids=list(ids))
    if cache_salt is not None:
        prompt["cache_salt"] = cache_salt
    return prompt


def _chunks(n: int, size: int) -> list[range]:
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def run_offline(llm: Any, plan: Plan, *, branches_per_batch: int,
                cache_salt: str | None = None) -> Execution:
    """Blocking execution on a `vllm.LLM`."""
    start = time.perf_counter()
    [prefill] = llm.generate([_prompt(plan.shared_ids, cache_salt)], prefill_params(),
                             use_tqdm=False)
    mid = time.perf_counter()
    outputs: list[Any] = []
    for chunk in _chunks(len(plan.fields), branches_per_batch):
        outputs += llm.generate([_prompt(plan.branch_ids(i), cache_salt) for i in chunk],
                                [branch_params(plan.fields[i].code_ids) for i in chunk],
                                use_tqdm=False)
    end = time.perf_counter()
    branches = tuple(_report(o, f.code_ids) for o, f in zip(outputs, plan.fields))
    return Execution(_report(prefill), branches, mid - start, end - mid)


async def _final(stream: AsyncIterator[Any]) -> Any:
    last = None
    async for last in stream:
        pass
    if last is None:
        raise RuntimeError("the engine finished a request without output")
    return last


async def run_online(engine: Any, plan: Plan, *, branches_per_batch: int,
                     request_id: str | None = None, cache_salt: str | None = None) -> Execution:
    """Execution on an `EngineClient` (the API server's AsyncLLM). Cancelling the calling task
    aborts every request still in flight: vLLM aborts a request whose stream is closed."""
    rid = request_id or f"pcd-{uuid.uuid4().hex}"
    start = time.perf_counter()
    prefill = await _final(engine.generate(_prompt(plan.shared_ids, cache_salt),
                                           prefill_params(), f"{rid}-ctx"))
    mid = time.perf_counter()
    outputs: list[Any] = []
    for number, chunk in enumerate(_chunks(len(plan.fields), branches_per_batch)):
        batch = group_args(f"{rid}-b{number}", len(chunk))
        # A TaskGroup cancels (and so aborts) the sibling branches when one fails.
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_final(engine.generate(
                _prompt(plan.branch_ids(i), cache_salt),
                branch_params(plan.fields[i].code_ids, batch), f"{rid}-f{i}")))
                for i in chunk]
        outputs += [t.result() for t in tasks]
    end = time.perf_counter()
    branches = tuple(_report(o, f.code_ids) for o, f in zip(outputs, plan.fields))
    return Execution(_report(prefill), branches, mid - start, end - mid)
