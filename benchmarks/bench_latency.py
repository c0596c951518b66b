"""Latency of every method against one server, over schema sizes and context lengths.

    python -m benchmarks.bench_latency [--quick] [--url URL] [--model PATH]

Each (fields, context) cell builds one synthetic support ticket and schema, warms every
method once on it (unmeasured: pays compilation and grammar set-up), then times `--reps`
rounds, each call under a fresh cache salt so no call reuses another's KV blocks.
Results (JSON + PNG) go to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.harness import (add_server_flags, measure_and_publish, panel_row, provenance,
                                save_figure)
from benchmarks.client import Client, Outcome, Task, load_tokenizer, make_task
from benchmarks.methods import ANSWERING, METHODS, run_method
from benchmarks.metrics import is_schema_valid, median, p90
from benchmarks.workloads import synthetic_schema, synthetic_ticket

RESULTS = Path(__file__).resolve().parent / "results"
BASELINE = "pcd_token"

def summarize(outcomes: list[Outcome], schema: dict[str, Any], answers: bool) -> dict[str, Any]:
    failed = [o.status for o in outcomes if not o.ok]
    good = [o for o in outcomes if o.ok]
    latencies = [o.latency_s for o in good]

    def middle(values: list[int | None]) -> float | None:
        return None if not values or None in values else median(values)

    return {
        "status": failed[0] if failed else "ok",
        "runs": len(good),
        "latency_s": latencies,
        "median_s": median(latencies),
        "p90_s": p90(latencies),
        "tokens_computed": middle([o.tokens_computed for o in good]),
        "backbone_calls": middle([o.backbone_calls for o in good]),
        "schema_valid": (all(is_schema_valid(schema, o.object) for o in good) if answers
                         else None),
    }


async def measure_cell(client: Client, task: Task, methods: list[str], reps: int,
                       bar: tqdm) -> dict[str, dict[str, Any]]:
    warm = {}
    for name in methods:
        warm[name] = await run_method(name, client, task)
        bar.update()
    runs: dict[str, list[Outcome]] = {name: [] for name in methods}
    live = [m for m in methods if not warm[m].status.startswith("unsupported")]
    bar.update((len(methods) - len(live)) * reps)
    for rep in range(reps):
        # Rotate the order each round so slow drifts on a shared machine hit every method.
        shift = rep % max(len(live), 1)
        for name in live[shift:] + live[:shift]:
            runs[name].append(await run_method(name, client, task))
            bar.update()
    summary = {}
    for name in methods:
        outcomes = runs[name] if name in live else [warm[name]]
        summary[name] = summarize(outcomes, task.schema, name in ANSWERING)
    base = summary.get(BASELINE, {}).get("median_s")
    for row in summary.values():
        row["ratio"] = (row["median_s"] / base if base and row["median_s"] is not None
                        else None)
    return summary


async def concurrency_sweep(client: Client, task: Task, levels: list[int], reps: int,
                            bar: tqdm) -> list[dict[str, Any]]:
    """`level` PCD token requests at once, `reps` waves: throughput and per-request latency."""
    rows = []
    for level in levels:
        outcomes: list[Outcome] = []
        start = time.perf_counter()
        for _ in range(reps):
            outcomes += await asyncio.gather(*(run_method(BASELINE, client, task)
                                               for _ in range(level)))
            bar.update(level)
        wall = time.perf_counter() - start
        latencies = [o.latency_s for o in outcomes if o.ok]
        rows.append({"concurrency": level, "requests": len(outcomes),
                     "failed": len(outcomes) - len(latencies), "wall_s": wall,
                     "req_per_s": len(latencies) / wall, "median_s": median(latencies),
                     "p90_s": p90(latencies)})
    return rows


def plot(cells: list[dict[str, Any]], methods: list[str], title: str, path: Path) -> None:
    from matplotlib.ticker import FuncFormatter, NullLocator

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    # Minor ticks at 2, 3 and 5 per decade only; more crowd the log axis.
    sparse = FuncFormatter(lambda value, _: f"{value:g}" if f"{value:.0e}"[0] in "235" else "")

    contexts = sorted({c["context_tokens"] for c in cells})
    fig, axes = panel_row(len(contexts))
    for ax, ctx in zip(axes, contexts):
        mine = sorted((c for c in cells if c["context_tokens"] == ctx), key=lambda c: c["fields"])
        for name in methods:
            points = [(c["fields"], c["methods"][name]["median_s"]) for c in mine
                      if c["methods"][name]["median_s"] is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=name)
        ax.set(title=f"context ≈ {ctx} tokens", xlabel="fields", ylabel="median latency (s)",
               xscale="log", yscale="log")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks([c["fields"] for c in mine], [str(c["fields"]) for c in mine])
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(sparse)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"vllm-pcd latency per method, lower is better\n{title}", fontsize=10)
    save_figure(fig, path)


def _cell_text(row: dict[str, Any]) -> str:
    if row["status"].startswith("unsupported"):
        return "unsupported"
    if row["median_s"] is None:
        return "error"
    ratio = f" x{row['ratio']:.2f}" if row["ratio"] is not None else ""
    return f"{row['median_s']:.3f}s{ratio}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def table(results: dict[str, Any]) -> str:
    methods = results["methods"]
    width = max(14, *(len(m) for m in methods))
    head = f"{'fields':>6} {'ctx':>5} {'shared':>6} " + " ".join(f"{m:>{width}}" for m in methods)
    lines = ["median latency and ratio to pcd_token", head]
    for cell in results["cells"]:
        lead = f"{cell['fields']:>6} {cell['context_tokens']:>5} {cell['shared_tokens']:>6} "
        lines.append(lead + " ".join(f"{_cell_text(cell['methods'][m]):>{width}}"
                                     for m in methods))
    lines += ["", "tokens computed / backbone calls (median; - = not observable)", head]
    for cell in results["cells"]:
        lead = f"{cell['fields']:>6} {cell['context_tokens']:>5} {cell['shared_tokens']:>6} "
        lines.append(lead + " ".join(
            f"{_num(r['tokens_computed']) + ' / ' + _num(r['backbone_calls']):>{width}}"
            for r in (cell["methods"][m] for m in methods)))
    lines += ["", "concurrency sweep (pcd_token, "
              f"{results['sweep']['fields']} fields, ctx ~{results['sweep']['context_tokens']})",
              f"{'conc':>5} {'req/s':>7} {'median_s':>9} {'p90_s':>7} {'failed':>6}"]
    for row in results["concurrency"]:
        lines.append(f"{row['concurrency']:>5} {row['req_per_s']:>7.2f} "
                     f"{_num(row['median_s'] and round(row['median_s'], 3)):>9} "
                     f"{_num(row['p90_s'] and round(row['p90_s'], 3)):>7} {row['failed']:>6}")
    notes = {m: s for cell in results["cells"] for m, r in cell["methods"].items()
             if (s := r["status"]) != "ok"}
    lines += [f"{m}: {s}" for m, s in notes.items()]
    lines.append(results["serving"])
    return "\n".join(lines)


async def run(args: argparse.Namespace, url: str, serving: str) -> dict[str, Any]:
    code = provenance()  # before the (long) run, while the tree is the one being served
    tokenizer = load_tokenizer(args.model)
    client = await Client(url).connect()
    grid = [(f, c) for c in args.contexts for f in args.fields]
    total = (len(grid) * len(args.methods) * (args.reps + 1)
             + sum(args.concurrency) * args.reps)
    cells = []
    try:
        with tqdm(total=total, desc="bench", unit="call", file=sys.stderr) as bar:
            for n_fields, ctx in grid:
                ticket = synthetic_ticket(tokenizer, ctx, seed=ctx)
                task = make_task(tokenizer, synthetic_schema(n_fields),
                                 [{"role": "user", "content": ticket}])
                bar.set_postfix_str(f"{n_fields} fields, ctx {ctx}")
                cells.append({"fields": n_fields, "context_tokens": ctx,
                              "shared_tokens": len(task.plan.shared_ids),
                              "branch_tokens": task.plan.branch_tokens,
                              "methods": await measure_cell(client, task, args.methods,
                                                            args.reps, bar)})
            sweep_task = make_task(tokenizer, synthetic_schema(args.sweep_fields),
                                   [{"role": "user", "content": synthetic_ticket(
                                       tokenizer, args.sweep_context, seed=args.sweep_context)}])
            await run_method(BASELINE, client, sweep_task)  # warm this schema
            bar.set_postfix_str("concurrency")
            sweep = await concurrency_sweep(client, sweep_task, args.concurrency, args.reps, bar)
    finally:
        await client.close()
    return {
        "serving": serving,
        "model": str(args.model),
        "url": url,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "processor": platform.processor()},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "code": code,
        "reps": args.reps,
        "methods": args.methods,
        "cells": cells,
        "sweep": {"fields": args.sweep_fields, "context_tokens": args.sweep_context},
        "concurrency": sweep,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from vllm_pcd.models import default_model_path

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_latency",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="attach to a running server instead of starting one "
                        "(it must have the pcd plugin and the xgrammar flags of SERVER_ARGS)")
    parser.add_argument("--model", default=str(default_model_path()),
                        help="model folder (served, and its tokenizer builds the plans)")
    parser.add_argument("--quick", action="store_true",
                        help="fields 1,3; context 100; 1 rep; concurrency 1,2")
    add_server_flags(parser)
    parser.add_argument("--fields", type=int, nargs="+", default=[1, 3, 8, 16, 32])
    parser.add_argument("--contexts", type=int, nargs="+", default=[100, 300, 1000],
                        help="approximate conversation tokens")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--sweep-fields", type=int, default=8)
    parser.add_argument("--sweep-context", type=int, default=300)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--out", type=Path, help="output path without suffix "
                        "(default benchmarks/results/latency[-quick])")
    args = parser.parse_args(argv)
    if args.quick:
        args.fields, args.contexts, args.reps = [1, 3], [100], 1
        args.concurrency, args.sweep_fields, args.sweep_context = [1, 2], 3, 100
    if BASELINE not in args.methods:
        args.methods.insert(0, BASELINE)
    args.out = args.out or RESULTS / ("latency-quick" if args.quick else "latency")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return measure_and_publish(
        args, run, lambda results, path: plot(results["cells"], args.methods,
                                              results["serving"], path), table)


if __name__ == "__main__":
    main()
