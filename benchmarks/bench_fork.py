"""Tokens computed and latency of token-mode PCD with the KV fork on and off, in one run.

    python -m benchmarks.bench_fork [--fields 1 8 32] [--contexts 100 300 1000] [--reps 3]

Each mode gets its own offline bf16 `vllm.LLM` whose engine core (a subprocess) reads
`PCD_FORK` when it starts. Every call runs under a fresh cache salt, so none reuses another's
blocks; the first call of each cell warms it up and is not timed. "ideal" is shared context +
every branch's own tokens; "computed" is what the engine reports it ran.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.bench_latency import synthetic_schema, synthetic_ticket
from benchmarks.methods import load_tokenizer
from vllm_pcd.internals.fork import ENV
from vllm_pcd.models import default_model_path


@dataclass(frozen=True)
class Cell:
    fields: int
    context: int
    text: str
    schema: dict[str, Any]


@dataclass(frozen=True)
class Row:
    shared: int
    ideal: int
    computed: int
    backbone_calls: int | None
    latency_s: float


def measure(model: str, fork_on: bool, cells: list[Cell], reps: int) -> list[Row]:
    """One engine, every cell: the median latency and what the last call computed."""
    from vllm import LLM

    from vllm_pcd import constrained

    os.environ[ENV] = "1" if fork_on else "0"
    mode = "on" if fork_on else "off"
    llm = LLM(model, dtype="bfloat16", enable_prefix_caching=True, disable_log_stats=False,
              max_model_len=4096, seed=0)
    rows = []
    try:
        for cell in cells:
            tag = f"bench-fork-{mode}-{cell.fields}-{cell.context}"
            constrained(llm, cell.text, cell.schema, cache_salt=f"{tag}-warm")
            latencies = []
            for rep in range(reps):
                start = time.perf_counter()
                result = constrained(llm, cell.text, cell.schema, cache_salt=f"{tag}-{rep}")
                latencies.append(time.perf_counter() - start)
            shared = len(result.plan.shared_ids)
            rows.append(Row(shared, shared + result.plan.branch_tokens,
                            result.execution.tokens_computed, result.execution.backbone_calls,
                            statistics.median(latencies)))
    finally:
        llm.llm_engine.engine_core.shutdown()
    return rows


def table(cells: list[Cell], on: list[Row], off: list[Row]) -> str:
    head = (f"{'fields':>6} {'context':>7} {'shared':>6} {'ideal':>6} | "
            f"{'fork on: computed':>17} {'calls':>5} {'latency':>8} | "
            f"{'fork off: computed':>18} {'calls':>5} {'latency':>8}")
    lines = [head, "-" * len(head)]
    for cell, a, b in zip(cells, on, off):
        lines.append(f"{cell.fields:>6} {cell.context:>7} {a.shared:>6} {a.ideal:>6} | "
                     f"{a.computed:>17} {a.backbone_calls!s:>5} {a.latency_s:>7.2f}s | "
                     f"{b.computed:>18} {b.backbone_calls!s:>5} {b.latency_s:>7.2f}s")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_fork",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--fields", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--contexts", type=int, nargs="+", default=[100, 300, 1000],
                        help="conversation length in tokens (the field list comes on top)")
    parser.add_argument("--reps", type=int, default=3)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    tokenizer = load_tokenizer(args.model)
    cells = [Cell(f, c, synthetic_ticket(tokenizer, c), synthetic_schema(f))
             for f in args.fields for c in args.contexts]
    on = measure(args.model, True, cells, args.reps)
    off = measure(args.model, False, cells, args.reps)
    report = table(cells, on, off)
    print(report)
    return report


if __name__ == "__main__":
    main()
