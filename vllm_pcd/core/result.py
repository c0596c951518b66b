"""A PCD call's answer: the typed object, each field's result, and what it cost.

`finish` turns a plan and the engine's reports into it: every field scored (`scoring`),
calibrated when a prior is given, assembled into the object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_pcd.core.assemble import FieldResult, assemble, to_json
from vllm_pcd.core.calibration import Prior
from vllm_pcd.core.execution import Execution
from vllm_pcd.core.plan import Plan
from vllm_pcd.core.schema import SchemaSpec
from vllm_pcd.core.scoring import calibrate, field_results


@dataclass(frozen=True)
class PCDResult:
    object: dict[str, Any]
    fields: tuple[FieldResult, ...]
    plan: Plan
    execution: Execution
    plan_s: float
    projection_route: str | None = None  # the restricted LM head's route, when it is on
    calibration: dict[str, Any] | None = None  # how the scores were calibrated, if they were

    @property
    def content(self) -> str:
        return to_json(self.object)

    def projection(self) -> dict[str, Any]:
        """What the worker's LM head did for this request, as measured by its outputs
        (`engine.probe_id`): how many engine requests it projected onto their allowed ids
        and, when any, the route it serves them with; `fallbacks` counts the requests that
        asked for the restricted head and got the full one."""
        measured = sum(b.restricted for b in self.execution.branches)
        asked = sum(b.asked_restricted for b in self.execution.branches)
        return {"route": self.projection_route if measured else None,
                "restricted_requests": measured, "fallbacks": asked - measured}

    def diagnostics(self, reveal_cache: bool = True) -> dict[str, Any]:
        """`reveal_cache` False leaves out what tells a cache hit (tokens computed, context
        and prior cached), as vLLM does without --enable-prompt-tokens-details."""
        diagnostics = self._diagnostics()
        if not reveal_cache:
            for key in ("computed", "context_cached"):
                diagnostics["tokens"].pop(key)
            for key in ("prior_cached", "prior_tokens_computed"):
                (diagnostics["calibration"] or {}).pop(key, None)
        return diagnostics

    def _diagnostics(self) -> dict[str, Any]:
        ex = self.execution
        shared = len(self.plan.shared_ids)
        modes = {r.extra["mode"] for r in self.fields}
        return {
            "mode": modes.pop() if len(modes) == 1 else "mixed",
            "calibrated": self.calibration is not None,
            "calibration": self.calibration,
            "backbone_calls": ex.backbone_calls,
            "tokens": {
                "shared": shared,
                "branch": self.plan.branch_tokens,
                "ideal": shared + self.plan.branch_tokens,
                "computed": ex.tokens_computed,
                # shared-context tokens earlier requests had computed (the prefix cache)
                "context_cached": ex.prefill.cached_tokens,
            },
            "timings": {
                "plan_s": self.plan_s,
                "prefill_s": ex.prefill_s,
                "branches_s": ex.branches_s,
                "total_s": self.plan_s + ex.prefill_s + ex.branches_s,
            },
            "projection": self.projection(),
            "fields": {r.field.name: r.diagnostics() for r in self.fields},
        }


def finish(schema: SchemaSpec, plan: Plan, execution: Execution, plan_s: float,
           normalization: str = "sum", projection_route: str | None = None,
           prior: Prior | None = None) -> PCDResult:
    results = field_results(plan, execution.branches, normalization)
    calibration = None
    if prior is not None:
        results = calibrate(results, prior.fields)
        calibration = {"method": "content_free", "prior_cached": prior.cached,
                       "prior_tokens_computed": prior.tokens_computed}
    return PCDResult(assemble(schema, results), results, plan, execution, plan_s,
                     projection_route, calibration)
