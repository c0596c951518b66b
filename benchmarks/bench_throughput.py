"""Many documents, one schema: documents per second and tokens computed per document.

    python -m benchmarks.bench_throughput [--quick] [--docs 64] [--fields 8 32]
                                          [--concurrency 1 8 32] [--url URL] [--model PATH]

Documents are synthetic support tickets of varied length (about 50 to 250 tokens). Each row
(a method in a layout) runs every document once per (schema, concurrency) cell, under one
cache salt for the whole cell: one tenant sending its documents, so a layout that puts the
schema first has it cached after the unmeasured warm-up document, for PCD and AR alike. No
cell reuses another's KV blocks. At concurrency 1 only the first `--sequential-docs`
documents run (that cell measures latency, and AR takes seconds per document).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.bench_latency import RESULTS
from benchmarks.workloads import synthetic_schema, synthetic_ticket
from benchmarks.harness import (measure_and_publish, panel_row, provenance, save_figure,
                                server_parser)
from benchmarks.client import Client, Outcome, Task, load_tokenizer, make_task
from benchmarks.methods import run_method
from benchmarks.metrics import is_schema_valid, median

# (method, layout) rows; AR JSON gets the field list first, so it shares the prefix cache too.
# The default layout (`schema_first_auto`, a recap line at these sizes) and the restated one
# have floors of their own: each adds a line per document.
ROWS = [("pcd_token", "schema_first"), ("pcd_token", "document_first"),
        ("ar_json", "schema_first"), ("per_field", "schema_first"), ("floor", "schema_first"),
        ("pcd_token", "schema_first_restated"), ("floor", "schema_first_restated"),
        ("pcd_token", "schema_first_auto"), ("floor", "schema_first_auto")]
BASELINE = ("ar_json", "schema_first")


def documents(tokenizer: Any, count: int, seed: int = 16) -> list[str]:
    rng = random.Random(seed)
    return [synthetic_ticket(tokenizer, rng.randint(50, 250), seed=seed + i) for i in range(count)]


async def measure(client: Client, tokenizer: Any, schema: dict[str, Any], docs: list[str],
                  method: str, layout: str, concurrency: int, bar: tqdm) -> dict[str, Any]:
    """Every document through `concurrency` workers under one salt, after a warm-up call."""
    salt = f"throughput-{uuid.uuid4().hex}"
    tasks = [make_task(tokenizer, schema, [{"role": "user", "content": d}], layout)
             for d in docs]
    warm = make_task(tokenizer, schema, [{"role": "user", "content": "Hello, a quick question."}],
                     layout)
    first = await run_method(method, client, warm, salt)
    if first.status.startswith("unsupported"):
        bar.update(len(docs))
        return {"status": first.status}
    queue: asyncio.Queue[Task] = asyncio.Queue()
    for task in tasks:
        queue.put_nowait(task)
    outcomes: list[tuple[Task, Outcome]] = []

    async def worker() -> None:
        while not queue.empty():
            task = queue.get_nowait()
            outcomes.append((task, await run_method(method, client, task, salt)))
            bar.update()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    good = [(t, o) for t, o in outcomes if o.ok]
    failed = [o.status for _, o in outcomes if not o.ok]
    computed = [o.tokens_computed for _, o in good]
    return {
        "status": failed[0] if failed else "ok",
        "documents": len(outcomes), "failed": len(failed), "wall_s": wall,
        "docs_per_s": len(good) / wall,
        "median_s": median([o.latency_s for _, o in good]),
        "tokens_per_doc": None if None in computed or not computed else sum(computed) / len(good),
        "schema_valid": all(is_schema_valid(schema, o.object) for _, o in good)
        if method != "floor" else None,
    }


async def run(args: argparse.Namespace, url: str, serving: str) -> dict[str, Any]:
    code = provenance()
    tokenizer = load_tokenizer(args.model)
    docs = documents(tokenizer, args.docs)
    client = await Client(url).connect()
    cells = []
    per_level = {c: len(docs) if c > 1 else min(len(docs), args.sequential_docs)
                 for c in args.concurrency}
    chosen = [row for row in ROWS if f"{row[0]}@{row[1]}" in args.rows]
    total = len(args.fields) * len(chosen) * sum(per_level.values())
    try:
        with tqdm(total=total, desc="throughput", unit="doc", file=sys.stderr) as bar:
            for n_fields in args.fields:
                schema = synthetic_schema(n_fields)
                for level in args.concurrency:
                    rows = {}
                    for method, layout in chosen:
                        bar.set_postfix_str(f"{n_fields} fields, c={level}, {method} {layout}")
                        rows[f"{method}@{layout}"] = await measure(
                            client, tokenizer, schema, docs[:per_level[level]], method, layout,
                            level, bar)
                    cells.append({"fields": n_fields, "concurrency": level, "rows": rows})
    finally:
        await client.close()
    return {"serving": serving, "model": str(args.model), "code": code,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "documents": len(docs),
            "document_tokens": [len(tokenizer.encode(d, add_special_tokens=False)) for d in docs],
            "cells": cells}


def _ratio(a: float | None, b: float | None, digits: int = 1) -> str:
    return "-" if not a or not b else f"×{a / b:.{digits}f}"


def table(results: dict[str, Any]) -> str:
    """Markdown: per cell and row, docs/s and its ratio to AR JSON's and the floor's, the median
    latency and its ratio to AR's (at c=1, time per document), tokens per document and their
    ratio to the floor's (the floor of the row's own layout where it was run). A row not run
    leaves its ratios blank."""
    base = f"{BASELINE[0]}@{BASELINE[1]}"
    lines = [f"{results['documents']} documents; {results['serving']}", "",
             "| fields | conc | method @ layout | docs/s | vs AR | vs floor | median s "
             "| latency vs AR | tokens/doc | vs floor |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cell in results["cells"]:
        ar = cell["rows"].get(base, {})
        for name, row in cell["rows"].items():
            floor = (cell["rows"].get(f"floor@{name.split('@')[1]}")
                     or cell["rows"].get("floor@schema_first", {}))
            if row.get("median_s") is None:  # unsupported, or every document failed
                lines.append(f"| {cell['fields']} | {cell['concurrency']} | {name} | "
                             f"{row['status']} | | | | | | |")
                continue
            tokens, least = row["tokens_per_doc"], floor.get("tokens_per_doc")
            versus = "-" if tokens is None or not least else f"{tokens / least:.2f}"
            lines.append(
                f"| {cell['fields']} | {cell['concurrency']} | {name} | {row['docs_per_s']:.2f} | "
                f"{_ratio(row['docs_per_s'], ar.get('docs_per_s'))} | "
                f"{_ratio(row['docs_per_s'], floor.get('docs_per_s'), 2)} | "
                f"{row['median_s']:.3f} | {_ratio(ar.get('median_s'), row['median_s'])} | "
                f"{'-' if tokens is None else round(tokens)} | {versus} |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    fields = sorted({c["fields"] for c in results["cells"]})
    fig, axes = panel_row(len(fields))
    for ax, n in zip(axes, fields):
        mine = [c for c in results["cells"] if c["fields"] == n]
        for name in mine[0]["rows"]:
            points = [(c["concurrency"], c["rows"][name]["docs_per_s"]) for c in mine
                      if c["rows"][name].get("docs_per_s")]
            if points:
                ax.plot(*zip(*points), marker="o", label=name)
        ax.set(title=f"{n} fields", xlabel="concurrent clients", ylabel="documents / s",
               xscale="log", yscale="log")
        ax.set_xticks([c["concurrency"] for c in mine], [str(c["concurrency"]) for c in mine])
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"vllm-pcd throughput, higher is better\n{results['serving']}", fontsize=9)
    save_figure(fig, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = server_parser("throughput", __doc__, "4 documents, 3 fields, c=1,2")
    parser.add_argument("--docs", type=int, default=64)
    parser.add_argument("--sequential-docs", type=int, default=16)
    parser.add_argument("--fields", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    names = [f"{method}@{layout}" for method, layout in ROWS]
    parser.add_argument("--rows", nargs="+", default=names, choices=names, metavar="ROW",
                        help=f"method@layout rows to run (default all: {' '.join(names)})")
    args = parser.parse_args(argv)
    if args.quick:
        args.docs, args.sequential_docs, args.fields, args.concurrency = 4, 2, [3], [1, 2]
    args.out = args.out or RESULTS / ("throughput-quick" if args.quick else "throughput")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return measure_and_publish(parse_args(argv), run, plot, table)


if __name__ == "__main__":
    main()
