"""What a hostile body costs the server, and what it costs everyone else.

One server, measured side by side in one run:
- the latency of refusing a PCD body of ~1 MB of text (a 400 naming `max_prompt_chars`)
  against an ordinary PCD call's;
- an ordinary PCD call's latency idle, then while other clients send oversized bodies
  back to back, in alternating rounds so that drift on a shared machine hits both alike;
- with `--schemas`, the same for the neighbours PCD must never hold up: `/health` and a plain
  (non-PCD) chat call, idle and while clients send the largest body of every hostile schema
  family (`hostile_schemas`) back to back, each answered or refused.
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
from benchmarks.hostile_schemas import SCHEMA_FAMILIES

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


async def flood(http: httpx.AsyncClient, payloads: list[bytes], stop: asyncio.Event,
                status: int | None = 400) -> int:
    """`payloads` in turn, back to back until `stop`; each must get `status` (None: any 2xx
    or 4xx, as hostile schemas are answered or refused)."""
    sent = 0
    while not stop.is_set():
        payload = payloads[sent % len(payloads)]
        if status is None:
            response = await http.post("/v1/chat/completions", content=payload,
                                       headers={"content-type": "application/json"})
            if response.status_code >= 500:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        else:
            await timed(http, payload, status)
        sent += 1
    return sent


async def neighbour_latency(http: httpx.AsyncClient, model: str) -> tuple[float, float]:
    """(/health, a plain 4-token greedy chat call), seconds."""
    start = time.perf_counter()
    assert (await http.get("/health")).status_code == 200
    health = time.perf_counter() - start
    start = time.perf_counter()
    response = await http.post("/v1/chat/completions", json={
        "model": model, "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hello."}]})
    assert response.status_code == 200, response.text
    return health, time.perf_counter() - start


def hostile_bodies(model: str) -> dict[str, bytes]:
    """The largest body of every hostile schema family, as a PCD chat request."""
    return {name: json.dumps({"model": model, "messages": [{"role": "user", "content": ORDINARY}],
                              "chat_template_kwargs": {"pcd_schema": build(sizes[-1])}}).encode()
            for name, (build, sizes) in SCHEMA_FAMILIES.items()}


async def measure_schemas(args: argparse.Namespace, http: httpx.AsyncClient, model: str
                          ) -> dict[str, Any]:
    bodies = hostile_bodies(model)
    answer_s = {}
    for name, payload in bodies.items():
        start = time.perf_counter()
        response = await http.post("/v1/chat/completions", content=payload,
                                   headers={"content-type": "application/json"})
        answer_s[name] = {"status": response.status_code, "s": time.perf_counter() - start,
                          "kb": len(payload) / 1024}
    idle, loaded, sent = [], [], 0
    for _ in range(args.rounds):
        idle += [await neighbour_latency(http, model) for _ in range(args.reps)]
        stop = asyncio.Event()
        floods = [asyncio.create_task(flood(http, list(bodies.values()), stop, None))
                  for _ in range(args.flooders)]
        await asyncio.sleep(0.05)
        loaded += [await neighbour_latency(http, model) for _ in range(args.reps)]
        stop.set()
        sent += sum(await asyncio.gather(*floods))
    return {"hostile": answer_s, "hostile_sent": sent,
            "health_idle_s": statistics.median(h for h, _ in idle),
            "health_loaded_s": statistics.median(h for h, _ in loaded),
            "chat_idle_s": statistics.median(c for _, c in idle),
            "chat_loaded_s": statistics.median(c for _, c in loaded)}


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
            floods = [asyncio.create_task(flood(http, [huge], stop))
                      for _ in range(args.flooders)]
            await asyncio.sleep(0.05)
            loaded += [await timed(http, ordinary, 200) for _ in range(args.reps)]
            stop.set()
            sent += sum(await asyncio.gather(*floods))
        schemas = await measure_schemas(args, http, model) if args.schemas else {}
    return {**schemas, "serving": serving, "megabytes": args.megabytes, "flooders": args.flooders,
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
        f"{r['loaded_s'] / r['idle_s']:.2f} of idle |", *schema_rows(r)])


def schema_rows(r: dict[str, Any]) -> list[str]:
    if "hostile" not in r:
        return []
    return ["", f"hostile schemas, largest of each family ({r['hostile_sent']} sent while "
            "neighbours were timed)", "", "| body | KB | HTTP | s |", "|---|---|---|---|",
            *(f"| {name} | {h['kb']:.1f} | {h['status']} | {h['s']:.4f} |"
              for name, h in r["hostile"].items()), "",
            "| neighbour | idle s | under hostile schemas s | ratio |", "|---|---|---|---|",
            f"| /health | {r['health_idle_s']:.4f} | {r['health_loaded_s']:.4f} | "
            f"{r['health_loaded_s'] / r['health_idle_s']:.2f} |",
            f"| plain chat, 4 tokens | {r['chat_idle_s']:.4f} | {r['chat_loaded_s']:.4f} | "
            f"{r['chat_loaded_s'] / r['chat_idle_s']:.2f} |"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = server_parser("refusals", __doc__, "2 rounds of 3 calls")
    parser.add_argument("--megabytes", type=int, default=1)
    parser.add_argument("--flooders", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--schemas", action="store_true",
                        help="also time /health and a plain chat call under hostile schemas")
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
