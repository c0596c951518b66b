"""The branch step's attention on a CPU worker: a call's branches against one request of the
same queries, side by side in vLLM's CPU attention kernel.

    python -m benchmarks.bench_branch_attention [--model PATH ...] [--heads 9/3 12/2 ...]
        [--context 840] [--branches 32] [--query-lens 3 4 5 6 7 8] [--groups 1 8] [--cold]

A call's branch step asks the kernel for `--branches` requests of a few query tokens each (a
field's stem), every one over the same `--context` tokens of shared KV (full blocks shared,
the tail block a private copy each, as the fork leaves them). The floor asks for the same
number of query positions in one request at the end of its prompt. Both read the same keys,
so a kernel that handled a shared prefix once per group would cost what the one request
costs: the ratio printed is what per-branch work items cost beyond that, per layer, measured.
Head shapes come from each model's config (query heads / KV heads) or from `--heads`. The
dtype is the one `python -m vllm_pcd.models dtype` picks; the kernel's ISA is vLLM's choice
for it. Needs vLLM's CPU build.
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


def heads_of(model: str) -> tuple[int, int, int]:
    """(query heads, KV heads, head size) from a model's config."""
    config = json.loads((Path(model) / "config.json").read_text())
    heads = config["num_attention_heads"]
    return (heads, config.get("num_key_value_heads", heads),
            config.get("head_dim", config["hidden_size"] // heads))


Request = tuple[int, int, list[int]]  # query tokens, prompt tokens, block ids


def kernel_call(shape: tuple[int, int, int], dtype: Any, requests: list[Request],
                num_blocks: int) -> Callable[[], None]:
    """One call of the CPU attention op over `requests`, their queries at their prompts'
    ends (causal)."""
    import torch
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    q_heads, kv_heads, head = shape
    isa = _get_attn_isa(dtype, BLOCK_SIZE, head)
    cache = (torch.randn(num_blocks, kv_heads, BLOCK_SIZE * 2, head) * 0.1).to(dtype)
    key_cache, value_cache = cache.chunk(2, dim=2)
    query_lens = torch.tensor([q for q, _, _ in requests], dtype=torch.int32)
    starts = torch.zeros(len(requests) + 1, dtype=torch.int32)
    starts[1:] = torch.cumsum(query_lens, 0)
    seq_lens = torch.tensor([n for _, n, _ in requests], dtype=torch.int32)
    table = torch.zeros(len(requests), max(len(b) for _, _, b in requests), dtype=torch.int32)
    for row, (_, _, blocks) in enumerate(requests):
        table[row, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    query = torch.randn(int(starts[-1]), q_heads, head).to(dtype)
    output = torch.empty_like(query)
    metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(requests), num_heads=q_heads, num_kv_heads=kv_heads, head_dim=head,
        seq_lens=seq_lens, dtype=dtype, query_start_loc=starts, causal=True,
        sliding_window_size=-1, isa=isa, enable_kv_split=True)
    return lambda: ops.cpu_attention_with_kv_cache(
        query=query, key_cache=key_cache, value_cache=value_cache, output=output,
        query_start_loc=starts, seq_lens=seq_lens, scale=head ** -0.5, causal=True,
        alibi_slopes=None, sliding_window=-1, block_table=table, softcap=0.0,
        scheduler_metadata=metadata, s_aux=None)


def blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


def measure(shape: tuple[int, int, int], dtype: Any, context: int, branches: int,
            query_len: int, reps: int, groups: int = 1, cold: bool = False) -> dict[str, Any]:
    """Median seconds of one layer's attention, per call: `groups` calls' branches in one
    step, and one request each of the same query positions over the same context, called
    alternately. Each group's context differs in length, as documents do; `cold` evicts
    the CPU caches before every call, as a step's other layers and requests would."""
    branch_requests, one_requests, branch_blocks, one_blocks = [], [], 0, 0
    for group in range(groups):
        tokens = context + 37 * group
        shared = tokens // BLOCK_SIZE  # full blocks, shared; the tail is a private copy each
        own = blocks_for(tokens + query_len) - shared
        branch_requests += [(query_len, tokens + query_len,
                             [branch_blocks + k for k in range(shared)]
                             + [branch_blocks + shared + b * own + k for k in range(own)])
                            for b in range(branches)]
        branch_blocks += shared + branches * own
        one = blocks_for(tokens + branches * query_len)
        one_requests.append((branches * query_len, tokens + branches * query_len,
                             [one_blocks + k for k in range(one)]))
        one_blocks += one
    calls = {"branches": kernel_call(shape, dtype, branch_requests, branch_blocks),
             "one_request": kernel_call(shape, dtype, one_requests, one_blocks)}
    evict = evictor() if cold else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for rep in range(reps + 3):
        for name, call in calls.items():
            evict()
            start = time.perf_counter()
            call()
            if rep >= 3:  # the first calls warm up
                times[name].append(time.perf_counter() - start)
    branch_s, one_s = (statistics.median(times[n]) / groups for n in ("branches", "one_request"))
    return {"heads": f"{shape[0]}/{shape[1]}", "head_size": shape[2], "context": context,
            "branches": branches, "query_len": query_len, "groups": groups, "cold": cold,
            "branches_ms": branch_s * 1e3, "one_request_ms": one_s * 1e3,
            "ratio": branch_s / one_s}


def evictor() -> Callable[[], None]:
    """Writing 64 MiB pushes a small KV working set out of the CPU's caches."""
    import torch

    junk = torch.zeros(64 * 2**20, dtype=torch.uint8)
    return lambda: junk.add_(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="*", default=[])
    parser.add_argument("--heads", nargs="*", default=[],
                        help="query/KV heads, e.g. 9/3, with the head size of 64")
    parser.add_argument("--context", type=int, default=840)
    parser.add_argument("--branches", type=int, default=32)
    parser.add_argument("--query-lens", type=int, nargs="+", default=[3, 4, 5, 6, 7, 8])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--groups", type=int, nargs="+", default=[1],
                        help="calls whose branches share one step")
    parser.add_argument("--cold", action="store_true", help="evict the caches before each call")
    args = parser.parse_args()

    import torch

    from vllm_pcd.models import fast_dtype

    dtype = getattr(torch, fast_dtype())
    # oneDNN asks the kernel for the AMX tile state on first use; the attention op does not.
    torch.nn.functional.linear(torch.ones(32, 64, dtype=dtype), torch.ones(64, 64, dtype=dtype))
    shapes = [(Path(name).name, heads_of(name)) for name in args.model or
              ([] if args.heads else [str(default_model_path())])]
    shapes += [("-", (*map(int, h.split("/")), 64)) for h in args.heads]
    print(json.dumps(provenance()))
    caches = "cold" if args.cold else "warm"
    print(f"dtype {dtype}; one layer's attention a call, median of {args.reps}; context "
          f"{args.context}, {args.branches} branches a call; caches {caches}")
    print("| model | heads | calls in the step | query tokens a branch | branches ms "
          "| one request ms | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, shape in shapes:
        for groups in args.groups:
            for query_len in args.query_lens:
                row = measure(shape, dtype, args.context, args.branches, query_len, args.reps,
                              groups, args.cold)
                print(f"| {name} | {row['heads']} | {groups} | {query_len} | "
                      f"{row['branches_ms']:.3f} | {row['one_request_ms']:.3f} | "
                      f"×{row['ratio']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
