"""Bounded soak of the PCD server on loopback: concurrent PCD requests mixed with ordinary
chat completions and clients that hang up mid-request.

    python -m benchmarks.soak [--seconds 180] [--concurrency 8] [--url URL]

Checks, printed at the end (exit 1 if any fails): zero errors; every PCD object schema-valid
and identical to the same request sent alone before the soak; every ordinary completion
identical to its answer before the soak; after the soak no request is left running or
waiting and the KV cache is back to its idle usage (no leaked blocks, forked ones included),
also after the abandoned requests. The figures go to benchmarks/results/soak.json.

The server it starts computes in float32, whatever the CPU: only there is a greedy answer the
same whatever else shares its step. In bf16 vLLM's CPU forward depends on the batch: a stock
server (no PCD traffic) answering short greedy chat requests under 32 clients gave 350 of 2,139
answers that differ from the same request sent alone; in float32, 0 of 682. Under
bf16 (`--dtype bfloat16`) this check would flag vLLM's batch variance, not PCD.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.client import load_tokenizer
from benchmarks.engine_state import engine_state, is_idle, wait_until_idle
from benchmarks.harness import add_server_flags, provenance, server, serving_note
from benchmarks.methods import server_args
from benchmarks.workloads import synthetic_schema, synthetic_ticket
from benchmarks.metrics import is_schema_valid

RESULTS = Path(__file__).resolve().parent / "results"


class Soak:
    def __init__(self, http: httpx.AsyncClient, model: str, workload: list[dict[str, Any]]):
        self.http, self.model, self.workload = http, model, workload
        self.counts = {"pcd": 0, "chat": 0, "abandoned": 0, "errors": 0, "mismatches": 0}
        self.expected: dict[int, str] = {}
        self.problems: list[str] = []

    def body(self, job: dict[str, Any]) -> dict[str, Any]:
        body = {"model": self.model, "temperature": 0,
                "messages": [{"role": "user", "content": job["message"]}]}
        if job["schema"] is not None:
            body["chat_template_kwargs"] = {"pcd_schema": job["schema"], "pcd_mode": job["mode"]}
        else:
            body["max_tokens"] = 16
        return body

    async def send(self, index: int, timeout: float | None = None) -> str | None:
        job = self.workload[index]
        response = await self.http.post("/v1/chat/completions", json=self.body(job),
                                        timeout=timeout)
        if response.status_code != 200:
            self.counts["errors"] += 1
            self.problems.append(f"HTTP {response.status_code}: {response.text[:200]}")
            return None
        content = response.json()["choices"][0]["message"]["content"]
        if job["schema"] is not None and not is_schema_valid(job["schema"], json.loads(content)):
            self.problems.append(f"schema-invalid PCD object {content[:100]}")
        return content

    async def worker(self, deadline: float, rng: random.Random) -> None:
        while time.monotonic() < deadline:
            index = rng.randrange(len(self.workload))
            if rng.random() < 0.1:  # hang up mid-request
                try:
                    await self.send(index, timeout=rng.uniform(0.05, 0.3))
                except httpx.TimeoutException:
                    self.counts["abandoned"] += 1
                continue
            got = await self.send(index)
            kind = "pcd" if self.workload[index]["schema"] is not None else "chat"
            self.counts[kind] += 1
            if got is not None and got != self.expected[index]:
                self.counts["mismatches"] += 1
                self.problems.append(f"answer changed under load for job {index}: "
                                     f"{got[:80]} != {self.expected[index][:80]}")


def make_workload(tokenizer: Any) -> list[dict[str, Any]]:
    jobs = []
    for i, (fields, tokens, mode) in enumerate([(3, 100, "token"), (8, 300, "token"),
                                                (16, 100, "token"), (4, 200, "sequence")]):
        jobs.append({"schema": synthetic_schema(fields), "mode": mode,
                     "message": synthetic_ticket(tokenizer, tokens, seed=i)})
    for prompt in ["Name a colour.", "What is 2 + 2?", "Say hello in French."]:
        jobs.append({"schema": None, "mode": None, "message": prompt})
    return jobs


async def soak(url: str, model_path: str, seconds: float, concurrency: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        run = Soak(http, model, make_workload(load_tokenizer(model_path)))
        for index in range(len(run.workload)):  # answers sent one at a time, the reference
            run.expected[index] = await run.send(index)
        idle = await engine_state(http, model)
        deadline = time.monotonic() + seconds
        rngs = [random.Random(seed) for seed in range(concurrency)]
        await asyncio.gather(*(run.worker(deadline, rng) for rng in rngs))
        after = await wait_until_idle(http, model, idle["kv_usage"])
    leaked = max(0, round((after["kv_usage"] - idle["kv_usage"]) * after["kv_blocks"]))
    if not is_idle(after, idle["kv_usage"]):
        run.problems.append(f"not idle after the soak: {after} (idle KV usage "
                            f"{idle['kv_usage']}, about {leaked} blocks leaked)")
    return {"seconds": seconds, "concurrency": concurrency, **run.counts,
            "kv_usage_idle": idle["kv_usage"], "kv_usage_after": after["kv_usage"],
            "kv_blocks": after["kv_blocks"], "leaked_blocks": leaked,
            "requests_running_after": after["running"],
            "requests_waiting_after": after["waiting"], "problems": run.problems[:20],
            "ok": not run.problems, "code": provenance()}


def main(argv: list[str] | None = None) -> int:
    from vllm_pcd.models import default_model_path

    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak")
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--url")
    parser.add_argument("--dtype", default="float32", help="the started server's dtype "
                        "(float32: see the module's note on batch invariance; ignored with --url)")
    add_server_flags(parser)
    args = parser.parse_args(argv)
    with server(args.url, args.model, RESULTS / "soak.server.log", flags=args.server_flags,
                base_args=server_args(dtype=args.dtype)) as url:
        report = asyncio.run(soak(url, args.model, args.seconds, args.concurrency))
    report["serving"] = serving_note(args.url, args.server_flags, dtype=args.dtype)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
