"""A served engine's state as its Prometheus metrics tell it: KV usage, running and waiting
requests, and a wait until it is idle again. The soak and the fault tests read it to show that
no request is left running and no KV block leaked."""

from __future__ import annotations

import asyncio
import re
import time

import httpx


def metric_value(text: str, name: str) -> float:
    """Sum of a Prometheus sample over its label sets (`name` may carry labels itself)."""
    values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    return sum(float(v) for v in values)


async def engine_state(http: httpx.AsyncClient, model: str) -> dict[str, float]:
    """KV usage, running and waiting requests as the engine reports them. vLLM refreshes these
    gauges only when it steps, so a one-token request first makes it step (an abort alone
    does not); the probe itself has finished by the time its response arrives."""
    probe = await http.post("/v1/completions", json={"model": model, "prompt": "hi",
                                                     "max_tokens": 1})
    probe.raise_for_status()
    text = (await http.get("/metrics")).text
    blocks = re.search(r'^vllm:cache_config_info{[^}]*num_gpu_blocks="(\d+)"', text, re.M)
    return {"kv_usage": metric_value(text, "vllm:kv_cache_usage_perc"),
            "running": metric_value(text, "vllm:num_requests_running"),
            "waiting": metric_value(text, "vllm:num_requests_waiting"),
            "kv_blocks": int(blocks.group(1)) - 1 if blocks else 0}  # less the null block


def is_idle(state: dict[str, float], idle_usage: float) -> bool:
    return state["running"] == 0 and state["waiting"] == 0 and state["kv_usage"] <= idle_usage


async def wait_until_idle(http: httpx.AsyncClient, model: str, idle_usage: float,
                          timeout_s: float = 600) -> dict[str, float]:
    """The engine's state once nothing runs or waits and KV usage is back to `idle_usage`, or
    its last state after `timeout_s` (aborted requests drain at the engine's pace)."""
    deadline = time.monotonic() + timeout_s
    state = await engine_state(http, model)
    while not is_idle(state, idle_usage) and time.monotonic() < deadline:
        await asyncio.sleep(1)
        state = await engine_state(http, model)
    return state
