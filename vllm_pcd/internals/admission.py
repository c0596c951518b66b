"""Branch admission as a group: the API server submits a PCD request's branches one after the
other; the engine core may start a step after the first arrived and before the last, which
splits the branches over several backbone calls. Branches tagged with an admission group
(`Tags.group`, `Tags.group_size`) are held at admission until all of them have arrived and
then enter the waiting queue together, so one step schedules them all (within the token
budget).

A group enters only into free sequence slots: when its members fit beside the requests
already running and waiting (or the scheduler is empty). Otherwise several calls' groups,
released just before another client's request arrived, fill the step's sequence slots ahead
of it (measured at 32 fields and 8 clients: that request's first step held 128 requests but
only 591 of its 2,048 tokens, and it waited a step more than beside ordinary requests). A
request that arrives while a group is held is queued ahead of it; groups enter in the order
they were first held.

Nothing is held for long, whatever arrives or not:
- a group waits at most `GROUP_WAIT_S` from its first arrival. The scheduler releases stale
  groups at the start of its own step, and counts held requests as unfinished so that the
  engine keeps stepping while any are held, even when nothing else arrives;
- an aborted member releases its group (so the abort finds it), and an abort of every request
  (pause with abort, shutdown) releases them all.

A call's first branch group can be submitted with its shared context instead of after it
(`Tags.after` names the gate the context request `Tags.opens`): the group is then held until
that request has finished, when its KV is in the prefix cache to fork, and enters the next
step, with no round trip through the API server between the context's step and the
branches'. An open gate holds its group for as long as its context runs (the context's own
life is bounded); a gate that never opened holds it `GROUP_WAIT_S` at most, and a closed gate
is forgotten once its group has entered, or `GROUP_WAIT_S` after it closed.

Runs in: the engine core process (the scheduler).
Changes: `Scheduler.add_request`, `finish_requests` and `schedule` hold a tagged group until it
  is whole.
Remove when: vLLM admits a group of requests atomically.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from vllm_pcd.compat import require_methods
from vllm_pcd.internals.intake import tags_of

GROUP_WAIT_S = 2.0
IDLE_POLL_S = 0.005  # a step that has only held requests sleeps this long instead of spinning


class Pending:
    """Groups held at admission: group id → (first arrival, members); and gates: a gate's
    name → its context request's id and when that request was seen finished (None while it
    runs)."""

    def __init__(self) -> None:
        self.groups: dict[str, tuple[float, list[Any]]] = {}
        self.gates: dict[str, tuple[str, float | None]] = {}

    def _gate(self, group: str) -> tuple[bool, tuple[str, float | None] | None]:
        """Whether the group waits behind a gate, and that gate (None until a context opens
        it)."""
        tags = tags_of(self.groups[group][1][0])
        if tags is None or tags.after is None:
            return False, None
        return True, self.gates.get(tags.after)

    def ready(self, group: str) -> bool:
        """Every member is here, and the gate it waits behind (if any) has closed."""
        members = self.groups[group][1]
        gated, gate = self._gate(group)
        closed = not gated or (gate is not None and gate[1] is not None)
        return len(members) >= tags_of(members[0]).group_size and closed

    def stale(self, now: float) -> list[str]:
        """Groups held `GROUP_WAIT_S`, unless behind a gate whose context still runs."""
        def gate_open(group: str) -> bool:
            _, gate = self._gate(group)
            return gate is not None and gate[1] is None

        return [g for g, (since, _) in self.groups.items()
                if now - since > GROUP_WAIT_S and not gate_open(g)]

    def close_gates(self, live: Any, now: float) -> None:
        """Gates whose context request has left the scheduler close; closed ones are
        forgotten after `GROUP_WAIT_S`."""
        for name, (opener, closed) in list(self.gates.items()):
            if closed is None and opener not in live:
                self.gates[name] = (opener, now)
            elif closed is not None and now - closed > GROUP_WAIT_S:
                del self.gates[name]

    def held(self) -> int:
        return sum(len(members) for _, members in self.groups.values())

    def holding(self, request_ids: set[str]) -> list[str]:
        return [g for g, (_, members) in self.groups.items()
                if any(m.request_id in request_ids for m in members)]


def pending(scheduler: Any) -> Pending:
    if not hasattr(scheduler, "_pcd_pending"):
        scheduler._pcd_pending = Pending()
    return scheduler._pcd_pending


def patch_scheduler(scheduler_cls: Any, paused_all: Any = None) -> None:
    """`paused_all`: the scheduler's pause state in which nothing steps (held requests are
    then not counted, as vLLM counts none)."""
    add_request = scheduler_cls.add_request
    finish_requests = scheduler_cls.finish_requests
    schedule = scheduler_cls.schedule
    unfinished = scheduler_cls.get_num_unfinished_requests

    def release(self: Any, group: str) -> None:
        held = pending(self)
        _, members = held.groups.pop(group)
        tags = tags_of(members[0])
        if tags is not None and tags.after is not None:
            held.gates.pop(tags.after, None)  # a gate serves one group
        for member in members:
            add_request(self, member)

    def release_due(self: Any) -> None:
        """Ready groups (whole, gate closed) while they fit the free slots, then stale ones.
        The first group always enters an empty scheduler, however large."""
        held, now = pending(self), time.monotonic()
        if held.gates:
            held.close_gates(self.requests, now)
        running, waiting = self.get_request_counts()
        slots = getattr(self, "max_num_active_reqs", self.max_num_running_reqs)
        free, empty = slots - running - waiting, not running and not waiting
        for group in list(held.groups):
            if not held.ready(group):
                continue
            size = len(held.groups[group][1])
            if size > free and not empty:
                break  # a later group may not overtake it
            release(self, group)
            free, empty = free - size, False
        for group in held.stale(now):
            release(self, group)

    @functools.wraps(add_request)
    def add_request_grouped(self: Any, request: Any) -> None:
        """Held members wait for the scheduler's step, which releases what fits."""
        held = pending(self)
        tags = tags_of(request)
        if tags is not None and tags.opens is not None:
            held.gates[tags.opens] = (request.request_id, None)
        if tags is None or tags.group is None or request.request_id in self.requests:
            return add_request(self, request)
        _, members = held.groups.setdefault(tags.group, (time.monotonic(), []))
        members.append(request)

    @functools.wraps(schedule)
    def schedule_releasing(self: Any, *args: Any, **kwargs: Any) -> Any:
        held = pending(self)
        if held.groups or held.gates:
            release_due(self)
            if held.groups and not self.requests:
                time.sleep(IDLE_POLL_S)
        return schedule(self, *args, **kwargs)

    @functools.wraps(unfinished)
    def unfinished_with_held(self: Any) -> int:
        count = unfinished(self)
        if paused_all is not None and getattr(self, "_pause_state", None) == paused_all:
            return count
        return count + pending(self).held()

    @functools.wraps(finish_requests)
    def finish_requests_grouped(self: Any, request_ids: Any, finished_status: Any) -> Any:
        held = pending(self)
        if held.groups:
            if request_ids is None:
                groups = list(held.groups)
            else:
                ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
                groups = held.holding(ids)
            for group in groups:
                release(self, group)  # admitted now, so the abort below finds them
        return finish_requests(self, request_ids, finished_status)

    scheduler_cls.add_request = add_request_grouped
    scheduler_cls.schedule = schedule_releasing
    scheduler_cls.get_num_unfinished_requests = unfinished_with_held
    scheduler_cls.finish_requests = finish_requests_grouped


def apply() -> None:
    from vllm.v1.core.sched.scheduler import PauseState, Scheduler

    require_methods(Scheduler, "add_request", "finish_requests", "schedule",
                    "get_num_unfinished_requests", "get_request_counts", patch="admission")
    patch_scheduler(Scheduler, PauseState.PAUSED_ALL)
