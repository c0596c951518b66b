"""A neighbour's latency beside PCD traffic, against the same clients sending other methods.

    python -m benchmarks.bench_neighbours [--quick] [--fields 8 32] [--load-clients 8]
                                          [--neighbour-calls 10] [--reps 2] [--rows ROW ...]

PCD shares a server with other clients, so its engine requests may slow a neighbour no more
than ordinary requests of the same prompts would. One neighbour streams plain chat completions
(`--neighbour-tokens` greedy tokens, `ignore_eos`, each under a fresh cache salt) one after
another, while `--load-clients` clients send the documents by one method, under one salt per
run (a tenant whose field list is cached). The neighbour's time to first token (TTFT) and time
per output token after it (TPOT) are what it feels; the load's documents/s say what the load
got done meanwhile. Arms (no load, then each row) alternate on one server, `--reps` times.
No call finds its document cached: when the load has sent all `--docs` documents, it goes on
under a new salt (its next calls prefill the field list again).

The floor's row sends each document's PCD context as an ordinary one-token request: the least
any method must prefill. A row that slows the neighbour more than the floor does takes more
than the share of its prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from typing import Any, Iterator

from tqdm import tqdm

from benchmarks.bench_latency import RESULTS
from benchmarks.workloads import synthetic_schema
from benchmarks.bench_throughput import documents
from benchmarks.client import Client, load_tokenizer, make_task
from benchmarks.harness import (measure_and_publish, panel_row, provenance, save_figure,
                                server_parser)
from benchmarks.methods import run_method
from benchmarks.metrics import median, percentile

ROWS = ["pcd_token@schema_first_auto", "floor@schema_first_auto", "ar_json@schema_first"]
ALONE = "alone"
PROMPT = "Tell the story of a lighthouse keeper who finds a message in a bottle."


async def neighbour_call(client: Client, tokens: int) -> tuple[float, float] | None:
    """One streamed completion: (TTFT, TPOT) in seconds, None if it gave under two tokens."""
    start = time.perf_counter()
    stamps: list[float] = []
    stream = await client.api.chat.completions.create(
        model=client.model, messages=[{"role": "user", "content": PROMPT}], temperature=0,
        max_tokens=tokens, stream=True,
        extra_body={"ignore_eos": True, "cache_salt": f"neighbour-{uuid.uuid4().hex}"})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
    if len(stamps) < 2:
        return None
    return stamps[0] - start, (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def salted(tasks: list[Any]) -> Iterator[tuple[str, Any]]:
    """(salt, task): the tasks round and round, each round under a new salt, so no call finds
    its document cached."""
    while tasks:
        salt = f"neighbours-{uuid.uuid4().hex}"
        for task in tasks:
            yield salt, task


async def arm(client: Client, tasks: list[Any], row: str, args: argparse.Namespace
              ) -> dict[str, Any]:
    """The neighbour's calls while `--load-clients` clients send `tasks` by `row`'s method
    (none for ALONE); the load starts first and is warm when the neighbour begins."""
    method = row.split("@")[0]
    stop = asyncio.Event()
    done: list[float] = []  # completion times of load calls that answered
    failures: list[str] = []
    calls = salted(tasks)

    async def load() -> None:
        while not stop.is_set():
            salt, task = next(calls)
            outcome = await run_method(method, client, task, salt)
            if outcome.ok:
                done.append(time.perf_counter())
            else:
                failures.append(outcome.status)

    workers = [] if row == ALONE else [asyncio.create_task(load())
                                       for _ in range(args.load_clients)]
    while workers and not done and not failures:  # the load's first answer: schema cached
        await asyncio.sleep(0.05)
    start = time.perf_counter()
    timings = [await neighbour_call(client, args.neighbour_tokens)
               for _ in range(args.neighbour_calls)]
    end = time.perf_counter()
    stop.set()
    await asyncio.gather(*workers)
    timed = [c for c in timings if c is not None]
    return {"ttft_s": median([c[0] for c in timed]), "tpot_s": median([c[1] for c in timed]),
            "tpot_p90_s": percentile([c[1] for c in timed], 90),
            "neighbour_calls": len(timed),
            "load_answered": len(done),
            "load_docs_per_s": sum(start <= t <= end for t in done) / (end - start),
            "load_failures": len(failures), "first_failure": failures[0] if failures else None}


async def run(args: argparse.Namespace, url: str, serving: str) -> dict[str, Any]:
    code = provenance()
    tokenizer = load_tokenizer(args.model)
    docs = documents(tokenizer, args.docs)
    client = await Client(url).connect()
    await neighbour_call(client, 4)  # warm-up: compilation is nobody's load
    arms = [ALONE, *args.rows]
    cells = []
    try:
        with tqdm(total=len(args.fields) * args.reps * len(arms), desc="neighbours",
                  unit="arm", file=sys.stderr) as bar:
            for n_fields in args.fields:
                schema = synthetic_schema(n_fields)
                by_layout = {layout: [
                    make_task(tokenizer, schema, [{"role": "user", "content": d}], layout)
                    for d in docs] for layout in {row.split("@")[1] for row in args.rows}}
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
                for _ in range(args.reps):
                    for name in arms:
                        bar.set_postfix_str(f"{n_fields} fields, {name}")
                        layout = name.split("@")[1] if "@" in name else None
                        runs[name].append(await arm(client, by_layout.get(layout, []), name,
                                                    args))
                        bar.update()
                cells.append({"fields": n_fields, "runs": runs})
    finally:
        await client.close()
    return {"serving": serving, "model": str(args.model), "code": code,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_clients": args.load_clients,
            "neighbour_tokens": args.neighbour_tokens, "cells": cells}


def _pooled(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return median(values) if values else None


def table(results: dict[str, Any]) -> str:
    """Markdown: per fields and arm, the neighbour's TTFT and TPOT (median over reps) and their
    ratios to the floor's arm, each rep's TPOT ratio, and the load's documents/s."""
    lines = [f"{results['load_clients']} load clients, a neighbour streaming "
             f"{results['neighbour_tokens']} tokens; {results['serving']}", "",
             "| fields | load | neighbour TTFT s | vs floor | TPOT ms | vs floor | TPOT vs floor "
             "per rep | load docs/s | load failures |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cell in results["cells"]:
        runs = cell["runs"]
        floor = next((r for name, r in runs.items() if name.startswith("floor@")), None)
        for name, mine in runs.items():
            ttft, tpot = _pooled(mine, "ttft_s"), _pooled(mine, "tpot_s")
            if floor is not None and ttft and tpot:
                versus = (f"×{ttft / _pooled(floor, 'ttft_s'):.2f}",
                          f"×{tpot / _pooled(floor, 'tpot_s'):.2f}",
                          " ".join(f"×{m['tpot_s'] / f['tpot_s']:.2f}"
                                   for m, f in zip(mine, floor)))
            else:
                versus = ("-", "-", "-")
            lines.append(
                f"| {cell['fields']} | {name} | {ttft or float('nan'):.3f} | {versus[0]} | "
                f"{1000 * (tpot or float('nan')):.1f} | {versus[1]} | {versus[2]} | "
                f"{_pooled(mine, 'load_docs_per_s'):.2f} | "
                f"{sum(r['load_failures'] for r in mine)} |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Any) -> None:
    cells = results["cells"]
    fig, axes = panel_row(len(cells))
    for ax, cell in zip(axes, cells):
        names = list(cell["runs"])
        ax.bar(names, [1000 * (_pooled(cell["runs"][n], "tpot_s") or 0) for n in names])
        ax.set(title=f"{cell['fields']} fields", ylabel="neighbour ms per output token")
        ax.tick_params(axis="x", labelrotation=20, labelsize=7)
    fig.suptitle(f"a neighbour beside {results['load_clients']} load clients, lower is better\n"
                 f"{results['serving']}", fontsize=9)
    save_figure(fig, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = server_parser("neighbours", __doc__, "3 fields, 2 load clients, 3 calls, 1 rep")
    parser.add_argument("--docs", type=int, default=512)
    parser.add_argument("--fields", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--load-clients", type=int, default=8)
    parser.add_argument("--neighbour-calls", type=int, default=10)
    parser.add_argument("--neighbour-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--rows", nargs="+", default=ROWS, choices=ROWS, metavar="ROW",
                        help=f"load rows, method@layout (default all: {' '.join(ROWS)})")
    args = parser.parse_args(argv)
    if args.quick:
        args.docs, args.fields, args.load_clients = 4, [3], 2
        args.neighbour_calls, args.neighbour_tokens, args.reps = 3, 8, 1
    args.out = args.out or RESULTS / ("neighbours-quick" if args.quick else "neighbours")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return measure_and_publish(parse_args(argv), run, plot, table)


if __name__ == "__main__":
    main()
