"""Fitted calibration on public tasks, measured on the half of each task no fit saw.

    python -m benchmarks.calibration [--model PATH] [--data SRC …] [--limit N]
                                     [--exclude N …] [--rows RESULTS.json] [--out PATH]

Each task (`benchmarks.public_data` source, one schema per task) gets a profile from
`vllm_pcd.calibrate`: fitted on one seeded half of its cases, the method chosen by
cross-validation inside that half, then measured on the other half. The table gives, per task
and pooled, the held-out ECE and accuracy without and with the profile and their paired
difference; the PNG is the pooled held-out reliability diagram, before and after. Beside each
pooled ECE stands the ECE's floor at that size: the mean ECE of labels drawn from the
returned probabilities themselves, what a perfectly calibrated map would measure. The results
keep every task's scored rows, so `--rows` fits them again without a model.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from benchmarks import public_data, tasks
from benchmarks.harness import provenance, publish, save_reliability
from vllm_pcd.core.scoring import Row, expected_calibration_error, reliability
from vllm_pcd.core.plan import Options

# Every task gets its own profile; the pools keep the tasks earlier measurements looked at
# apart from the untouched ones of one schema each (`benchmarks.tasks`; a BBH choice task's
# options change per case, so no profile matches it).
DEFAULT_DATA = tasks.SEEN[:2]
UNTOUCHED = [t for t in tasks.SKEWED if t in tasks.UNTOUCHED_SINGLE]


def ece_floor(points: list[tuple[float, bool]], draws: int = 200, seed: int = 0) -> float:
    """The ECE of perfectly calibrated answers at these probabilities: each answer counted
    right with its own probability. A measured ECE near this is at the estimator's noise."""
    rng = random.Random(seed)
    return sum(expected_calibration_error([(p, rng.random() < p) for p, _ in points])
               for _ in range(draws)) / draws


def summary(points: list[tuple[float, bool]]) -> dict[str, Any]:
    return {"rows": len(points), "ece": expected_calibration_error(points),
            "ece_floor": ece_floor(points),
            "accuracy": sum(ok for _, ok in points) / len(points),
            "reliability": reliability(points)}


def both(points: dict[str, list[tuple[float, bool]]]) -> dict[str, Any]:
    """A pool's held-out summary without a map and with the profiles."""
    return {"uncalibrated": summary(points["none"]), "profile": summary(points["profile"])}


Groups = list[tuple[dict[str, Any], dict[str, list[Row]]]]


def spread(model: str, groups: Groups, options: Options, seeds: range,
           objective: str = "ece") -> str:
    """How much one split decides: the pooled held-out ECE and paired accuracy difference of
    the same rows fitted again on other seeded splits."""
    from vllm_pcd.calibrate import calibrate, paired_difference

    eces, deltas = [], []
    for seed in seeds:
        _, points = calibrate(model, groups, options, seed=seed, objective=objective,
                              out=io.StringIO())
        eces.append(expected_calibration_error(points["profile"]))
        deltas.append(paired_difference([ok for _, ok in points["none"]],
                                        [ok for _, ok in points["profile"]]))
    passed = sum(e <= 0.03 and d["low"] >= -0.01 for e, d in zip(eces, deltas))
    eces.sort()
    return (f"{'':30s} {len(seeds)} other splits: ECE median {eces[len(eces) // 2]:.3f} "
            f"[{eces[0]:.3f}, {eces[-1]:.3f}], accuracy Δ median "
            f"{100 * sorted(d['difference'] for d in deltas)[len(deltas) // 2]:+.1f}; "
            f"the rule (ECE ≤ 0.03, Δ low ≥ −1) holds on {passed}")


def saved_groups(path: Path) -> dict[str, Groups]:
    """Each group's labelled rows as an earlier run of this benchmark saved them (a run from
    before rows kept their decision is read as `most_probable`, what it measured)."""
    def row(saved: list[Any]) -> Row:
        scores, gold, *decided = saved
        if decided:
            decision, paths, stepwise = decided
            return Row(tuple(scores), gold, decision, tuple(map(tuple, paths)), tuple(stepwise))
        return Row(tuple(scores), gold)

    saved = json.loads(path.read_text())["rows"]
    return {group: [(schema, {name: [row(r) for r in rows] for name, rows in fields.items()})
                    for schema, fields in items]
            for group, items in saved.items()}


def plot(results: dict[str, Any], path: Path) -> None:
    curves = [(pooled[key]["reliability"], f"{group}, {label} (ECE {pooled[key]['ece']:.3f})",
               "-" if key == "profile" else "--")
              for group, pooled in results["pooled"].items()
              for key, label in (("uncalibrated", "uncalibrated"), ("profile", "fitted"))]
    save_reliability(curves, f"{Path(results['model']).name}, {results['dtype']}: held-out halves",
                     path, legend_size=8)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from vllm_pcd.calibrate import add_objective, calibrate, labelled_groups, report
    from vllm_pcd.models import default_model_path, fast_dtype

    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibration",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--data", nargs="+", default=DEFAULT_DATA, help="tasks pooled as seen")
    parser.add_argument("--untouched", nargs="*", default=UNTOUCHED,
                        help="tasks pooled apart from --data")
    parser.add_argument("--limit", type=int, default=120, help="cases per task")
    parser.add_argument("--exclude", type=int, nargs="*", default=[], metavar="N",
                        help="leave out every case of the earlier draws of these sizes")
    parser.add_argument("--rows", type=Path, help="fit the rows an earlier run saved; no model")
    parser.add_argument("--dtype", default=fast_dtype())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--splits", type=int, default=0, metavar="K",
                        help="also fit again on K other seeded splits and print the spread")
    parser.add_argument("--options", default="{}", help="PCD options, as JSON keywords")
    add_objective(parser)
    parser.add_argument("--flag-below-accuracy", type=float, default=0.9, metavar="A",
                        help="each profile's `low_confidence` threshold, chosen on its fitting "
                             "half so that unflagged answers are right A of the time")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "calibration")
    args = parser.parse_args(argv)

    options = Options.of(json.loads(args.options))
    groups = {"seen": args.data, "untouched": args.untouched}
    start = time.perf_counter()
    if args.rows:
        scored = saved_groups(args.rows)
        groups = json.loads(args.rows.read_text()).get("groups", groups)  # the saved run's
    else:
        os.environ.setdefault("VLLM_PLUGINS", "pcd")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        from vllm import LLM

        llm = LLM(args.model, dtype=args.dtype, max_model_len=4096,
                  enable_prefix_caching=True, seed=0)
        drawn = {source: public_data.load(source, args.limit, exclude=args.exclude)
                 for sources in groups.values() for source in sources}
        scored = {group: labelled_groups(llm, [c for s in sources for c in drawn[s]], options)
                  for group, sources in groups.items() if sources}
    text = io.StringIO()
    tasks, pooled = [], {}
    every: dict[str, list[tuple[float, bool]]] = {"none": [], "profile": []}
    for group, items in scored.items():
        print(f"## {group}: {', '.join(groups.get(group) or [])}", file=text)
        profiles, points = calibrate(args.model, items, options, seed=args.seed,
                                     objective=args.choose_by, out=text,
                                     flag_below_accuracy=args.flag_below_accuracy)
        tasks += [{"group": group, "fields": list(p.fields), **p.held_out} for p in profiles]
        for p in profiles:
            flags = p.held_out["low_confidence"]
            right = flags["accuracy_above"]
            kept = "-" if right is None else f"{100 * right:.1f}%"
            print(f"{'':30s} {','.join(p.fields)[:24]}: below {flags['threshold']:.2f} flagged "
                  f"{100 * flags['share']:.1f}%, unflagged right {kept}", file=text)
        pooled[group] = both(points)
        for key in every:
            every[key] += points[key]
        print(f"{'':30s} ECE floor at this size: {pooled[group]['profile']['ece_floor']:.3f}",
              file=text)
        if args.splits:
            print(spread(args.model, items, options, range(args.seed + 1,
                                                            args.seed + 1 + args.splits),
                         args.choose_by), file=text)
    if len(scored) > 1:
        print(f"## every task\n{report('pooled', every['none'], every['profile'], 'per schema')}"
              f"\n{'':30s} ECE floor at this size: {ece_floor(every['profile']):.3f}", file=text)
        pooled["every task"] = both(every)
    results = {"model": args.model, "dtype": args.dtype, "groups": groups,
               "limit": args.limit, "exclude": args.exclude, "seed": args.seed,
               "options": args.options, "choose_by": args.choose_by,
               "rows_from": str(args.rows or ""),
               "seconds": time.perf_counter() - start, **provenance(), "tasks": tasks,
               "pooled": pooled, "table": text.getvalue(),
               "rows": {group: [(schema, rows) for schema, rows in items]
                        for group, items in scored.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    publish(args.out, results, lambda path: plot(results, path), lambda r: r["table"])
    return results


if __name__ == "__main__":
    main()
