"""The only module that submits work to vLLM: prefill the shared context, then the branches.

Both the offline `vllm.LLM` and the server's `EngineClient` go through the same steps:
1. one request over the shared context, so its KV blocks are in the prefix cache;
2. every scoring request of the plan (shared context + a branch's tokens) submitted together,
   one token of output each, asking the engine for the log-probabilities of exactly the
   tokens to score (option codes in token mode, trie children in sequence mode).
On the server the first branch batch is submitted with the context request and the engine
core holds it until the context has finished (`internals.admission`'s gate), so step 2
follows step 1 without a round trip through the API server.
Sequence-mode trie nodes chain by default: a node runs after its parent and forks the
parent's KV, so every trie token is computed once, at one more backbone call per trie
level. `PCD_TRIE=flat` runs all nodes in step 2 instead, each recomputing its path.
What the engine reports (cached tokens, the step each request ran in) is turned into the
token accounting and the backbone-call count; nothing here is assumed.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any, AsyncIterator, Sequence

from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from vllm_pcd.core.scoring import Execution, RequestReport
from vllm_pcd.internals import tags
from vllm_pcd.core.plan import Plan, Scoring


def probe_id(token_ids: Sequence[int]) -> int:
    """A token outside a restricted request's allowed ids whose log-probability it also asks
    for: only the restricted head makes it -inf (the stock head gives every token a finite
    one), so the diagnostics report what the worker did, not what it was asked to do."""
    allowed = set(token_ids)
    return next(t for t in range(len(allowed) + 1) if t not in allowed)


def _report(output: Any, wanted: Sequence[int] = (), probe: int | None = None) -> RequestReport:
    completion = output.outputs[0]
    logprobs: dict[int, float] = {}
    restricted = False
    if wanted:
        step = completion.logprobs[0] if completion.logprobs else {}
        missing = [t for t in (*wanted, *(() if probe is None else (probe,))) if t not in step]
        if missing:
            raise RuntimeError(f"engine returned no log-probability for token(s) {missing}")
        logprobs = {t: step[t].logprob for t in wanted}
        restricted = probe is not None and step[probe].logprob == float("-inf")
    metrics = output.metrics
    return RequestReport(
        prompt_tokens=len(output.prompt_token_ids),
        cached_tokens=output.num_cached_tokens or 0,
        step_ts=getattr(metrics, "first_token_ts", None) if metrics is not None else None,
        logprobs=logprobs,
        asked_restricted=probe is not None,
        restricted=restricted,
        sampled=completion.token_ids[0] if completion.token_ids else None,
    )


TRIE_ENV = "PCD_TRIE"


def chained_tries() -> bool:
    value = os.environ.get(TRIE_ENV, "chained")
    if value not in ("chained", "flat"):
        raise ValueError(f"{TRIE_ENV} must be 'chained' or 'flat', not {value!r}")
    return value == "chained"


def prefill_params(shared_len: int | None = None, reads: Sequence[int] = (),
                   opens: str | None = None) -> SamplingParams:
    """`shared_len` tags the request so the branches can fork its KV at that length; `reads`
    adds the lengths of earlier prompts it may fork from itself (a conditioned round's);
    `opens` names the gate its first branch group waits behind (`internals.admission`)."""
    lengths = tuple(sorted({n for n in (shared_len, *reads) if n}))
    return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                          extra_args=tags.encode(tags.Tags(shared=lengths, opens=opens)))


def context_params(plan: Plan, opens: str | None = None) -> SamplingParams:
    return prefill_params(len(plan.shared_ids), plan.reads[0] if plan.reads else (), opens)


def branch_params(token_ids: Sequence[int], group: tuple[str, int] | None = None,
                  shared_len: int | None = None, restrict: bool = False,
                  fork_lengths: Sequence[int] = (), after: str | None = None
                  ) -> SamplingParams:
    """`group` (id, size) admits the request with its batch, behind the gate `after` when
    given; `restrict` tags it so the LM head projects onto `token_ids` only; `fork_lengths`
    adds prompt lengths to fork at beyond the shared context."""
    lengths = tuple(sorted({n for n in (shared_len, *fork_lengths) if n}))
    group_id, group_size = group or (None, None)
    extra = tags.encode(tags.Tags(group_id, group_size, lengths,
                                  tuple(token_ids) if restrict else None, after=after))
    asked = [*token_ids, probe_id(token_ids)] if restrict else list(token_ids)
    return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                          logprob_token_ids=asked, extra_args=extra)


def _prompt(ids: Sequence[int], cache_salt: str | None) -> TokensPrompt:
    prompt = TokensPrompt(prompt_token_ids=list(ids))
    if cache_salt is not None:
        prompt["cache_salt"] = cache_salt
    return prompt


def microbatches(scorings: Sequence[Scoring], units_per_batch: int) -> list[list[int]]:
    """Consecutive groups of scoring indices, each completing at most `units_per_batch`
    branches (or candidates); requests that complete none ride with the current group."""
    batches: list[list[int]] = [[]]
    units = 0
    for i, scoring in enumerate(scorings):
        if batches[-1] and units + scoring.units > units_per_batch:
            batches.append([])
            units = 0
        batches[-1].append(i)
        units += scoring.units
    return batches


def schedule(scorings: Sequence[Scoring], units_per_batch: int,
             chained: bool) -> list[list[int]]:
    """Microbatches in run order. Chained, a scoring runs in the wave after its parent's."""
    waves = []
    for s in scorings:
        waves.append(waves[s.parent] + 1 if chained and s.parent is not None else 0)
    batches = []
    for wave in range(max(waves, default=-1) + 1):
        members = [i for i, w in enumerate(waves) if w == wave]
        batches += [[members[k] for k in batch] for batch in
                    microbatches([scorings[i] for i in members], units_per_batch)]
    return batches


def fork_lengths(scorings: Sequence[Scoring], shared_len: int, chained: bool) -> list[list[int]]:
    """Per scoring, the prompt lengths it forks at beyond the shared context: chained, its
    parent's (to read) and, when it has children, its own (to leave)."""
    if not chained:
        return [[] for _ in scorings]
    parents = {s.parent for s in scorings}
    lengths = []
    for i, s in enumerate(scorings):
        read = [] if s.parent is None else [shared_len + len(scorings[s.parent].suffix_ids)]
        lengths.append(read + ([shared_len + len(s.suffix_ids)] if i in parents else []))
    return lengths


def branch_batches(plan: Plan, group_id: str, branches_per_batch: int, cache_salt: str | None,
                   gate: str | None = None
                   ) -> list[list[tuple[int, TokensPrompt, SamplingParams]]]:
    """Every scoring request, in the batches it runs in: (scoring index, prompt, params).
    Each batch is tagged as one admission group, so one engine step takes it whole; the
    first waits behind `gate`, the shared context's, when given."""
    shared_len = len(plan.shared_ids)
    scorings = plan.scorings
    chained = chained_tries()
    forks = fork_lengths(scorings, shared_len, chained)
    for i, scoring in enumerate(scorings):  # a conditioned round's earlier and later rounds
        forks[i] += [*(plan.reads[i + 1] if plan.reads else ()),
                     *([shared_len + len(scoring.suffix_ids)] if plan.leaves else [])]
    batches = []
    for number, batch in enumerate(schedule(scorings, branches_per_batch, chained)):
        together = (f"{group_id}-b{number}", len(batch))
        batches.append([(i, _prompt(plan.shared_ids + scorings[i].suffix_ids, cache_salt),
                         branch_params(scorings[i].token_ids, together, shared_len,
                                       scorings[i].restricted, forks[i],
                                       gate if number == 0 else None))
                        for i in batch])
    return batches


def _execution(plan: Plan, prefill: Any, outputs: Sequence[Any], start: float, mid: float,
               end: float) -> Execution:
    branches = tuple(_report(o, s.token_ids, probe_id(s.token_ids) if s.restricted else None)
                     for o, s in zip(outputs, plan.scorings))
    return Execution(None if prefill is None else _report(prefill), branches, mid - start,
                     end - mid)


# The share of the KV cache one batch of offline documents may claim; the rest absorbs what
# `Plan.kv_blocks` leaves out (a content-free prior's requests) and any other caller's.
KV_SHARE = 0.9


def kv_room(llm: Any) -> tuple[int, int] | None:
    """(blocks a batch of documents may claim, block size) on a `vllm.LLM`, or None where
    its engine has not said how many blocks it holds."""
    cache = llm.llm_engine.vllm_config.cache_config
    blocks = getattr(cache, "num_gpu_blocks", None)
    if not blocks:
        return None
    return int((blocks - 1) * KV_SHARE), cache.block_size  # less the null block


def run_offline(llm: Any, plans: Sequence[Plan], *, branches_per_batch: int,
                cache_salt: str | None = None) -> list[Execution]:
    """Blocking execution of many plans on a `vllm.LLM`: every shared context in one
    `generate` call, then the k-th branch batch of every plan in one call, so vLLM batches
    the documents together (two backbone calls for a whole list, trie levels aside)."""
    start = time.perf_counter()
    contexts = [p for p in plans if p.context]
    done = iter(llm.generate([_prompt(p.shared_ids, cache_salt) for p in contexts],
                             [context_params(p) for p in contexts], use_tqdm=False)
                if contexts else ())
    prefills = [next(done) if p.context else None for p in plans]
    mid = time.perf_counter()
    outputs: list[list[Any]] = [[None] * len(p.scorings) for p in plans]
    group_id = f"pcd-offline-{uuid.uuid4().hex}"
    per_plan = [branch_batches(p, f"{group_id}-{k}", branches_per_batch, cache_salt)
                for k, p in enumerate(plans)]
    for number in range(max(len(b) for b in per_plan)):
        wave = [(k, i, prompt, params) for k, batches in enumerate(per_plan)
                if number < len(batches) for i, prompt, params in batches[number]]
        done = llm.generate([w[2] for w in wave], [w[3] for w in wave], use_tqdm=False)
        for (k, i, _, _), output in zip(wave, done):
            outputs[k][i] = output
    end = time.perf_counter()
    return [_execution(p, prefill, out, start, mid, end)
            for p, prefill, out in zip(plans, prefills, outputs)]


async def _final(stream: AsyncIterator[Any]) -> Any:
    last = None
    async for last in stream:
        pass
    if last is None:
        raise RuntimeError("the engine finished a request without output")
    return last


async def run_online(engine: Any, plan: Plan, *, branches_per_batch: int,
                     request_id: str | None = None, cache_salt: str | None = None,
                     data_parallel_rank: int | None = None) -> Execution:
    """Execution on an `EngineClient` (the API server's AsyncLLM). The first branch batch is
    submitted with the shared context, behind its gate, so the engine starts it in the step
    after the context's without waiting for this side. Cancelling the calling task aborts
    every request still in flight: vLLM aborts a request whose stream is closed. With
    several data-parallel engines, `data_parallel_rank` pins every request to one, where the
    context's KV and the branches' admission groups are."""
    rid = request_id or f"pcd-{uuid.uuid4().hex}"
    pinned = {"data_parallel_rank": data_parallel_rank} if data_parallel_rank is not None else {}
    gate = f"{rid}-ctx" if plan.context else None
    outputs: list[Any] = [None] * len(plan.scorings)
    prefill, mid = None, None

    async def context() -> None:
        nonlocal prefill, mid
        prefill = await _final(engine.generate(_prompt(plan.shared_ids, cache_salt),
                                               context_params(plan, gate), gate, **pinned))
        mid = time.perf_counter()

    start = time.perf_counter()
    for number, batch in enumerate(branch_batches(plan, rid, branches_per_batch, cache_salt,
                                                  gate)):
        # A TaskGroup cancels (and so aborts) the sibling requests when one fails.
        async with asyncio.TaskGroup() as group:
            if number == 0 and gate is not None:
                group.create_task(context())
            tasks = {i: group.create_task(_final(engine.generate(prompt, params, f"{rid}-s{i}",
                                                                 **pinned)))
                     for i, prompt, params in batch}
        for i, task in tasks.items():
            outputs[i] = task.result()
    if gate is not None and prefill is None:  # a plan without branches
        await context()
    return _execution(plan, prefill, outputs, start, mid or start, time.perf_counter())
