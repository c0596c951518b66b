"""Fit calibration profiles on labelled cases: the probabilities a client thresholds.

    python -m vllm_pcd.calibrate --model M --data labelled.jsonl --out profile.json
                                 [--options '{"layout": "document_first"}']
                                 [--low-confidence 0.7] [--dtype D] [--seed 0]

Each line of `--data` is a case: `message` (a text) or `messages` (a chat), `schema`, and
`expected` (the gold object). Cases are grouped by schema; each schema with enough cases gets
a profile, fitted on one half of its cases and measured on the other
(`core.profiles.fit_profile`). The table printed at the end is that held-out half: ECE and
accuracy without and with the profile, and the paired accuracy difference. Serve with
`--additional-config '{"pcd": {"calibration_profiles": ["profile.json"]}}'`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any, Sequence

from vllm_pcd.core.schema import SchemaSpec, option_index, parse_schema, value_at
from vllm_pcd.core.scoring import OBJECTIVES, FieldResult, Row, expected_calibration_error
from vllm_pcd.core.plan import Options
from vllm_pcd.core.profiles import (MIN_CASES, Profile, fit_profile, schema_fingerprint,
                                    write_profiles)


def read_cases(path: str | Path) -> list[dict[str, Any]]:
    cases = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        case = json.loads(line)
        if not isinstance(case, dict) or not {"schema", "expected"} <= set(case) \
                or not ({"message", "messages"} & set(case)):
            raise ValueError(f"{path}:{number}: a case needs schema, expected and message "
                             "(or messages)")
        cases.append(case)
    return cases


def by_schema(cases: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for case in cases:
        groups.setdefault(schema_fingerprint(parse_schema(case["schema"])), []).append(case)
    return groups


def labelled_rows(spec: SchemaSpec, cases: Sequence[dict[str, Any]],
                  results: Sequence[dict[str, FieldResult]]) -> dict[str, list[Row]]:
    """Field → its row per case (scores, gold index, decision); a case whose gold value is
    not an option of some field is left out of every field."""
    rows: dict[str, list[Row]] = {f.name: [] for f in spec.fields}
    for case, per_field in zip(cases, results):
        gold = [option_index(f, value_at(case["expected"], f)) for f in spec.fields]
        if None in gold:
            continue
        for f, index in zip(spec.fields, gold):
            r = per_field[f.name]
            rows[f.name].append(Row(r.scores, index, r.decision, r.paths, r.stepwise))
    return rows


def score_cases(llm: Any, schema: dict[str, Any], cases: Sequence[dict[str, Any]],
                options: Options) -> list[dict[str, FieldResult]]:
    """PCD's uncalibrated field results for every case, field by field."""
    from vllm_pcd.pipeline import constrained

    documents = [case.get("messages") or case["message"] for case in cases]
    results = constrained(llm, documents, schema, options)
    return [{r.field.name: r for r in result.fields} for result in results]


def paired_difference(a: Sequence[bool], b: Sequence[bool], rounds: int = 2000, seed: int = 0
                      ) -> dict[str, float]:
    """b − a in accuracy over the same rows, with a 95% paired bootstrap interval."""
    pairs = list(zip(a, b))
    rng = random.Random(seed)
    draws = sorted(sum(y - x for x, y in (rng.choice(pairs) for _ in pairs)) / len(pairs)
                   for _ in range(rounds))
    return {"difference": sum(y - x for x, y in pairs) / len(pairs),
            "low": draws[int(0.025 * rounds)], "high": draws[int(0.975 * rounds) - 1]}


def report(name: str, none: Sequence[tuple[float, bool]], fitted: Sequence[tuple[float, bool]],
           method: str, balanced: tuple[float, float] | None = None) -> str:
    diff = paired_difference([ok for _, ok in none], [ok for _, ok in fitted])
    line = (f"{name[:30]:30s} {len(fitted):5d} {method:12s} "
            f"{expected_calibration_error(none):6.3f} → {expected_calibration_error(fitted):6.3f}  "
            f"{sum(ok for _, ok in none) / len(none):6.3f} → "
            f"{sum(ok for _, ok in fitted) / len(fitted):6.3f}  "
            f"{100 * diff['difference']:+5.1f} [{100 * diff['low']:+.1f}, {100 * diff['high']:+.1f}]")
    return line + (f"  {balanced[0]:6.3f} → {balanced[1]:6.3f}" if balanced else "")


def labelled_groups(llm: Any, cases: Sequence[dict[str, Any]], options: Options
                    ) -> list[tuple[dict[str, Any], dict[str, list[Row]]]]:
    """Each schema's labelled rows (field → (scores, gold index) per case), scored with PCD;
    a schema with too few cases for a profile is left out with a line on stderr."""
    groups = []
    for group in by_schema(cases).values():
        schema = group[0]["schema"]
        if len(group) < MIN_CASES:
            print(f"schema of {', '.join(schema.get('properties', {}))}: skipped, "
                  f"{len(group)} cases (a profile needs {MIN_CASES})", file=sys.stderr)
            continue
        spec = parse_schema(schema)
        groups.append((schema, labelled_rows(spec, group, score_cases(llm, schema, group,
                                                                      options))))
    return groups


def calibrate(model: str, groups: Sequence[tuple[dict[str, Any], dict[str, list[Row]]]],
              options: Options, *, seed: int = 0, threshold: float | None = None,
              objective: str = "ece", out: Any = sys.stdout,
              flag_below_accuracy: float | None = None
              ) -> tuple[list[Profile], dict[str, list[tuple[float, bool]]]]:
    """A profile per schema's labelled rows, and the pooled held-out points; no model is
    needed, so saved rows can be fitted again."""
    profiles, pooled = [], {"none": [], "profile": []}
    print(f"{'schema (held-out half)':30s} {'rows':>5s} {'method':12s} "
          f"{'ECE: none → fitted':20s} {'accuracy: none → fitted':24s} {'paired Δ [95%]':20s}"
          " balanced accuracy", file=out)
    for schema, rows in groups:
        profile, points = fit_profile(model, schema, options, rows, seed=seed,
                                      threshold=threshold, objective=objective,
                                      flag_below_accuracy=flag_below_accuracy)
        profiles.append(profile)
        for key in pooled:
            pooled[key] += points[key]
        held = profile.held_out
        print(report(",".join(profile.fields), points["none"], points["profile"],
                     profile.method,
                     (held["uncalibrated"]["balanced_accuracy"], held["balanced_accuracy"])),
              file=out)
    if len(profiles) > 1:
        print(report("pooled", pooled["none"], pooled["profile"], "per schema"), file=out)
    return profiles, pooled


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from vllm_pcd.models import fast_dtype

    parser = argparse.ArgumentParser(prog="python -m vllm_pcd.calibrate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="labelled cases, JSON lines")
    parser.add_argument("--out", required=True, help="the profile file to write")
    parser.add_argument("--options", default="{}",
                        help="PCD options the profile is for, as the offline API's keywords")
    flags = parser.add_mutually_exclusive_group()
    flags.add_argument("--low-confidence", type=float, default=None, metavar="P",
                       help="mark answers whose calibrated probability is below P")
    flags.add_argument("--flag-below-accuracy", type=float, default=None, metavar="A",
                       help="mark answers below the probability chosen on the fitting half "
                            "so that the unmarked ones are right at least A of the time")
    parser.add_argument("--dtype", default=fast_dtype())
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0, help="the fit/held-out split's seed")
    add_objective(parser)
    return parser.parse_args(argv)


def add_objective(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--choose-by", choices=OBJECTIVES, default="ece",
                        help="what the method is chosen for: calibrated probabilities (ece) or "
                             "right answers (accuracy, which may undo a label prior)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options = Options.of(json.loads(args.options))
    if options.calibration != "none":
        raise SystemExit("--options: a profile maps uncalibrated scores; leave calibration out")
    cases = read_cases(args.data)
    os.environ.setdefault("VLLM_PLUGINS", "pcd")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache, on CPU hosts
    from vllm import LLM

    llm = LLM(args.model, dtype=args.dtype, max_model_len=args.max_model_len,
              enable_prefix_caching=True, seed=0)
    print(f"# {len(cases)} cases, model {args.model}, dtype {args.dtype}, options "
          f"{args.options}")
    profiles, _ = calibrate(args.model, labelled_groups(llm, cases, options), options,
                            seed=args.seed, threshold=args.low_confidence,
                            objective=args.choose_by,
                            flag_below_accuracy=args.flag_below_accuracy)
    if not profiles:
        raise SystemExit("no schema had enough labelled cases for a profile")
    write_profiles(args.out, profiles)
    print(f"wrote {len(profiles)} profile(s) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
