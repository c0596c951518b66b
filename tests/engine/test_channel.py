"""The closed engine channel (tags), the API guard, and the plugin's standing aside when it
was not asked for."""

import asyncio
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from vllm_pcd.engine import branch_params, prefill_params
from vllm_pcd.serving.guard import RequestGuard, refused_part
from vllm_pcd.internals import tags

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too


def test_own_tags_round_trip_and_forgeries_fail():
    params = branch_params([3, 9], ("g-b0", 4), shared_len=130, restrict=True, fork_lengths=[140])
    assert tags.check(params.extra_args) == tags.Tags("g-b0", 4, (130, 140), (3, 9))
    assert tags.check(prefill_params(130).extra_args) == tags.Tags(shared=(130,))
    assert tags.check(prefill_params(130, opens="c").extra_args) == tags.Tags(shared=(130,),
                                                                            opens="c")
    gated = branch_params([3], ("g-b0", 1), 130, after="c").extra_args
    assert tags.check(gated) == tags.Tags("g-b0", 1, (130,), after="c")
    assert tags.check(None) is None and tags.check({"other": 1}) is None
    body = dict(params.extra_args["pcd"])
    forged = [
        {"pcd": {**body, "group_size": 5}},             # signed contents changed
        {"pcd": {k: v for k, v in body.items() if k != "sig"}},
        {"pcd": {**body, "sig": "0" * 64}},
        {"pcd": "junk"}, {"pcd": None}, {"pcd": [1, 2]},
        {"pcd_group": "x"}, {"pcd_group_size": 3}, {"PCD_allowed": [1]},
        {"pcd": {**body, "extra": 1}},
    ]
    for extra in forged:
        with pytest.raises(tags.BadTag):
            tags.check(extra)


@pytest.mark.parametrize("bad", [
    tags.Tags("g", 0), tags.Tags("g", -1), tags.Tags("", 2), tags.Tags("g" * 300, 2),
    tags.Tags(shared=(0,)), tags.Tags(shared=tuple(range(1, 40))), tags.Tags(allowed=(-1,)),
    tags.Tags(allowed=(1 << 40,)), tags.Tags(allowed=()), tags.Tags(opens=""),
    tags.Tags(after="x" * 300),
])
def test_signed_but_malformed_tags_fail(bad):
    """Even a correctly signed tag must be well formed: the engine never trusts the shape."""
    body = tags._body(bad)
    body = {**body, "group_size": bad.group_size} if bad.group is not None else body
    if bad.allowed == ():
        body["allowed"] = []
    with pytest.raises(tags.BadTag):
        tags.check({"pcd": {**body, "sig": tags._signature(body)}})


def test_the_worker_reads_allowed_ids_by_shape():
    extra = branch_params([3, 9], restrict=True).extra_args
    assert tags.allowed_ids(extra, vocab=10) == [3, 9]
    assert tags.allowed_ids(extra, vocab=5) is None
    assert tags.allowed_ids({"pcd": {"allowed": "x"}}, vocab=10) is None
    assert tags.allowed_ids(None, vocab=10) is None


def test_reserved_parts_are_found_in_any_body():
    assert refused_part(b'{"vllm_xargs": {"pcd_group": "x"}}')[0] == "vllm_xargs"
    assert "'PCD'" in refused_part(b'{"vllm_xargs": {"PCD": 1}}')[1]
    assert refused_part(b'{"structured_outputs": 3}')[0] == "structured_outputs"
    for fine in (b'{"vllm_xargs": {"other": "pcd"}}', b'{"messages": "pcd"}', b"not json pcd",
                 b"[" * 100000 + b"pcd", b'{"structured_outputs": {"json": {}}}',
                 b'{"structured_outputs": null}'):
        assert refused_part(fine) is None, fine


def test_the_guard_refuses_or_replays_the_body():
    seen = []

    async def app(scope, receive, send):
        while True:
            message = await receive()
            seen.append(message["body"])
            if not message["more_body"]:
                return

    async def call(body):
        chunks = [{"type": "http.request", "body": body[:5], "more_body": True},
                  {"type": "http.request", "body": body[5:], "more_body": False}]
        sent = []

        async def receive():
            return chunks.pop(0)

        async def send(message):
            sent.append(message)

        await RequestGuard(app)({"type": "http", "method": "POST"}, receive, send)
        return sent

    refused = asyncio.run(call(b'{"vllm_xargs": {"pcd_group_size": null}}'))
    assert refused[0]["status"] == 400
    assert json.loads(refused[1]["body"])["error"]["param"] == "vllm_xargs"
    assert asyncio.run(call(b'{"model": "pcd", "vllm_xargs": {"seed": 1}}')) == []
    assert seen == [b'{"mod', b'el": "pcd", "vllm_xargs": {"seed": 1}}']


def test_a_refusal_a_route_lets_escape_is_answered_by_the_guard():
    """vLLM 0.24's token-in and tokenize routes do not catch validation errors: PCD's own
    refusal raised inside them still reaches the client as its 400, and any other error
    propagates as before."""
    from vllm_pcd.internals.errors import client_error

    def app_raising(err):
        async def app(scope, receive, send):
            await receive()
            raise err
        return app

    async def call(app):
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message):
            sent.append(message)

        await RequestGuard(app)({"type": "http", "method": "POST"}, receive, send)
        return sent

    sent = asyncio.run(call(app_raising(client_error("pcd key reserved", "vllm_xargs"))))
    assert sent[0]["status"] == 400
    error = json.loads(sent[1]["body"])["error"]
    assert error == {"message": "pcd key reserved", "type": "BadRequestError",
                     "param": "vllm_xargs", "code": 400}
    with pytest.raises(RuntimeError):
        asyncio.run(call(app_raising(RuntimeError("a server fault"))))


PROBE = """
import os, sys
from vllm.plugins import load_general_plugins
from vllm.v1.core.sched.scheduler import Scheduler
before = Scheduler.add_request
load_general_plugins()
from vllm_pcd import internals
print("patched" if Scheduler.add_request is not before else "stock", internals.active(),
      "key" if "VLLM_PCD_TAG_KEY" in os.environ else "nokey")
"""


@pytest.mark.parametrize("plugins,expected", [
    (None, "stock False nokey"), ("other", "stock False nokey"), ("fl,pcd", "patched True key")])
def test_installed_is_not_enabled(plugins, expected):
    """vLLM loads every general plugin when VLLM_PLUGINS is unset: PCD patches nothing then."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_PCD_TAG_KEY")}
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == expected


@pytest.mark.parametrize("preset", ["", "short"])
def test_a_weak_preset_key_refuses_to_start(preset):
    """An empty or short VLLM_PCD_TAG_KEY would make tags forgeable: loading the plugin fails,
    so `vllm serve` does not start."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    env.update(VLLM_PLUGINS="pcd", VLLM_PCD_TAG_KEY=preset)
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode != 0
    assert f"VLLM_PCD_TAG_KEY is set to {len(preset)} characters" in run.stderr


def test_the_key_reaches_every_engine_vllm_starts():
    """Ray engine actors get the variables vLLM copies to them: the key is among them."""
    from vllm.ray.ray_env import get_env_vars_to_copy

    from vllm_pcd.internals import tags

    tags.channel_key()
    assert tags.KEY_ENV in get_env_vars_to_copy()


def test_the_key_is_drawn_once_then_read(monkeypatch):
    """Every request's signing and checking reads the key: drawing fresh random bytes each
    time (only to discard them) cost the API server a tenth of its time at 32 fields."""
    from vllm_pcd.internals import tags

    monkeypatch.delenv(tags.KEY_ENV, raising=False)
    drawn = []
    monkeypatch.setattr(tags.secrets, "token_hex", lambda n: drawn.append(n) or "k" * 2 * n)
    first = tags.channel_key()
    assert [tags.channel_key() for _ in range(3)] == [first] * 3
    assert drawn == [32]


def test_serving_flags_that_slow_pcd_are_named():
    from vllm_pcd.core.schema import Limits
    from vllm_pcd.serving.service import profile_advice

    def config(prefix_caching, seqs):
        return SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=prefix_caching),
                               scheduler_config=SimpleNamespace(max_num_seqs=seqs))

    assert profile_advice(config(True, 256), Limits()) is None
    flagos = profile_advice(config(False, 1), Limits())  # FlagOS's release command
    assert "--no-enable-prefix-caching" in flagos and "--max-num-seqs from 1 to at least 33" in flagos
    assert profile_advice(config(True, 8), Limits()) == (
        "raise --max-num-seqs from 8 to at least 33 (a call's branches run together, at most "
        "max_branches_per_batch at a time, beside its context)")


def test_logit_modes_switch_pcd_off_with_their_reason():
    from vllm_pcd.serving.service import off_reason

    def config(mode):
        return SimpleNamespace(model_config=SimpleNamespace(logprobs_mode=mode))

    assert off_reason(config("raw_logprobs")) is None
    assert off_reason(config("processed_logprobs")) is None
    for mode in ("raw_logits", "processed_logits"):
        assert f"--logprobs-mode {mode}" in off_reason(config(mode))
