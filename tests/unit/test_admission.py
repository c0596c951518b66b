"""Grouped admission without a vLLM engine: the scheduler patch on a fake scheduler, so
each rule (groups enter whole, into free slots, after their gate, within a bounded wait)
is checked step by step."""

import time
from types import SimpleNamespace

import pytest

from vllm_pcd.internals import admission, tags

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too


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
