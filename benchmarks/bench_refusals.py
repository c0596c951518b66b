"""What an oversized body costs the server, and what it costs everyone else.

One server, measured side by side in one run:
- the latency of refusing a PCD body of ~1 MB of text (a 400 naming `max_prompt_chars`)
  against an ordinary PCD call's;
- an ordinary PCD call's latency idle, then while other clients send oversized bodies
  back to back, in alternating rounds so that drift on a shared machine hits both alike.
The ratios are what to read; the seconds are this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

import httpx

from benchmarks.bench_latency import RESULTS
from benchmarks.harness import run_on_server, server_parser

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["refund", "topic"],
          "properties": {"refund": {"type": "boolean"},
                         "topic": {"enum": ["billing", "shipping", "account"]}}}
ORDINARY = "I was charged twice for my order. Please refund the duplicate charge."


def body(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}],
            "chat_template_kwargs": {"pcd_schema": SCHEMA}}


async def timed(http: httpx.AsyncClient, payload: dict[str, Any] | bytes, status: int) -> float:
    """One call; a body given as bytes is sent as it is (encoded once, so the clients spend
    little of this machine's CPU on it)."""
    start = time.perf_counter()
    if isinstance(payload, bytes):
        response = await http.post("/v1/chat/completions", content=payload,
                                   headers={"content-type": "application/json"})
    else:
        response = await http.post("/v1/chat/completions", json=payload)
    elapsed = time.perf_counter() - start
    if response.status_code != status:
        raise RuntimeError(f"expected HTTP {status}, got {response.status_code}: "
                           f"{response.text[:300]}")
    return elapsed


async def flood(http: httpx.AsyncClient, payload: bytes, stop: asyncio.Event) -> int:
    sent = 0
    while not stop.is_set():
        await timed(http, payload, 400)
        sent += 1
    return sent


async def measure(args: argparse.Namespace, url: str, serving: str) -> dict[str, Any]:
    key = os.environ.get("OPENAI_API_KEY", "EMPTY")
    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 headers={"Authorization": f"Bearer {key}"}) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        ordinary = body(model, ORDINARY)
        huge = json.dumps(body(model, "word " * (args.megabytes * 200_000))).encode()
        await timed(http, ordinary, 200)  # warm
        refusals = [await timed(http, huge, 400) for _ in range(args.reps)]
        idle, loaded, sent = [], [], 0
        for _ in range(args.rounds):
            idle += [await timed(http, ordinary, 200) for _ in range(args.reps)]
            stop = asyncio.Event()
            floods = [asyncio.create_task(flood(http, huge, stop)) for _ in range(args.flooders)]
            await asyncio.sleep(0.05)
            loaded += [await timed(http, ordinary, 200) for _ in range(args.reps)]
            stop.set()
            sent += sum(await asyncio.gather(*floods))
    return {"serving": serving, "megabytes": args.megabytes, "flooders": args.flooders,
            "refusal_s": statistics.median(refusals), "idle_s": statistics.median(idle),
            "loaded_s": statistics.median(loaded), "oversized_sent": sent,
            "samples": {"refusal": refusals, "idle": idle, "loaded": loaded}}


def table(results: dict[str, Any]) -> str:
    r = results
    return "\n".join([
        f"{r['serving']}; {r['flooders']} clients sending {r['megabytes']} MB bodies "
        f"({r['oversized_sent']} sent)", "",
        "| what | median s | ratio |", "|---|---|---|",
        f"| refusal of a {r['megabytes']} MB body | {r['refusal_s']:.4f} | "
        f"{r['refusal_s'] / r['idle_s']:.2f} of an ordinary call |",
        f"| ordinary PCD call, idle | {r['idle_s']:.4f} | 1.00 |",
        f"| ordinary PCD call, under oversized bodies | {r['loaded_s']:.4f} | "
        f"{r['loaded_s'] / r['idle_s']:.2f} of idle |"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = server_parser("refusals", __doc__, "2 rounds of 3 calls")
    parser.add_argument("--megabytes", type=int, default=1)
    parser.add_argument("--flooders", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.reps = 2, 3
    args.out = args.out or RESULTS / ("refusals-quick" if args.quick else "refusals")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results = run_on_server(args, measure)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    print(table(results))
    return results


if __name__ == "__main__":
    main()
