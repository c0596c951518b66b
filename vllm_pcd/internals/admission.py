"""Branch admission as a group: the API server submits a PCD request's branches one after the
other; the engine core may start a step after the first arrived and before the last, which
splits the branches over several backbone calls. Branches tagged with
`extra_args={"pcd_group": id, "pcd_group_size": n}` are held at admission until all n have
arrived and then enter the waiting queue together, so one step schedules them all (within
the token budget). A held branch that is aborted releases its group, and a group never waits
longer than `GROUP_WAIT_S`, so nothing can be held forever.
"""

from __future__ import annotations

import functools
import time
from typing import Any

GROUP_KEY = "pcd_group"
GROUP_SIZE_KEY = "pcd_group_size"
GROUP_WAIT_S = 2.0

def group_args(group: str, size: int) -> dict[str, Any]:
    return {GROUP_KEY: group, GROUP_SIZE_KEY: size}


def _group_of(request: Any) -> tuple[str, int] | None:
    params = request.sampling_params
    extra = getattr(params, "extra_args", None) if params is not None else None
    if not extra or GROUP_KEY not in extra:
        return None
    return str(extra[GROUP_KEY]), int(extra[GROUP_SIZE_KEY])


class _Pending:
    def __init__(self) -> None:
        self.groups: dict[str, tuple[float, list[Any]]] = {}

    def stale(self, now: float) -> list[str]:
        return [g for g, (since, _) in self.groups.items() if now - since > GROUP_WAIT_S]


def _pending(scheduler: Any) -> _Pending:
    if not hasattr(scheduler, "_pcd_pending"):
        scheduler._pcd_pending = _Pending()
    return scheduler._pcd_pending


def _patch_scheduler(scheduler_cls: Any) -> None:
    add_request = scheduler_cls.add_request
    finish_requests = scheduler_cls.finish_requests

    def release(self: Any, group: str) -> None:
        _, members = _pending(self).groups.pop(group)
        for member in members:
            add_request(self, member)

    @functools.wraps(add_request)
    def add_request_grouped(self: Any, request: Any) -> None:
        pending = _pending(self)
        for group in pending.stale(time.monotonic()):
            release(self, group)
        tag = _group_of(request)
        if tag is None or request.request_id in self.requests:
            return add_request(self, request)
        group, size = tag
        since, members = pending.groups.setdefault(group, (time.monotonic(), []))
        members.append(request)
        if len(members) >= size:
            release(self, group)

    @functools.wraps(finish_requests)
    def finish_requests_grouped(self: Any, request_ids: Any, finished_status: Any) -> Any:
        pending = _pending(self)
        if pending.groups and request_ids is not None:
            ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
            for group, (_, members) in list(pending.groups.items()):
                if any(m.request_id in ids for m in members):
                    release(self, group)  # admitted now, so the abort below finds them
        return finish_requests(self, request_ids, finished_status)

    scheduler_cls.add_request = add_request_grouped
    scheduler_cls.finish_requests = finish_requests_grouped


def apply() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    _patch_scheduler(Scheduler)
