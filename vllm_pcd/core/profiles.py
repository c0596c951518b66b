"""Calibration profiles: fitted maps (`fitting`) for one model, one schema and one set of options.

`python -m vllm_pcd.calibrate` writes them; a server (or an offline `LLM`) loads them from
`additional_config.pcd.calibration_profiles`. A call whose schema and scoring options are a
profile's gets that profile's probabilities, `calibrated: true`, and where the profile sets a
threshold, `low_confidence` per field. Scores depend on every word of the schema (names,
descriptions, options) and on the options that shape the prompt, so a profile matches on
exactly those: a schema with one description changed is another schema, and stays
uncalibrated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from vllm_pcd.core.scoring import (METHODS, Calibrator, FieldResult, Identity, Row, answer_points,
                                   balanced_accuracy, calibrator_from_dict, choose,
                                   expected_calibration_error, halves, reliability, stepwise_kept)
from vllm_pcd.core.plan import Options
from vllm_pcd.core.schema import SchemaSpec, parse_schema

FORMAT = "vllm-pcd-calibration/1"
# The options a profile was fitted under and must match (everything that changes a score).
MATCHED_OPTIONS = ("mode", "normalization", "formulation", "layout", "joint")


def schema_fingerprint(spec: SchemaSpec) -> str:
    """A digest of everything about the parsed schema that reaches the prompt or the scores."""
    fields = [dataclasses.asdict(f) for f in spec.fields]
    text = json.dumps(fields, sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def options_key(options: Options) -> tuple[Any, ...]:
    return tuple(getattr(options, name) for name in MATCHED_OPTIONS)


@dataclass(frozen=True)
class Profile:
    model: str
    schema: dict[str, Any]  # as the client sends it: a profile says what it is for
    options: dict[str, Any]
    fields: dict[str, Calibrator]
    thresholds: dict[str, float]  # field → the probability below which it is low_confidence
    held_out: dict[str, Any]  # the method's and no map's ECE and accuracy on unseen cases

    @property
    def method(self) -> str:
        return next(iter(self.fields.values())).method

    def key(self) -> tuple[str, tuple[Any, ...]]:
        return schema_fingerprint(parse_schema(self.schema)), options_key(Options(**self.options))

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "schema": self.schema, "options": self.options,
                "fields": {name: c.to_dict() for name, c in self.fields.items()},
                "thresholds": self.thresholds, "held_out": self.held_out}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        options = dict(data.get("options") or {})
        if Options(**options).calibration != "none":
            raise ValueError("a profile maps uncalibrated scores; its options cannot set "
                             "calibration")
        profile = cls(str(data["model"]), data["schema"], options,
                      {name: calibrator_from_dict(c) for name, c in data["fields"].items()},
                      {name: float(t) for name, t in (data.get("thresholds") or {}).items()},
                      dict(data.get("held_out") or {}))
        names = [f.name for f in parse_schema(profile.schema).fields]
        if sorted(profile.fields) != sorted(names) or not set(profile.thresholds) <= set(names):
            raise ValueError("a profile's fields must be its schema's fields")
        return profile

    def diagnostics(self) -> dict[str, Any]:
        return {"method": self.method, "profile_model": self.model,
                "held_out_ece": self.held_out.get("ece"),
                "held_out_cases": self.held_out.get("cases")}

    def apply(self, results: Sequence[FieldResult]) -> tuple[FieldResult, ...]:
        """Each field's scores through its map; the uncalibrated score stays in each
        candidate's diagnostics, and a threshold marks the field `low_confidence`."""
        out = []
        for result in results:
            calibrator = self.fields[result.field.name]
            scores = calibrator.apply(result.scores)
            more = result.candidate_extra or tuple({} for _ in scores)
            mapped = result.recalibrated(scores, [{**m, "uncalibrated_score": raw}
                                                  for m, raw in zip(more, result.scores)],
                                         stepwise_kept(calibrator, result.stepwise))
            if (threshold := self.thresholds.get(result.field.name)) is not None:
                chosen = math.exp(mapped.scores[mapped.best_index])
                mapped = dataclasses.replace(mapped, extra={**mapped.extra,
                                                            "low_confidence": chosen < threshold})
            out.append(mapped)
        return tuple(out)


def matches_model(profile: Profile, names: Iterable[str]) -> bool:
    """The served model by its path or name; a path matches by its last part too, so a
    profile fitted on one machine serves on another."""
    def last(name: str) -> str:
        return Path(name.rstrip("/")).name
    return any(profile.model == n or last(profile.model) == last(n) for n in names)


class ProfileBook:
    """The loaded profiles of one model, by schema fingerprint and options."""

    def __init__(self, profiles: Iterable[Profile] = ()):
        self._by_key = {p.key(): p for p in profiles}

    def __len__(self) -> int:
        return len(self._by_key)

    def find(self, spec: SchemaSpec, options: Options) -> Profile | None:
        if not self._by_key or options.calibration != "none":
            return None
        return self._by_key.get((schema_fingerprint(spec), options_key(options)))


def read_profiles(path: str | Path) -> list[Profile]:
    """One file written by `vllm_pcd.calibrate`: every profile in it."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a vllm-pcd calibration profile (format {FORMAT})")
    return [Profile.from_dict(p) for p in data["profiles"]]


def write_profiles(path: str | Path, profiles: Sequence[Profile]) -> None:
    Path(path).write_text(json.dumps({"format": FORMAT,
                                      "profiles": [p.to_dict() for p in profiles]}, indent=1))


# Fewer labelled cases than this per schema are refused; below PER_FIELD (in the fitting
# half), one temperature is fitted over all the schema's fields and no biases are.
MIN_CASES = 20
PER_FIELD = 30


def _summary(points: Sequence[tuple[float, bool]]) -> dict[str, Any]:
    return {"ece": expected_calibration_error(points),
            "accuracy": sum(ok for _, ok in points) / len(points), "reliability":
            reliability(points)}


def threshold_for(points: Sequence[tuple[float, bool]], accuracy: float) -> float:
    """The lowest probability such that the answers at or above it are right at least
    `accuracy` of the time (the most answers kept); above every answer where none is."""
    ranked = sorted(points, key=lambda p: -p[0])
    right, best = 0, math.nextafter(1.0, 2.0)
    for kept, (probability, ok) in enumerate(ranked, start=1):
        right += ok
        if right >= accuracy * kept and (kept == len(ranked) or ranked[kept][0] < probability):
            best = probability
    return best


def fit_profile(model: str, schema: dict[str, Any], options: Options,
                rows: dict[str, list[Row]], *, seed: int = 0, threshold: float | None = None,
                objective: str = "ece", flag_below_accuracy: float | None = None
                ) -> tuple[Profile, dict[str, list[tuple[float, bool]]]]:
    """A profile fitted on one half of the labelled rows (field → rows, case by case, so
    every field's row k is case k) and measured on the other, which neither the fit nor the
    choice of method saw (the method is chosen by cross-validation inside the fitting
    half). Also returns the held-out points (probability given, right) of no map and of
    the profile, for paired comparisons. `flag_below_accuracy` chooses the `low_confidence`
    threshold on the fitting half: the lowest at which the kept answers reach it."""
    cases = len(next(iter(rows.values())))
    if cases < MIN_CASES:
        raise ValueError(f"{cases} labelled cases; a profile needs at least {MIN_CASES}")
    fit, test = halves(cases, seed)
    fit_rows = {name: [r[i] for i in fit] for name, r in rows.items()}
    test_rows = {name: [r[i] for i in test] for name, r in rows.items()}
    if len(fit) >= PER_FIELD:
        choice = choose(list(fit_rows.values()), seed, objective=objective)
        fields = {name: METHODS[choice.method].fit(r) for name, r in fit_rows.items()}
    else:  # one temperature for every field
        pooled = [row for r in fit_rows.values() for row in r]
        choice = choose([pooled], seed, ("none", "temperature"), objective)
        shared = METHODS[choice.method].fit(pooled)
        fields = {name: shared for name in fit_rows}
    if flag_below_accuracy is not None:
        threshold = threshold_for([p for name, r in fit_rows.items()
                                   for p in answer_points(fields[name], r)], flag_below_accuracy)
    points = {"none": [p for r in test_rows.values() for p in answer_points(Identity(), r)],
              "profile": [p for name, r in test_rows.items()
                          for p in answer_points(fields[name], r)]}
    def balanced(maps: dict[str, Calibrator]) -> float | None:
        """Per field, then the mean over fields."""
        per_field = [balanced_accuracy(maps[name], r) for name, r in test_rows.items()]
        return sum(per_field) / len(per_field)

    none = {name: Identity() for name in fields}
    held_out = {"cases": len(test), "fitted_cases": len(fit), "seed": seed,
                "method": choice.method, "objective": objective, **_summary(points["profile"]),
                "balanced_accuracy": balanced(fields),
                "uncalibrated": {**_summary(points["none"]), "balanced_accuracy": balanced(none)},
                "cross_validated": choice.cross_validated}
    if threshold is not None:
        kept = [ok for p, ok in points["profile"] if p >= threshold]
        held_out["low_confidence"] = {
            "threshold": threshold, "chosen_for_accuracy": flag_below_accuracy,
            "share": 1 - len(kept) / len(points["profile"]),
            "accuracy_above": sum(kept) / len(kept) if kept else None}
    profile = Profile(model, schema, options.settings(MATCHED_OPTIONS),
                      fields, {name: threshold for name in fields} if threshold is not None
                      else {}, held_out)
    return profile, points
