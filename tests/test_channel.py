"""The closed engine channel (tags), grouped admission without a vLLM engine, the API guard,
and the plugin's standing aside when it was not asked for."""

import asyncio
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from vllm_pcd.engine import branch_params, prefill_params
from vllm_pcd.serving.guard import RequestGuard, refused_part
from vllm_pcd.internals import admission, tags


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


class FakeScheduler:
    """The slice of vLLM's Scheduler the admission patch wraps; requests scheduled finish in
    their step, except those a test puts in `running`."""

    max_num_running_reqs = 128

    def __init__(self):
        self.requests, self.waiting, self.finished, self.running = {}, [], [], []

    def get_request_counts(self):
        return len(self.running), len(self.waiting)

    def add_request(self, request):
        self.requests[request.request_id] = request
        self.waiting.append(request.request_id)

    def finish_requests(self, request_ids, status):
        ids = list(self.requests) if request_ids is None else (
            [request_ids] if isinstance(request_ids, str) else list(request_ids))
        for rid in ids:
            if self.requests.pop(rid, None) is not None:
                self.finished.append(rid)
        return ids

    def schedule(self, *args, **kwargs):
        scheduled, self.waiting = self.waiting, []
        return scheduled

    def get_num_unfinished_requests(self):
        return len(self.requests)


def request(rid, group=None, size=None, **gate):
    return SimpleNamespace(request_id=rid,
                           pcd_tags=tags.Tags(group, size, **gate) if group or gate else None)


@pytest.fixture
def scheduler_cls():
    cls = type("PatchedFake", (FakeScheduler,), {})
    admission.patch_scheduler(cls)
    return cls


def test_a_group_enters_together(scheduler_cls):
    sched = scheduler_cls()
    sched.add_request(request("a", "g", 2))
    assert sched.schedule() == [] and sched.get_num_unfinished_requests() == 1
    sched.add_request(request("plain"))
    sched.add_request(request("b", "g", 2))
    assert sched.schedule() == ["plain", "a", "b"]


def test_independent_groups_never_wait_for_each_other(scheduler_cls):
    """Concurrent PCD requests' branch groups interleave at admission: each enters the step
    after its own last member arrives, whatever other groups are still held."""
    sched = scheduler_cls()
    sched.add_request(request("g1", "g", 3))
    sched.add_request(request("h1", "h", 2))
    sched.add_request(request("h2", "h", 2))  # h is whole: it enters although g is not
    sched.add_request(request("k1", "k", 1))
    assert sched.schedule() == ["h1", "h2", "k1"]
    assert set(admission.pending(sched).groups) == {"g"}
    sched.add_request(request("g2", "g", 3))
    sched.add_request(request("plain"))  # an untagged request is never held
    assert sched.schedule() == ["plain"]
    sched.add_request(request("g3", "g", 3))
    assert sched.schedule() == ["g1", "g2", "g3"] and not admission.pending(sched).groups


def test_a_split_group_is_released_by_the_step_alone(scheduler_cls, monkeypatch):
    """Nothing else arrives: the engine keeps stepping (held requests count as unfinished)
    and its own step releases the group once it is stale."""
    monkeypatch.setattr(admission, "GROUP_WAIT_S", 0.05)
    sched = scheduler_cls()
    sched.add_request(request("a", "g", 3))
    sched.add_request(request("b", "g", 3))
    assert sched.get_num_unfinished_requests() == 2 and sched.schedule() == []
    time.sleep(0.06)
    assert sched.schedule() == ["a", "b"]
    sched.add_request(request("c", "g", 3))  # the late member waits a bounded time too
    time.sleep(0.06)
    assert sched.schedule() == ["c"]
    assert not admission.pending(sched).groups


def whole_group(sched, group, size):
    for i in range(size):
        sched.add_request(request(f"{group}{i}", group, size))


def test_groups_enter_only_into_free_slots(scheduler_cls):
    """A held group enters when its members fit beside what runs and waits, so a request that
    arrived meanwhile keeps its place in the step; a later group never overtakes a waiting
    one."""
    scheduler_cls.max_num_running_reqs = 4
    sched = scheduler_cls()
    whole_group(sched, "g", 3)
    whole_group(sched, "h", 2)
    whole_group(sched, "k", 1)
    sched.add_request(request("p"))
    assert sched.schedule() == ["p", "g0", "g1", "g2"]  # h (2) does not fit the 1 left
    sched.add_request(request("q"))
    assert sched.schedule() == ["q", "h0", "h1", "k0"]
    assert not admission.pending(sched).groups


def test_a_group_waits_for_slots_a_bounded_time(scheduler_cls, monkeypatch):
    monkeypatch.setattr(admission, "GROUP_WAIT_S", 0.05)
    scheduler_cls.max_num_running_reqs = 4
    sched = scheduler_cls()
    sched.running = ["r0", "r1", "r2"]  # long decodes hold 3 of the 4 slots
    whole_group(sched, "g", 2)
    assert sched.schedule() == [] and sched.get_num_unfinished_requests() == 2
    time.sleep(0.06)
    assert sched.schedule() == ["g0", "g1"]


def test_a_group_larger_than_the_slots_enters_an_empty_scheduler(scheduler_cls):
    scheduler_cls.max_num_running_reqs = 2
    sched = scheduler_cls()
    whole_group(sched, "g", 3)
    whole_group(sched, "h", 1)
    assert sched.schedule() == ["g0", "g1", "g2"]
    assert sched.schedule() == ["h0"]


def test_aborts_release_held_requests(scheduler_cls):
    sched = scheduler_cls()
    for rid, group in (("a", "g"), ("b", "h"), ("c", "h")):
        sched.add_request(request(rid, group, 9))
    sched.finish_requests("a", "aborted")
    assert sched.finished == ["a"] and set(admission.pending(sched).groups) == {"h"}
    sched.finish_requests(None, "aborted")  # abort-all (pause, shutdown) finds the held too
    assert sched.finished == ["a", "b", "c"] and not admission.pending(sched).groups
    assert sched.get_num_unfinished_requests() == 0


def test_a_gated_group_enters_the_step_after_its_context_finishes(scheduler_cls, monkeypatch):
    """Submitted with its context, the first branch group waits behind the context's gate
    however long the context runs, and enters the step after it leaves; the gate goes with
    the group."""
    monkeypatch.setattr(admission, "GROUP_WAIT_S", 0.05)
    sched = scheduler_cls()
    sched.add_request(request("ctx", opens="call"))
    for rid in ("a", "b"):
        sched.add_request(request(rid, "call-b0", 2, after="call"))
    assert sched.schedule() == ["ctx"] and sched.get_num_unfinished_requests() == 3
    time.sleep(0.06)  # an open gate is never stale
    assert sched.schedule() == []
    del sched.requests["ctx"]  # finished: vLLM frees its blocks (the fork's tail stays cached)
    assert sched.schedule() == ["a", "b"]
    held = admission.pending(sched)
    assert not held.groups and not held.gates


def test_a_group_arriving_after_its_gate_closed_enters_at_once(scheduler_cls):
    sched = scheduler_cls()
    sched.add_request(request("ctx", opens="call"))
    assert sched.schedule() == ["ctx"]
    del sched.requests["ctx"]
    assert sched.schedule() == []
    sched.add_request(request("a", "call-b0", 1, after="call"))
    assert sched.schedule() == ["a"] and not admission.pending(sched).gates


def test_a_gate_that_never_opens_or_is_never_used_is_bounded(scheduler_cls, monkeypatch):
    """A group behind a gate no context opened is held `GROUP_WAIT_S` at most; a closed gate
    no group came for is forgotten as long after."""
    monkeypatch.setattr(admission, "GROUP_WAIT_S", 0.05)
    sched = scheduler_cls()
    sched.add_request(request("a", "lost-b0", 1, after="lost"))
    sched.add_request(request("ctx", opens="unused"))
    assert sched.schedule() == ["ctx"]
    del sched.requests["ctx"]
    time.sleep(0.06)
    assert sched.schedule() == ["a"]  # stale: it enters; the unused gate closes now
    held = admission.pending(sched)
    assert not held.groups and set(held.gates) == {"unused"}
    time.sleep(0.06)
    assert sched.schedule() == [] and not held.gates


def test_aborting_a_gated_group_or_its_context_leaves_nothing_held(scheduler_cls):
    sched = scheduler_cls()
    sched.add_request(request("ctx", opens="call"))
    sched.add_request(request("a", "call-b0", 2, after="call"))
    sched.add_request(request("b", "call-b0", 2, after="call"))
    sched.schedule()
    sched.finish_requests(["ctx", "a", "b"], "aborted")  # the call's task was cancelled
    assert sched.finished == ["ctx", "a", "b"] and sched.get_num_unfinished_requests() == 0
    assert not admission.pending(sched).groups


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
