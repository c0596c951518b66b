"""Offline batches no larger than the KV cache holds: a list of documents is submitted in
batches whose blocks fit, so no branch finds its context evicted by the branches of the
documents before it and computes it again."""

import math
from unittest import mock

import pytest

from benchmarks.workloads import synthetic_schema
from benchmarks.workloads import tickets
from vllm_pcd import constrained, pipeline
from vllm_pcd.core.plan import Plan, Scoring

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too


def plan(shared, *suffixes, leaves=False):
    """A plan of one field per request (only their number counts here)."""
    scorings = tuple(Scoring(i, tuple(range(n)), (1, 2), 1) for i, n in enumerate(suffixes))
    return Plan(tuple(shared), tuple(object() for _ in suffixes), scorings, leaves=leaves)


def test_a_plan_claims_its_context_blocks_and_one_tail_per_request():
    # 300 tokens: three blocks of 128; each branch copies the third and writes into it,
    # except one that runs past it into a fourth.
    p = plan(range(300), 5, 5, 200)
    assert p.kv_blocks(128) == (3, 1 + 1 + 2)
    # a batch's first document holds the blocks both share (whole blocks only)
    assert p.kv_blocks(128, held=260) == (1, 4)
    aligned = plan(range(256), 5)  # no tail to copy: the branch opens a block of its own
    assert aligned.kv_blocks(128) == (2, 1)


def test_batches_stop_where_the_kv_cache_is_full():
    docs = [[7] * 100 + [d] * 200 for d in range(10)]  # 100 shared tokens, then 200 own
    plans = {id(d): plan(d, 4, 4) for d in docs}

    def plan_of(messages):
        return plans[id(messages)]

    with mock.patch.object(pipeline, "as_messages", lambda doc: doc):
        # the first document claims 3 + 2 blocks, each later one 3 (its first block shared
        # with the first document's only where whole: 100 tokens are not a block) + 2
        sizes = [len(b[1]) for b in pipeline.batches(docs, plan_of, (12, 128), 1)]
        assert sizes == [2, 2, 2, 2, 2]
        assert [len(b[1]) for b in pipeline.batches(docs, plan_of, (4, 128), 1)] == [1] * 10
        assert [len(b[1]) for b in pipeline.batches(docs, plan_of, None, 1)] == [10]
        # conditioned: two more fields' later rounds at the first round's blocks per field
        later = {id(d): plan(d, 4, leaves=True) for d in docs}
        sizes = [len(b[1]) for b in pipeline.batches(docs, lambda m: later[id(m)], (12, 128),
                                                     3)]
        assert sizes == [2] * 5  # 3 + 1 + 2 × 1 each
    shared = [[7] * 256 + [d] * 10 for d in range(4)]
    same = {id(d): plan(d, 4) for d in shared}
    with mock.patch.object(pipeline, "as_messages", lambda doc: doc):
        # two whole blocks in common: the first claims 3 + 1, each later one 1 + 1
        assert [len(b[1]) for b in pipeline.batches(shared, lambda m: same[id(m)], (6, 128),
                                                    1)] == [2, 2]


def run_many(llm, tokenizer, sized):
    """40 new documents at 8 fields in one call; `sized` False submits them in one batch."""
    schema = synthetic_schema(8)
    constrained(llm, tickets(tokenizer, 1, 1), schema)  # the field list, cached
    texts = tickets(tokenizer, 40, 500 if sized else 900)
    with mock.patch.object(pipeline, "kv_room",
                           pipeline.kv_room if sized else (lambda llm: None)):
        return constrained(llm, texts, schema)


def evicted(results):
    """Branches that found less than their whole context cached, by document."""
    return [sum(b.cached_tokens < len(r.plan.shared_ids) for b in r.execution.branches)
            for r in results]


def test_many_documents_fork_every_context_in_a_small_cache(fp32_llm, tokenizer):
    room = pipeline.kv_room(fp32_llm)
    assert room is not None and room[0] < 400  # the suite's 1 GiB cache, at FP32
    results = run_many(fp32_llm, tokenizer, True)
    assert evicted(results) == [0] * 40
    assert all(r.execution.tokens_computed <= r.plan.ideal_tokens for r in results)


def test_one_batch_of_them_would_have_evicted_contexts(fp32_llm, tokenizer):
    """The control: the same load as one batch (as before batches were sized) recomputes."""
    assert sum(evicted(run_many(fp32_llm, tokenizer, False))) > 0


def test_batch_calibration_divides_out_the_calls_own_mean(fp32_llm):
    """`pcd_calibration: batch` offline: every document's scores minus the log of the call's
    per-field mean probability, from the same engine outputs (no more engine work); fewer
    documents than the estimate needs stay uncalibrated, and say so."""
    from tests.conftest import SUPPORT_SCHEMA
    from vllm_pcd.core.scoring import MIN_DOCUMENTS

    texts = [f"Ticket {k}: I was charged twice for order {k}; please refund it."
             if k % 2 else f"Ticket {k}: the app crashes when I log in on my phone."
             for k in range(MIN_DOCUMENTS)]
    plain = constrained(fp32_llm, texts, SUPPORT_SCHEMA)
    batch = constrained(fp32_llm, texts, SUPPORT_SCHEMA, calibration="batch")
    assert all(r.calibration == {"method": "batch", "applied": True,
                                 "documents": MIN_DOCUMENTS} for r in batch)
    for name in SUPPORT_SCHEMA["properties"]:
        index = [f.field.name for f in plain[0].fields].index(name)
        width = len(plain[0].fields[index].scores)
        mean = [math.log(sum(math.exp(r.fields[index].scores[k]) for r in plain) / len(plain))
                for k in range(width)]
        for p, b in zip(plain, batch):
            shifted = [s - m for s, m in zip(p.fields[index].scores, mean)]
            top = max(shifted)
            norm = top + math.log(sum(math.exp(x - top) for x in shifted))
            assert b.fields[index].scores == pytest.approx([x - norm for x in shifted],
                                                           abs=1e-6)
    few = constrained(fp32_llm, texts[:3], SUPPORT_SCHEMA, calibration="batch")
    assert all(r.calibration["applied"] is False and r.calibration["needed"] == MIN_DOCUMENTS
               for r in few)
    assert [r.object for r in few] == [r.object for r in plain[:3]]
