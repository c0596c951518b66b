"""MiniCPM5-2B's shape on this machine: PCD against AR JSON and the floor, and the LM head.

    python -m benchmarks.bench_minicpm5 [--layers 42] [--reps 3] [--out FILE.json]

The model is the random-weight stand-in of MiniCPM5-2B's exact shape (`vllm_pcd.standin`,
written first if missing: `python -m vllm_pcd.models minicpm5-shape`); speed, not answers, is
what it stands in for. One server measures, side by side:
- one request, cold (every call under a fresh cache salt), one client: PCD, AR JSON (xgrammar)
  and the floor (one prefill-only request over exactly PCD's tokens) at 3, 8 and 32 fields; 3
  is the release's own headline shape (token PCD 85.61 ms against 694.99 ms for AR JSON, x8.1,
  on an L40S in FP32);
- documents/s with the schema cached (`bench_throughput`'s rows) at 8 and 32 clients.
Then, with the server gone, the LM head in this process on the stand-in's own 130,560 x 2048
bf16 head: the full head (every row, then the allowed columns, as vLLM computes logits) against
PCD's restricted projection, for each latency cell's scoring requests, on one thread (vLLM's
CPU engine runs on one bound core).

`--out` writes the results in the form `python -m benchmarks.figures` renders
(`docs/results/minicpm5-shape.json`); the server's log goes to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks import bench_throughput
from benchmarks.bench_latency import RESULTS, measure_cell
from benchmarks.workloads import synthetic_schema, synthetic_ticket
from benchmarks.bench_schema_cost import machine
from benchmarks.client import Client, Task, load_tokenizer, make_task
from benchmarks.harness import add_server_flags, provenance, server, serving_note
from benchmarks.methods import SERVER_ARGS, run_method
from vllm_pcd import standin

METHODS = ["pcd_token", "ar_json", "floor"]
# The README's throughput rows: PCD and its floor in the default layout, AR JSON schema first.
THROUGHPUT_ROWS = ["pcd_token@schema_first_auto", "floor@schema_first_auto",
                   "ar_json@schema_first"]


async def served(args: argparse.Namespace, url: str, tokenizer: Any
                 ) -> tuple[list[tuple[Task, dict[str, Any]]], list[dict[str, Any]]]:
    """The latency cells (each with its task) and the throughput cells, on one server."""
    client = await Client(url).connect()
    ticket = synthetic_ticket(tokenizer, args.context, seed=args.context)
    docs = bench_throughput.documents(tokenizer, args.docs)
    rows = [tuple(r.split("@")) for r in THROUGHPUT_ROWS]
    total = (len(args.fields) * (len(METHODS) * (args.reps + 1) + 1)
             + len(args.throughput_fields) * len(args.clients) * len(rows) * len(docs))
    latency, throughput = [], []
    try:
        with tqdm(total=total, desc="minicpm5", unit="call", file=sys.stderr) as bar:
            for n in args.fields:
                task = make_task(tokenizer, synthetic_schema(n),
                                 [{"role": "user", "content": ticket}])
                bar.set_postfix_str(f"{n} fields, cold")
                cell = await measure_cell(client, task, METHODS, args.reps, bar)
                routed = await run_method("pcd_token", client, task)  # which head served it
                bar.update()
                cell["pcd_token"]["projection"] = routed.extra.get("projection")
                latency.append((task, cell))
            for n in args.throughput_fields:
                schema = synthetic_schema(n)
                for clients in args.clients:
                    cell = {"fields": n, "clients": clients, "rows": {}}
                    for method, layout in rows:
                        bar.set_postfix_str(f"{n} fields, {clients} clients, {method}")
                        cell["rows"][method] = await bench_throughput.measure(
                            client, tokenizer, schema, docs, method, layout, clients, bar)
                    throughput.append(cell)
    finally:
        await client.close()
    return latency, throughput


def head_weight(model: Path) -> Any:
    """The checkpoint's `lm_head.weight`, read alone from its shard."""
    from safetensors import safe_open

    index = model / "model.safetensors.index.json"
    file = (json.loads(index.read_text())["weight_map"]["lm_head.weight"] if index.exists()
            else "model.safetensors")
    with safe_open(str(model / file), "pt") as shard:
        return shard.get_tensor("lm_head.weight")


def measure_head(model: Path, tasks: list[tuple[int, Task]], reps: int) -> list[dict[str, Any]]:
    """Per latency cell: its scoring requests' allowed ids (a shorter list repeats its first
    id) through the full head and through `project`, timed alternately, median ms."""
    import torch

    from benchmarks.bench_projection import medians
    from vllm_pcd_kernels import project

    torch.set_num_threads(1)
    torch.manual_seed(0)
    weight = head_weight(model)
    rows = []
    with torch.inference_mode():
        for fields, task in tasks:
            ids = [s.token_ids for s in task.plan.scorings]
            k = max(len(i) for i in ids)
            allowed = torch.tensor([[*i, *[i[0]] * (k - len(i))] for i in ids])
            h = torch.randn(len(ids), weight.shape[1])
            full, restricted = medians(
                [lambda: (h.to(weight.dtype) @ weight.T).gather(1, allowed),
                 lambda: project(h, weight, allowed)], reps, torch.device("cpu"))
            rows.append({"table": "head", "fields": fields, "requests": len(ids),
                         "allowed": k, "head_rows": weight.shape[0],
                         "route": project(h, weight, allowed).route,
                         "full_ms": full * 1e3, "restricted_ms": restricted * 1e3})
    return rows


def latency_row(fields: int, task: Task, cell: dict[str, Any]) -> dict[str, Any]:
    def median(method: str) -> float | None:
        return cell[method]["median_s"]

    return {"table": "latency", "fields": fields, "shared_tokens": len(task.plan.shared_ids),
            **{f"{m}_s": median(m) for m in METHODS},
            **{f"{m}_tokens": cell[m]["tokens_computed"] for m in METHODS},
            "status": {m: cell[m]["status"] for m in METHODS},
            "projection": cell["pcd_token"].get("projection")}


def throughput_row(cell: dict[str, Any]) -> dict[str, Any]:
    return {"table": "throughput", "fields": cell["fields"], "clients": cell["clients"],
            **{f"{m}_docs_s": r.get("docs_per_s") for m, r in cell["rows"].items()},
            "status": {m: r["status"] for m, r in cell["rows"].items()}}


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _x(a: float | None, b: float | None, digits: int = 1) -> str:
    return "-" if not a or not b else f"×{a / b:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one cold request, documents/s, and the LM head; ratios side by side."""
    by = {kind: [r for r in rows if r["table"] == kind]
          for kind in ("latency", "throughput", "head")}
    lines = ["| fields | PCD | AR JSON | floor | PCD vs AR JSON | PCD / floor "
             "| tokens PCD / AR / floor |", "|---|---|---|---|---|---|---|"]
    for r in by["latency"]:
        tokens = " / ".join("-" if r[f"{m}_tokens"] is None else f"{r[f'{m}_tokens']:,.0f}"
                            for m in METHODS)
        lines.append(f"| {r['fields']} | {_s(r['pcd_token_s'])} | {_s(r['ar_json_s'])} | "
                     f"{_s(r['floor_s'])} | **{_x(r['ar_json_s'], r['pcd_token_s'])}** | "
                     f"{_x(r['pcd_token_s'], r['floor_s'], 2)} | {tokens} |")
    lines += ["", "| fields | clients | PCD docs/s | AR JSON docs/s | floor docs/s "
              "| PCD vs AR JSON | PCD / floor |", "|---|---|---|---|---|---|---|"]
    for r in by["throughput"]:
        pcd, ar, floor = (r.get(f"{m}_docs_s") for m in ("pcd_token", "ar_json", "floor"))
        cells = " | ".join("-" if v is None else f"{v:.2f}" for v in (pcd, ar, floor))
        lines.append(f"| {r['fields']} | {r['clients']} | {cells} | {_x(pcd, ar)} | "
                     f"{_x(pcd, floor, 2)} |")
    lines += ["", "| fields | scoring requests × allowed ids | head rows | restricted route "
              "| full head | restricted | full / restricted |", "|---|---|---|---|---|---|---|"]
    for r in by["head"]:
        lines.append(f"| {r['fields']} | {r['requests']} × {r['allowed']} | "
                     f"{r['head_rows']:,} | {r['route']} | {r['full_ms']:.2f} ms | "
                     f"{r['restricted_ms']:.3f} ms | "
                     f"{_x(r['full_ms'], r['restricted_ms'])} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_minicpm5",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=standin.RELEASE_LAYERS,
                        help="layers of the stand-in (the release has 42)")
    parser.add_argument("--model", type=Path, help="a model folder of the stand-in's shape "
                        "(default: the stand-in with --layers, written if missing)")
    parser.add_argument("--url", help="attach to a running server of that model (pcd plugin "
                        "+ xgrammar, benchmarks.methods.SERVER_ARGS)")
    add_server_flags(parser)
    parser.add_argument("--fields", type=int, nargs="+", default=[3, 8, 32])
    parser.add_argument("--context", type=int, default=100,
                        help="approximate conversation tokens of the cold requests")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--throughput-fields", type=int, nargs="*", default=[8, 32],
                        help="field counts of the documents/s cells (none: latency only)")
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--docs", type=int, default=32, help="documents a throughput cell")
    parser.add_argument("--head-reps", type=int, default=15)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-cache-gib", type=int, default=4)
    parser.add_argument("--out", type=Path, help="results JSON (figures form), e.g. "
                        "docs/results/minicpm5-shape.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.model is None:
        from vllm_pcd.models import minicpm5_shape

        args.model = minicpm5_shape(args.layers)
    layers = json.loads((args.model / "config.json").read_text())["num_hidden_layers"]
    code = provenance()
    serving = serving_note(args.url, args.server_flags)
    print(serving, file=sys.stderr)
    tokenizer = load_tokenizer(args.model)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with server(args.url, args.model, RESULTS / "minicpm5-shape.server.log",
                kv_cache_gib=args.kv_cache_gib, flags=args.server_flags,
                base_args=(*SERVER_ARGS, "--max-model-len", str(args.max_model_len))) as url:
        latency, throughput = asyncio.run(served(args, url, tokenizer))
    rows = [latency_row(n, task, cell) for n, (task, cell) in zip(args.fields, latency)]
    rows += [throughput_row(cell) for cell in throughput]
    rows += measure_head(args.model, [(n, task) for n, (task, _) in zip(args.fields, latency)],
                      args.head_reps)
    results = {
        "machine": (f"MiniCPM5-2B stand-in ({layers} layers, random weights), {serving}; "
                    f"context about {args.context} tokens, median of {args.reps} cold requests, "
                    f"{args.docs} documents a throughput cell; {machine()}"),
        "model": str(args.model), "layers": layers, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "code": code, "rows": rows,
        "latency_cells": [{"fields": n, "methods": cell} for n, (_, cell) in
                          zip(args.fields, latency)],
        "throughput_cells": throughput,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    print(table(rows))
    print(results["machine"])
    return results


if __name__ == "__main__":
    main()
