"""Tokens computed and latency of PCD, two executions side by side in one run.

    python -m benchmarks.bench_fork [--compare fork|trie] [--fields 1 8 32]
                                    [--contexts 100 300 1000] [--reps 3]

`--compare fork` (token mode): the KV fork on and off; each gets its own offline bf16
`vllm.LLM` whose engine core (a subprocess) reads `PCD_FORK` when it starts.
`--compare trie` (sequence mode): trie nodes chained (each trie token computed once, one call
per trie level) and flat (every node in one call, recomputing its path), on one engine.
Every call runs under a fresh cache salt, so none reuses another's blocks; the first call of
each cell warms it up and is not timed. "ideal" is shared context + every distinct branch
token; "computed" is what the engine reports it ran.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.workloads import synthetic_schema, synthetic_ticket
from benchmarks.client import load_tokenizer
from vllm_pcd.engine import TRIE_ENV
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


# Per comparison: the PCD mode, the environment variable it flips, and its two settings.
COMPARISONS = {"fork": ("token", ENV, ("1", "0")),
               "trie": ("sequence", TRIE_ENV, ("chained", "flat"))}


def start_engine(model: str) -> Any:
    os.environ.setdefault("VLLM_PLUGINS", "pcd")  # the engine patches are what it measures
    from vllm import LLM

    return LLM(model, dtype="bfloat16", enable_prefix_caching=True, disable_log_stats=False,
               max_model_len=4096, seed=0)


def measure(llm: Any, mode: str, tag: str, cells: list[Cell], reps: int) -> list[Row]:
    """Every cell on one engine: the median latency and what the last call computed."""
    from vllm_pcd import constrained

    rows = []
    for cell in cells:
        salt = f"bench-{tag}-{cell.fields}-{cell.context}"
        constrained(llm, cell.text, cell.schema, mode=mode, cache_salt=f"{salt}-warm")
        latencies = []
        for rep in range(reps):
            start = time.perf_counter()
            result = constrained(llm, cell.text, cell.schema, mode=mode,
                                 cache_salt=f"{salt}-{rep}")
            latencies.append(time.perf_counter() - start)
        shared = len(result.plan.shared_ids)
        rows.append(Row(shared, shared + result.plan.branch_tokens,
                        result.execution.tokens_computed, result.execution.backbone_calls,
                        statistics.median(latencies)))
    return rows


def compare(model: str, comparison: str, cells: list[Cell], reps: int) -> list[list[Row]]:
    """Both settings; the fork needs an engine each (its core reads the variable at start)."""
    mode, env, settings = COMPARISONS[comparison]
    results, llm = [], None
    try:
        for setting in settings:
            os.environ[env] = setting
            if llm is None or env == ENV:
                if llm is not None:
                    llm.llm_engine.engine_core.shutdown()
                llm = start_engine(model)
            results.append(measure(llm, mode, f"{comparison}-{setting}", cells, reps))
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
    return results


def table(cells: list[Cell], labels: tuple[str, str], a_rows: list[Row],
          b_rows: list[Row]) -> str:
    a_head, b_head = (f"{label}: computed" for label in labels)
    head = (f"{'fields':>6} {'context':>7} {'shared':>6} {'ideal':>6} | "
            f"{a_head:>18} {'calls':>5} {'latency':>8} | "
            f"{b_head:>18} {'calls':>5} {'latency':>8}")
    lines = [head, "-" * len(head)]
    for cell, a, b in zip(cells, a_rows, b_rows):
        lines.append(f"{cell.fields:>6} {cell.context:>7} {a.shared:>6} {a.ideal:>6} | "
                     f"{a.computed:>18} {a.backbone_calls!s:>5} {a.latency_s:>7.2f}s | "
                     f"{b.computed:>18} {b.backbone_calls!s:>5} {b.latency_s:>7.2f}s")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_fork",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="fork")
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
    first, second = compare(args.model, args.compare, cells, args.reps)
    _, env, settings = COMPARISONS[args.compare]
    report = table(cells, tuple(f"{env}={s}" for s in settings), first, second)
    print(report)
    return report


if __name__ == "__main__":
    main()
