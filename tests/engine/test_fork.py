"""The KV fork: a PCD request computes every shared-context token once and, per request after
it, only that request's own tokens, whatever the block size; scores stay exact against an
FP32 transformers forward over the whole prompt, and no block leaks."""

import time

import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from benchmarks.workloads import synthetic_schema, synthetic_ticket
from tests.conftest import CPU_BLOCK_SIZE, MESSAGE, SUPPORT_SCHEMA, computed_tokens
from tests.helpers import TOLERANCE, assert_branch_matches_reference, partial_tail_text, spread
from vllm_pcd import constrained
from vllm_pcd.engine import branch_params, microbatches, prefill_params
from vllm_pcd.internals import fork, tags
from vllm_pcd.pipeline import as_messages
from vllm_pcd.core.plan import build_plan
from vllm_pcd.core.schema import Limits, parse_schema

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too


def scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def free_blocks(llm):
    return scheduler(llm).kv_cache_manager.block_pool.get_num_free_blocks()


def idle_free_blocks(llm):
    """Every block but the null block is free (cached blocks hold no reference)."""
    return scheduler(llm).kv_cache_manager.block_pool.num_gpu_blocks - 1


def block_size(llm):
    return scheduler(llm).kv_cache_manager.pcd_fork.block_size


def assert_scores_match_reference(model, result, indices):
    scorings = result.plan.scorings
    for k in indices:
        s = scorings[k]
        assert_branch_matches_reference(model, [*result.plan.shared_ids, *s.suffix_ids],
                                        s.token_ids, result.execution.branches[k].logprobs, k)


def test_default_engine_gets_the_fork(fp32_llm, monkeypatch):
    """On every supported vLLM (0.24 with the adapter's own copy-on-write)."""
    assert fork.off_reason(scheduler(fp32_llm)) is None
    assert scheduler(fp32_llm).kv_cache_manager.pcd_fork is not None
    monkeypatch.setenv(fork.ENV, "0")
    assert fork.off_reason(scheduler(fp32_llm)) == "PCD_FORK=0"


@pytest.mark.parametrize("context", [100, 300, 1000])
@pytest.mark.parametrize("n_fields", [1, 8, 32])
def test_each_token_is_computed_once(fp32_llm, tokenizer, reference_model, n_fields, context):
    result = constrained(fp32_llm, synthetic_ticket(tokenizer, context),
                         synthetic_schema(n_fields), cache_salt=f"fork-{n_fields}-{context}")
    shared, plan = len(result.plan.shared_ids), result.plan
    # Beyond the context, a request may find a whole block that another request
    # completed with the same leading tokens (the context's partial block plus a stem): the
    # prefix cache serves it, so that request computes fewer tokens, never more.
    branches = result.execution.branches
    beyond = [b.cached_tokens - shared for b in branches]
    assert all(extra == 0 or (extra > 0 and b.cached_tokens % block_size(fp32_llm) == 0)
               for b, extra in zip(branches, beyond)), beyond
    assert result.execution.tokens_computed == computed_tokens(plan) - sum(beyond)
    if len(plan.scorings) == len(plan.fields):  # one request per field
        assert result.execution.tokens_computed == shared + plan.branch_tokens - sum(beyond)
    batches = microbatches(plan.scorings, Limits().max_branches_per_batch)
    assert result.execution.backbone_calls == 1 + len(batches)
    # A full forward per request takes minutes on a CPU at 32 fields: check a spread of them.
    assert_scores_match_reference(reference_model, result, spread(len(plan.scorings)))
    assert free_blocks(fp32_llm) == idle_free_blocks(fp32_llm)


def aligned_text(tokenizer, size):
    """A message whose shared context is a whole number of blocks (no partial tail)."""
    spec = parse_schema(SUPPORT_SCHEMA)
    text = MESSAGE
    for _ in range(2 * size):
        if len(build_plan(tokenizer, spec, as_messages(text)).shared_ids) % size == 0:
            return text
        text += " a"
    raise AssertionError("no block-aligned shared context found")


@pytest.mark.parametrize("case", ["under-one-block", "block-aligned"])
def test_short_and_aligned_contexts(fp32_llm, tokenizer, reference_model, case):
    size = block_size(fp32_llm)
    text = MESSAGE if case == "under-one-block" else aligned_text(tokenizer, size)
    result = constrained(fp32_llm, text, SUPPORT_SCHEMA, cache_salt=f"fork-{case}")
    shared = len(result.plan.shared_ids)
    assert (shared < size) == (case == "under-one-block")
    assert (shared % size == 0) == (case == "block-aligned")
    assert result.execution.tokens_computed == computed_tokens(result.plan)
    assert_scores_match_reference(reference_model, result, range(len(result.plan.scorings)))


def test_without_the_fork_the_report_is_plain_prefix_caching(fp32_llm, tokenizer):
    """An engine without the fork recomputes each request's partial block, and says so."""
    manager = scheduler(fp32_llm).kv_cache_manager
    size, saved = block_size(fp32_llm), manager.pcd_fork
    schema, text = synthetic_schema(8), synthetic_ticket(tokenizer, 300)
    while len(build_plan(tokenizer, parse_schema(schema), as_messages(text)).shared_ids) % size == 0:
        text += " a"  # a context with a partial last block, which is what is recomputed
    manager.pcd_fork = None
    try:
        result = constrained(fp32_llm, text, schema, cache_salt="fork-off")
    finally:
        manager.pcd_fork = saved
    shared, scorings = len(result.plan.shared_ids), result.plan.scorings
    assert shared % size
    redone = len(scorings) * (shared % size)
    once = shared + sum(len(s.suffix_ids) for s in scorings)
    assert result.execution.tokens_computed == once + redone
    assert free_blocks(fp32_llm) == idle_free_blocks(fp32_llm)


def salted(ids, salt):
    return TokensPrompt(prompt_token_ids=list(ids), cache_salt=salt)


def first_output(engine, request_id):
    while True:
        for output in engine.step():
            if output.request_id == request_id:
                return output


def test_aborted_requests_release_every_block(fp32_llm, tokenizer):
    """A forked request aborted mid-decode, and one aborted before it ran, leak nothing."""
    spec = parse_schema(SUPPORT_SCHEMA)
    plan = build_plan(tokenizer, spec, as_messages(synthetic_ticket(tokenizer, 300)))
    shared, salt = len(plan.shared_ids), "fork-abort"
    first, second = plan.scorings[:2]
    fp32_llm.generate([salted(plan.shared_ids, salt)], prefill_params(shared), use_tqdm=False)
    engine = fp32_llm.llm_engine
    long_branch = SamplingParams(max_tokens=64, ignore_eos=True, detokenize=False,
                                 extra_args=tags.encode(tags.Tags(shared=(shared,))))
    engine.add_request("abort-running", salted(plan.shared_ids + first.suffix_ids, salt),
                       long_branch)
    engine.add_request("abort-waiting", salted(plan.shared_ids + second.suffix_ids, salt),
                       branch_params(second.token_ids, shared_len=shared))
    engine.abort_request(["abort-waiting"])
    assert first_output(engine, "abort-running").num_cached_tokens == shared
    assert free_blocks(fp32_llm) < idle_free_blocks(fp32_llm)
    engine.abort_request(["abort-running"])
    while engine.has_unfinished_requests():
        engine.step()
    assert not scheduler(fp32_llm).requests
    assert free_blocks(fp32_llm) == idle_free_blocks(fp32_llm)


def run_until_done(engine, ids):
    outputs = {}
    while engine.has_unfinished_requests():
        outputs.update((o.request_id, o) for o in engine.step() if o.finished)
    return {i: outputs[i] for i in ids if i in outputs}


def test_siblings_of_an_aborted_and_a_preempted_branch_stay_exact(fp32_llm, tokenizer,
                                                                  reference_model):
    """Many branches fork one partial tail block. After the first wave's step, one branch is
    aborted and one preempted (its blocks freed, then re-admitted: it forks the tail again);
    a second wave forks the same tail. Every branch's scores stay those of an FP32 forward,
    the preempted branch writes what its undisturbed twin writes, and the KV goes back to
    idle."""
    schema = synthetic_schema(8)
    size = block_size(fp32_llm)
    plan = build_plan(tokenizer, parse_schema(schema),
                      as_messages(partial_tail_text(tokenizer, schema, size)))
    shared, salt, scorings = len(plan.shared_ids), "fork-siblings", plan.scorings
    assert shared % size
    fp32_llm.generate([salted(plan.shared_ids, salt)], prefill_params(shared), use_tqdm=False)
    engine, sched = fp32_llm.llm_engine, scheduler(fp32_llm)

    def add(request_id, scoring, max_tokens=1):
        params = branch_params(scoring.token_ids, shared_len=shared)
        params.max_tokens, params.ignore_eos = max_tokens, True
        engine.add_request(request_id, salted(plan.shared_ids + scoring.suffix_ids, salt),
                           params)

    long_one = scorings[0]
    for name in ("preempted", "twin", "aborted"):
        add(name, long_one, max_tokens=6)
    first_wave = {f"first-{k}": s for k, s in enumerate(scorings[1:4], 1)}
    for request_id, scoring in first_wave.items():
        add(request_id, scoring)
    done = {o.request_id: o for o in engine.step() if o.finished}
    assert set(done) == set(first_wave)  # one step ran them all, beside the long three
    (victim,) = [r for i, r in sched.requests.items() if i.startswith("preempted")]
    sched.running.remove(victim)
    sched._preempt_request(victim, time.monotonic())
    engine.abort_request(["aborted"])
    second_wave = {f"second-{k}": s for k, s in enumerate(scorings[4:], 4)}
    for request_id, scoring in second_wave.items():
        add(request_id, scoring)
    done.update(run_until_done(engine, [*second_wave, "preempted", "twin"]))

    for request_id, scoring in {**first_wave, **second_wave}.items():
        output = done[request_id]
        assert output.num_cached_tokens == shared, request_id
        step = output.outputs[0].logprobs[0]
        assert_branch_matches_reference(
            reference_model, [*plan.shared_ids, *scoring.suffix_ids], scoring.token_ids,
            {t: step[t].logprob for t in scoring.token_ids}, request_id)
    preempted, twin = done["preempted"].outputs[0], done["twin"].outputs[0]
    assert preempted.token_ids == twin.token_ids and len(twin.token_ids) == 6
    for mine, theirs in zip(preempted.logprobs, twin.logprobs):
        assert max(abs(mine[t].logprob - theirs[t].logprob) for t in long_one.token_ids) \
            < TOLERANCE
    assert not sched.requests
    assert free_blocks(fp32_llm) == idle_free_blocks(fp32_llm)


CHILD = """
import json, sys
from benchmarks.workloads import synthetic_schema
from tests.conftest import CPU_BLOCK_SIZE
from tests.helpers import partial_tail_text
from vllm_pcd import constrained


def main():
    from vllm import LLM

    llm = LLM(sys.argv[1], dtype="float32", enable_prefix_caching=True,
              disable_log_stats=False, max_model_len=4096, seed=0)
    schema = synthetic_schema(8)
    text = partial_tail_text(llm.get_tokenizer(), schema, CPU_BLOCK_SIZE)
    result = constrained(llm, text, schema, cache_salt="fork-processes")
    print("RESULT " + json.dumps({
        "shared_ids": list(result.plan.shared_ids),
        "scorings": [[list(s.suffix_ids), list(s.token_ids)] for s in result.plan.scorings],
        "logprobs": [{str(t): v for t, v in b.logprobs.items()}
                     for b in result.execution.branches],
        "computed": result.execution.tokens_computed,
        "calls": result.execution.backbone_calls}))


if __name__ == "__main__":
    main()
"""


def test_the_fork_is_exact_across_processes(model_path, reference_model, tmp_path):
    """As users run it: the engine core and its worker in processes of their own, so the
    step's block copies travel with the scheduler's output to the worker (vLLM 0.24's copy is
    the adapter's). Every token once, two calls, scores of an FP32 forward. It runs in a
    child process: a second engine in this one would share its distributed state with the
    session's in-process engine."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_PLUGINS": "pcd",
           "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(root)}
    run = subprocess.run([sys.executable, str(script), str(model_path)], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stdout[-3000:] + run.stderr[-3000:]
    got = json.loads(lines[-1].removeprefix("RESULT "))
    shared = got["shared_ids"]
    assert len(shared) % CPU_BLOCK_SIZE > 8  # a tail of several tokens to copy
    assert got["computed"] == len(shared) + sum(len(s) for s, _ in got["scorings"])
    assert got["calls"] == 2
    for k, ((suffix, token_ids), logprobs) in enumerate(zip(got["scorings"], got["logprobs"])):
        assert_branch_matches_reference(reference_model, [*shared, *suffix], token_ids,
                                        {t: logprobs[str(t)] for t in token_ids}, k)
