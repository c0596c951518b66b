"""The fork's block copies on a CPU worker: vLLM 0.32's own against PCD's, side by side.

    python -m benchmarks.bench_kv_copy [--model PATH ...] [--branches 8 32 256] [--reps 7]
    python -m benchmarks.bench_kv_copy --engine [--model PATH] [--fields 32] [--docs 1 8]

For each model (its config gives layers, KV heads and head size) it builds KV caches in CPU
attention's layout, bf16, and times one step's copies of `--branches` partial hits of one
shared tail block (what a call of that many fields, or several calls, asks of one step):
vLLM's `copy_kv_cache_blocks_inplace` (one fancy-indexed assignment per layer) and PCD's
`internals.block_copy.copy_blocks` (one slice copy a pair), in alternating order, median of
`--reps`. Both must leave identical caches. Needs vLLM 0.32 (0.24 has no copy of its own).

`--engine`: the same two copies inside one in-process offline engine (bf16), end to end: PCD
calls of `--fields` fields over `--docs` synthetic tickets at once (150-250 tokens, a fresh
cache salt each call), the worker's copy switched between vLLM's and PCD's every call. The
answers must not differ.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks.harness import provenance
from vllm_pcd.models import default_model_path

BLOCK_SIZE = 128  # vLLM's CPU block


def kv_caches(model: str, num_blocks: int) -> list[Any]:
    import torch

    config = json.loads((Path(model) / "config.json").read_text())
    heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    return [torch.randn(num_blocks, heads, BLOCK_SIZE, 2 * head).to(torch.bfloat16)
            for _ in range(config["num_hidden_layers"])]


def timed(copy: Callable[[], None]) -> float:
    start = time.perf_counter()
    copy()
    return time.perf_counter() - start


def measure(model: str, branches: int, reps: int) -> dict[str, Any]:
    from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
    from vllm.v1.worker.utils import copy_kv_cache_blocks_inplace

    from vllm_pcd.internals.block_copy import copy_blocks

    num_blocks = branches + 1
    caches = kv_caches(model, num_blocks)
    pairs = [(0, 1 + i) for i in range(branches)]  # one shared tail, a private copy each
    copies = [KVCacheBlockCopy(src_block_id=s, dst_block_id=d) for s, d in pairs]
    methods = {"vllm": lambda: copy_kv_cache_blocks_inplace(caches, num_blocks, copies),
               "pcd": lambda: copy_blocks(caches, num_blocks, pairs)}
    times: dict[str, list[float]] = {name: [] for name in methods}
    for rep in range(reps + 1):
        order = list(methods) if rep % 2 else list(reversed(methods))
        for name in order:
            for cache in caches:
                cache[1:].fill_(0)
            seconds = timed(methods[name])
            if rep:  # the first round warms up
                times[name].append(seconds)
            if not all(cache[1:].equal(cache[:1].expand_as(cache[1:])) for cache in caches):
                raise AssertionError(f"{name}'s copy left a block unlike its source")
    median = {name: statistics.median(t) for name, t in times.items()}
    block_bytes = sum(c[0].numel() * c.element_size() for c in caches)
    return {"model": Path(model).name, "branches": branches, "block_mb": block_bytes / 2**20,
            "vllm_ms": median["vllm"] * 1e3, "pcd_ms": median["pcd"] * 1e3,
            "ratio": median["vllm"] / median["pcd"]}


def engine_calls(model: str, fields: int, docs: int, reps: int) -> dict[str, Any]:
    """Median wall time of one batched PCD call with each copy, alternating call by call."""
    import os
    import random

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the worker is in this process
    os.environ.setdefault("VLLM_PLUGINS", "pcd")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from benchmarks.workloads import synthetic_schema, synthetic_ticket
    from benchmarks.client import load_tokenizer
    from vllm_pcd import constrained

    llm = LLM(model, dtype="bfloat16", enable_prefix_caching=True, max_model_len=4096, seed=0)
    pcd = GPUModelRunner._update_states
    runners = {"vllm": pcd.__wrapped__, "pcd": pcd}  # functools.wraps keeps vLLM's
    tokenizer, rng = load_tokenizer(model), random.Random(docs)
    texts = [synthetic_ticket(tokenizer, rng.randint(150, 250), seed=i) for i in range(docs)]
    schema = synthetic_schema(fields)
    times: dict[str, list[float]] = {name: [] for name in runners}
    answers: dict[str, Any] = {}
    try:
        for rep in range(reps + 1):
            for name in (list(runners) if rep % 2 else list(reversed(runners))):
                GPUModelRunner._update_states = runners[name]
                start = time.perf_counter()
                results = constrained(llm, texts, schema, cache_salt=f"copy-{name}-{rep}")
                if rep:
                    times[name].append(time.perf_counter() - start)
                answers.setdefault(name, [[f.scores for f in r.fields] for r in results])
    finally:
        GPUModelRunner._update_states = pcd
    if answers["vllm"] != answers["pcd"]:
        raise AssertionError("the two copies gave different scores")
    median = {name: statistics.median(t) for name, t in times.items()}
    return {"model": Path(model).name, "fields": fields, "docs": docs,
            "vllm_s": median["vllm"], "pcd_s": median["pcd"],
            "ratio": median["vllm"] / median["pcd"]}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_kv_copy",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=[str(default_model_path())])
    parser.add_argument("--branches", type=int, nargs="+", default=[8, 32, 256])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--engine", action="store_true", help="end to end, in one engine")
    parser.add_argument("--fields", type=int, default=32)
    parser.add_argument("--docs", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args(argv)
    if args.engine:
        rows = [engine_calls(args.model[0], args.fields, d, args.reps) for d in args.docs]
        print(f"commit {provenance()['commit']}; in-process engine, bf16, {args.fields} fields;"
              f" median of {args.reps} calls each, alternating; identical scores")
        print(f"{'model':<32} {'docs':>5} {'vLLM s':>7} {'PCD s':>7} {'vLLM/PCD':>8}")
        for r in rows:
            print(f"{r['model']:<32} {r['docs']:>5} {r['vllm_s']:>7.3f} {r['pcd_s']:>7.3f} "
                  f"{r['ratio']:>7.2f}x")
        return rows
    rows = [measure(m, b, args.reps) for m in args.model for b in args.branches]
    print(f"commit {provenance()['commit']}; bf16 caches, CPU attention layout, "
          f"{BLOCK_SIZE}-token blocks; median of {args.reps}, alternating order")
    print(f"{'model':<32} {'branches':>8} {'block MB':>8} {'vLLM ms':>8} {'PCD ms':>8} "
          f"{'vLLM/PCD':>8}")
    for r in rows:
        print(f"{r['model']:<32} {r['branches']:>8} {r['block_mb']:>8.2f} {r['vllm_ms']:>8.1f} "
              f"{r['pcd_ms']:>8.1f} {r['ratio']:>7.2f}x")
    return rows


if __name__ == "__main__":
    main()
