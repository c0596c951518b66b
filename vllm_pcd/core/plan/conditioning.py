"""Conditioned fields: a field answered after others, reading the values chosen for them.

Each of PCD's branches sees only the shared context, so it cannot keep its answer
consistent with another field's; AR JSON writes each value after the ones before it. A
field with `x-pcd-after` (every field under `pcd_joint`) is answered in a later round. Its
branch continues the object with the values already chosen: `{"a": true, "b":`. Fields
that read nothing share the first round, so a call takes 1 + the depth of its dependency
graph rounds. Every round's requests fork the longest earlier prompt of the call that
their own extends (`Answered.prompts`), at its exact length, so no token is computed twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from vllm_pcd.core.plan.options import Options
from vllm_pcd.core.schema import FieldSpec, SchemaError, SchemaSpec

# An engine request forks at most this many earlier prompt lengths (tags allow 16, and
# the request's own fork lengths come first).
MAX_READS = 4


@dataclass(frozen=True)
class Answered:
    """What the earlier rounds of a call settled: the values chosen (by field name) and
    every prompt their requests ran, whose KV this round's requests may fork."""

    values: Mapping[str, Any] = field(default_factory=dict)
    prompts: tuple[tuple[int, ...], ...] = ()

    def then(self, plan: Any, results: Sequence[Any]) -> Answered:
        """After a round (its `plan.Plan` and field results): its values chosen too."""
        return Answered({**self.values, **{r.field.name: r.value for r in results}},
                        (*self.prompts, *plan.prompts()))


def read_values(spec: SchemaSpec, joint: bool, values: Mapping[str, Any]
                ) -> dict[str, dict[str, Any]]:
    """Per conditioned field, the values its branch read (for the diagnostics)."""
    return {f.name: {spec.fields[j].name: values[spec.fields[j].name] for j in needs}
            for f, needs in zip(spec.fields, conditions(spec, joint)) if needs}


def conditions(spec: SchemaSpec, joint: bool) -> tuple[tuple[int, ...], ...]:
    """Per field, the fields whose values its branch reads: its `x-pcd-after` (under
    `joint`, every field before it), with theirs in turn, in schema order."""
    index = {f.name: i for i, f in enumerate(spec.fields)}
    direct = [{index[n] for n in f.after} | (set(range(i)) if joint else set())
              for i, f in enumerate(spec.fields)]
    closed: dict[int, set[int]] = {}

    def reads(i: int) -> set[int]:
        if i not in closed:
            closed[i] = set().union(*({j} | reads(j) for j in direct[i])) if direct[i] else set()
        return closed[i]

    return tuple(tuple(sorted(reads(i))) for i in range(len(spec.fields)))


def round_fields(spec: SchemaSpec, joint: bool, answered: Answered) -> list[int]:
    """The fields this round answers: not answered yet, and reading only answered ones."""
    done = set(answered.values)
    return [i for i, (f, needs) in enumerate(zip(spec.fields, conditions(spec, joint)))
            if f.name not in done and all(spec.fields[j].name in done for j in needs)]


def rounds_needed(spec: SchemaSpec, joint: bool) -> int:
    """How many rounds a call takes: one more than its longest chain of reads."""
    needs = conditions(spec, joint)
    depth: dict[int, int] = {}
    for i in sorted(range(len(needs)), key=lambda i: len(needs[i])):  # closed: reads first
        depth[i] = 1 + max((depth[j] for j in needs[i]), default=0)
    return max(depth.values(), default=1)


def check(spec: SchemaSpec, options: Options) -> None:
    """Conditioned fields continue the JSON object, and have no content-free prior (their
    prompts depend on the values chosen for the document)."""
    if not any(conditions(spec, options.joint)):
        return
    if not options.formulation.json_stem:
        raise SchemaError("conditioned fields (pcd_joint, x-pcd-after) continue the JSON "
                          "object: use a json formulation, not codes", param="pcd_formulation",
                          rule="conditioned")
    if any(f.nested for f in spec.fields):
        raise SchemaError("conditioned fields (pcd_joint, x-pcd-after) are top-level fields: "
                          "this schema has nested objects or label sets", param="pcd_joint",
                          rule="conditioned")
    if options.calibration != "none":
        raise SchemaError("conditioned fields (pcd_joint, x-pcd-after) cannot be calibrated "
                          "against a content-free prior", param="pcd_calibration",
                          rule="conditioned")


def written(read: Sequence[tuple[FieldSpec, Any]], space: str, between: str) -> str:
    """The object's keys and values already chosen, as the model would have written them
    (`space` after each colon, `between` after each comma)."""
    return "".join(f"{json.dumps(f.name, ensure_ascii=False)}:{space}"
                   f"{json.dumps(v, ensure_ascii=False)},{between}" for f, v in read)


def fork_reads(prompt: Sequence[int], earlier: Sequence[tuple[int, ...]], floor: int
               ) -> tuple[int, ...]:
    """The lengths of the longest earlier prompts that `prompt` extends, beyond `floor`."""
    lengths = {len(p) for p in earlier
               if floor < len(p) < len(prompt) and tuple(prompt[:len(p)]) == p}
    return tuple(sorted(lengths, reverse=True)[:MAX_READS])
