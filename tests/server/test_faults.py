"""Faults, as the server sees them: a client that hangs up mid-request, and an engine error
inside one PCD request. The engine's own gauges (`/metrics`) prove that nothing is left
running or waiting and that every KV block came back."""

import asyncio
import contextlib
import os
import time
import uuid

import httpx
import pytest

from benchmarks.workloads import synthetic_ticket
from benchmarks.engine_state import engine_state, is_idle, metric_value, wait_until_idle
from tests.conftest import API_KEY, MESSAGE, SIX_FIELD_SCHEMA, SUPPORT_SCHEMA, server_args

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = "/v1/chat/completions"
# The limits' maximum, 32 fields of 8 values (256 candidates): in sequence mode the branches
# run in several microbatches after a context of two prefill chunks, so a hang-up after the
# context lands while branches are in flight.
WIDE_SCHEMA = {
    "type": "object",
    "properties": {f"field_{i}": {"enum": [f"option {i}-{j}" for j in range(8)]}
                   for i in range(32)},
    "required": [f"field_{i}" for i in range(32)],
    "additionalProperties": False,
}
FAULT_SALT = "pcd-test-engine-fault"
SPLIT_SALT = "pcd-test-split-group"
STALL_SALT = "pcd-test-stalled-branch"
BOUND_S = 20  # the fault server's limits.max_request_seconds
# A vLLM general plugin, loaded by vLLM's own plugin mechanism in the fault server only.
FAULT_PLUGIN = f'''"""Written by tests/server/test_faults.py. Engine requests carrying these
cache_salts, counted per salt (a PCD request's context is 1, its branches 2, 3, ...),
misbehave inside AsyncLLM.add_request, before they reach the engine:
- {FAULT_SALT!r}: the 3rd fails, as an engine fault would; vLLM aborts it and wraps the error;
- {SPLIT_SALT!r}: every 3rd arrives 3 s late, so its admission group is split over a step;
- {STALL_SALT!r}: every 2nd never arrives within a minute."""

import asyncio
import collections

_salted = collections.Counter()


def register():
    from vllm.v1.engine.async_llm import AsyncLLM

    add_request = AsyncLLM.add_request

    async def faulty_add_request(self, request_id, prompt, *args, **kwargs):
        salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
        if salt in ({FAULT_SALT!r}, {SPLIT_SALT!r}, {STALL_SALT!r}):
            _salted[salt] += 1
            if salt == {FAULT_SALT!r} and _salted[salt] == 3:
                raise RuntimeError("injected engine fault")
            if salt == {SPLIT_SALT!r} and _salted[salt] % 3 == 0:
                await asyncio.sleep(3.0)
            if salt == {STALL_SALT!r} and _salted[salt] % 2 == 0:
                await asyncio.sleep(60.0)
        return await add_request(self, request_id, prompt, *args, **kwargs)

    AsyncLLM.add_request = faulty_add_request
'''


async def served_model(http):
    return (await http.get("/v1/models")).json()["data"][0]["id"]


async def metric(http, name):
    return metric_value((await http.get("/metrics")).text, name)


def pcd_body(model, schema, content=MESSAGE, **extra):
    return {"model": model, "messages": [{"role": "user", "content": content}],
            "chat_template_kwargs": {"pcd_schema": schema}, **extra}


def chat_body(model):
    return {"model": model, "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 16, "temperature": 0}


async def answer(http, body):
    response = await http.post(CHAT, json=body)
    assert response.status_code == 200, response.text[:300]
    return response.json()["choices"][0]["message"]["content"]


async def hang_up_while_branches_run(url, body, http):
    """Send `body` on a connection of its own and drop it once the engine has finished the
    request's shared context (its branches are then being submitted or run). Returns whether
    the call was cut short rather than answered."""
    finished = await metric(http, "vllm:request_success_total")
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=None) as doomed:
        call = asyncio.create_task(doomed.post(CHAT, json=body))
        while not call.done() and await metric(http, "vllm:request_success_total") == finished:
            await asyncio.sleep(0.05)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
    return call.cancelled()


async def hang_up(url, tokenizer):
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=600) as http:
        model = await served_model(http)
        idle = await engine_state(http, model)
        outcome = 'pcd_requests_total{mode="sequence",outcome="%s"}'
        cancelled, answered = await metric(http, outcome % "cancelled"), await metric(
            http, outcome % "ok")
        body = pcd_body(model, WIDE_SCHEMA, synthetic_ticket(tokenizer, 1000),
                        cache_salt=uuid.uuid4().hex)
        body["chat_template_kwargs"]["pcd_mode"] = "sequence"
        assert await hang_up_while_branches_run(url, body, http), "answered before the hang-up"

        after = await wait_until_idle(http, model, idle["kv_usage"])
        assert is_idle(after, idle["kv_usage"]), (after, idle)
        # The server saw the hang-up: the request was cancelled, never answered.
        assert await metric(http, outcome % "cancelled") == cancelled + 1
        assert await metric(http, outcome % "ok") == answered
        assert await answer(http, pcd_body(model, SUPPORT_SCHEMA))


def test_a_client_that_hangs_up_aborts_every_request_of_it_and_frees_its_blocks(
        pcd_server, tokenizer):
    asyncio.run(hang_up(pcd_server, tokenizer))


@pytest.fixture(scope="module")
def fault_server(model_path, tmp_path_factory):
    """The test server's configuration plus the fault plugin above (`VLLM_PLUGINS=pcd,
    pcd_fault`): the one way to fail an engine request inside a real server without a test
    hook in the plugin."""
    from vllm_pcd.launch import serve

    root = tmp_path_factory.mktemp("fault_plugin")
    (root / "pcd_fault_plugin.py").write_text(FAULT_PLUGIN)
    dist = root / "pcd_fault_plugin-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pcd-fault-plugin\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.general_plugins]\npcd_fault = pcd_fault_plugin:register\n")
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    # float32: the split group's late branch runs alone in its step, and in bf16 a batch of
    # another shape can move a score by a tenth (seen on a CPU with AMX); it compares scores.
    args = server_args(pcd_config={"limits": {"max_request_seconds": BOUND_S}}, dtype="float32")
    with serve(model_path, args=args,
               plugins="pcd,pcd_fault",
               env={"PYTHONPATH": path}, log_path=root / "vllm.log") as url:
        yield url


async def engine_fault(url):
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=600) as http:
        model = await served_model(http)
        idle = await engine_state(http, model)
        errors = await metric(http, 'pcd_requests_total{mode="token",outcome="error"}')
        pcd, chat = pcd_body(model, SIX_FIELD_SCHEMA), chat_body(model)
        before = [await answer(http, pcd), await answer(http, chat)]

        faulted = await http.post(CHAT, json={**pcd, "cache_salt": FAULT_SALT})
        assert faulted.status_code == 500, faulted.text[:300]
        error = faulted.json()["error"]
        assert error["code"] == 500 and error["type"] == "InternalServerError"
        assert "EngineGenerateError" in error["message"], error
        assert "injected engine fault" in error["message"], error
        assert await metric(http, 'pcd_requests_total{mode="token",outcome="error"}') == errors + 1

        assert [await answer(http, pcd), await answer(http, chat)] == before
        after = await wait_until_idle(http, model, idle["kv_usage"])
        assert is_idle(after, idle["kv_usage"]), (after, idle)


def test_an_engine_fault_fails_its_request_only(fault_server):
    asyncio.run(engine_fault(fault_server))


async def split_and_stalled(url):
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=600) as http:
        model = await served_model(http)
        idle = await engine_state(http, model)
        pcd = pcd_body(model, SUPPORT_SCHEMA)
        plain = (await http.post(CHAT, json={**pcd, "cache_salt": uuid.uuid4().hex})).json()

        # One branch of each group arrives after the engine has stepped without it: the group
        # is released by the engine's own step (nothing else arrives on this idle server), the
        # late branch waits its bounded time alone, and the answer is the same.
        start = time.monotonic()
        split = await http.post(CHAT, json={**pcd, "cache_salt": SPLIT_SALT})
        assert split.status_code == 200, split.text[:300]
        assert time.monotonic() - start < BOUND_S
        assert split.json()["choices"][0]["message"]["content"] == \
            plain["choices"][0]["message"]["content"]
        for name, field in split.json()["pcd"]["fields"].items():
            for got, want in zip(field["candidates"], plain["pcd"]["fields"][name]["candidates"]):
                assert abs(got["score"] - want["score"]) < 1e-3, (name, got, want)

        # A branch that never arrives: the call ends at its bound with a clear error, and the
        # branches held for it are released and aborted.
        start = time.monotonic()
        stalled = await http.post(CHAT, json={**pcd, "cache_salt": STALL_SALT})
        took = time.monotonic() - start
        assert stalled.status_code == 504, stalled.text[:300]
        assert "max_request_seconds" in stalled.json()["error"]["message"]
        assert BOUND_S - 1 < took < BOUND_S + 15, took
        after = await wait_until_idle(http, model, idle["kv_usage"])
        assert is_idle(after, idle["kv_usage"]), (after, idle)
        assert await answer(http, pcd)


def test_split_groups_complete_and_a_stalled_call_ends_at_its_bound(fault_server):
    asyncio.run(split_and_stalled(fault_server))


def test_a_refusal_vllm_raises_becomes_its_own_4xx():
    """`client_fault` answers a validation error vLLM raised with the status, message and
    param vLLM's own routes give (its ErrorResponse's ErrorInfo), on every version."""
    from vllm_pcd.internals.errors import client_error
    from vllm_pcd.serving.errors import client_fault

    answer = client_fault(client_error("temperature must be non-negative", "temperature"))
    assert answer.status.value == 400 and "temperature" in answer.message
    assert client_fault(RuntimeError("engine died")) is None
