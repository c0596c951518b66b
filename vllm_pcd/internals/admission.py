"""Branch admission as a group: the API server submits a PCD request's branches one after the
other; the engine core may start a step after the first arrived and before the last, which
splits the branches over several backbone calls. Branches tagged with an admission group
(`Tags.group`, `Tags.group_size`) are held at admission until all of them have arrived and
then enter the waiting queue together, so one step schedules them all (within the token
budget).

Nothing is held for long, whatever arrives or not:
- a group waits at most `GROUP_WAIT_S` from its first arrival. The scheduler releases stale
  groups at the start of its own step, and counts held requests as unfinished so that the
  engine keeps stepping while any are held, even when nothing else arrives;
- an aborted member releases its group (so the abort finds it), and an abort of every request
  (pause with abort, shutdown) releases them all.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from vllm_pcd.compat import require_methods
from vllm_pcd.internals.intake import tags_of

GROUP_WAIT_S = 2.0
IDLE_POLL_S = 0.005  # a step that has only held requests sleeps this long instead of spinning


def _group_of(request: Any) -> tuple[str, int] | None:
    tags = tags_of(request)
    if tags is None or tags.group is None:
        return None
    return tags.group, tags.group_size


class Pending:
    """Groups held at admission: group id → (first arrival, members)."""

    def __init__(self) -> None:
        self.groups: dict[str, tuple[float, list[Any]]] = {}

    def stale(self, now: float) -> list[str]:
        return [g for g, (since, _) in self.groups.items() if now - since > GROUP_WAIT_S]

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
        _, members = pending(self).groups.pop(group)
        for member in members:
            add_request(self, member)

    def release_stale(self: Any) -> None:
        for group in pending(self).stale(time.monotonic()):
            release(self, group)

    @functools.wraps(add_request)
    def add_request_grouped(self: Any, request: Any) -> None:
        release_stale(self)
        tag = _group_of(request)
        if tag is None or request.request_id in self.requests:
            return add_request(self, request)
        group, size = tag
        _, members = pending(self).groups.setdefault(group, (time.monotonic(), []))
        members.append(request)
        if len(members) >= size:
            release(self, group)

    @functools.wraps(schedule)
    def schedule_releasing(self: Any, *args: Any, **kwargs: Any) -> Any:
        held = pending(self)
        if held.groups:
            release_stale(self)
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
                    "get_num_unfinished_requests", patch="admission")
    patch_scheduler(Scheduler, PauseState.PAUSED_ALL)
