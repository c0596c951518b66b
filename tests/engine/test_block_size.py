"""The fork at 32-token KV blocks, the smallest size vLLM's CPU attention takes and the one the
README suggests to operators with short cached schemas: each token is still computed once, the
scores still equal an FP32 transformers forward, and no block leaks. The engine runs in its
own process, since the session's shared engine keeps vLLM's CPU default of 128."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import assert_branch_matches_reference, spread

BLOCK_SIZE = 32

SCRIPT = """
import json, sys
from vllm import LLM
from benchmarks.workloads import synthetic_schema, synthetic_ticket
from tests.conftest import computed_tokens
from vllm_pcd import constrained

llm = LLM(sys.argv[1], dtype="float32", enable_prefix_caching=True, block_size=int(sys.argv[2]),
          max_model_len=4096, seed=0)
scheduler = llm.llm_engine.engine_core.engine_core.scheduler
pool = scheduler.kv_cache_manager.block_pool
calls = []
for n_fields, context in ((8, 100), (32, 300)):
    result = constrained(llm, synthetic_ticket(llm.get_tokenizer(), context),
                         synthetic_schema(n_fields), cache_salt=f"bs-{n_fields}-{context}")
    plan = result.plan
    calls.append({
        "shared": len(plan.shared_ids),
        "computed": result.execution.tokens_computed, "planned": computed_tokens(plan),
        "cached": [b.cached_tokens for b in result.execution.branches],
        "branches": [{"prompt": [*plan.shared_ids, *s.suffix_ids], "tokens": list(s.token_ids),
                      "logprobs": {str(t): v for t, v in b.logprobs.items()}}
                     for s, b in zip(plan.scorings, result.execution.branches)]})
fork = scheduler.kv_cache_manager.pcd_fork
print("RESULT " + json.dumps({"fork_block_size": fork.block_size if fork else None,
                              "free": pool.get_num_free_blocks(), "idle": pool.num_gpu_blocks - 1,
                              "calls": calls}))
"""


def test_the_fork_is_exact_at_32_token_blocks(model_path, reference_model):
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_PLUGINS": "pcd",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(model_path), str(BLOCK_SIZE)],
                          env=env, capture_output=True, text=True, timeout=900,
                          cwd=Path(__file__).resolve().parents[2])
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    report = json.loads(lines[-1].removeprefix("RESULT "))
    for call in report["calls"]:
        assert call["shared"] % BLOCK_SIZE  # a partial tail block, which the fork copies
        # Every branch finds the whole context (the fork's copied tail included), and beyond
        # it at most whole blocks that another branch completed.
        beyond = [cached - call["shared"] for cached in call["cached"]]
        assert all(extra == 0 or (extra > 0 and cached % BLOCK_SIZE == 0)
                   for extra, cached in zip(beyond, call["cached"])), beyond
        assert call["computed"] == call["planned"] - sum(beyond)
        branches = call["branches"]
        for k in spread(len(branches)):
            branch = branches[k]
            got = {int(t): v for t, v in branch["logprobs"].items()}
            assert_branch_matches_reference(reference_model, branch["prompt"], branch["tokens"],
                                            got, k)
    assert report["free"] == report["idle"]  # no block leaks, forked ones included
    assert report["fork_block_size"] == BLOCK_SIZE
