"""PCD's answers uncalibrated, by content-free calibration, by batch calibration and by a
fitted profile, against AR JSON, on the cases of `benchmarks.evaluate` runs.

    python -m benchmarks.calibration_methods RUN.json [RUN.json …] [--out RESULTS.json]

A run must hold `pcd_token` (the default) and `ar_json`, and may hold `pcd_token_cf` and,
for multi-field tasks, `pcd_token_joint` (each field conditioned on the ones before it). The two
calibrations that need no engine call are computed here from the scores the default returned,
with the product's own functions: batch calibration (`core.scoring.batch`: each task's
documents of one schema are one batch, as the offline API computes it; a task whose options
differ per case has no batch of 16 and stays uncalibrated, as the API answers it) and a fitted
profile (`core.profiles.fit_profile`: fitted on one seeded half of a task, judged on the
other). Pools follow `benchmarks.tasks`: BIG-Bench Hard tasks join the untouched pool only
where AR JSON's balanced accuracy is above chance with its 95% interval.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from benchmarks import public_data, tasks
from benchmarks.metrics import (Case, balanced_accuracy, confidences, exact_accuracy,
                                field_accuracy, gold_label, paired_bootstrap, percentile,
                                true_share)
from vllm_pcd.core.schema import option_index, parse_schema, value_at
from vllm_pcd.core.scoring import (FieldResult, Row, assemble, batch_prior, calibrate,
                                   expected_calibration_error)
from vllm_pcd.core.plan import Options
from vllm_pcd.core.profiles import MIN_CASES, fit_profile

DEFAULT, CONTENT_FREE, JOINT, BASELINE = "pcd_token", "pcd_token_cf", "pcd_token_joint", "ar_json"
METHODS = ["default", "content_free", "batch", "joint", "ar_json"]
FLAG_ACCURACY = 0.9  # the accuracy unflagged answers should reach (`low_confidence`)

Answers = dict[str, Any]   # case id → object (or a failure's status)
Scores = dict[str, dict[str, list[float]]]  # case id → field → option log-probabilities


def by_batch(cases: Sequence[dict[str, Any]], answers: Answers, scores: Scores
             ) -> tuple[Answers, Scores]:
    """Each schema's documents divided by their own mean option probabilities."""
    answers, scores = dict(answers), dict(scores)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for case in cases:
        if scores.get(case["id"]):
            groups[json.dumps(case["schema"], sort_keys=True)].append(case)
    for members in groups.values():
        spec = parse_schema(members[0]["schema"])
        documents = [tuple(FieldResult(f, tuple(scores[c["id"]][f.name])) for f in spec.fields)
                     for c in members]
        prior = batch_prior(documents)
        if prior is None:
            continue
        for case, document in zip(members, documents):
            calibrated = calibrate(document, prior.fields)
            answers[case["id"]] = assemble(spec, calibrated)
            scores[case["id"]] = {r.field.name: list(r.scores) for r in calibrated}
    return answers, scores


def profile_points(cases: Sequence[dict[str, Any]], scores: Scores, seed: int = 0
                   ) -> tuple[dict[str, list[tuple[float, bool]]], dict[str, Any]] | None:
    """Held-out (probability, right) points of no map and of a profile fitted on the other
    half, and the profile's held-out summary (its `low_confidence` threshold chosen on the
    fitting half for FLAG_ACCURACY), for a task of one schema (None where the task has
    several or too few cases)."""
    if len({json.dumps(c["schema"], sort_keys=True) for c in cases}) != 1:
        return None
    spec = parse_schema(cases[0]["schema"])
    rows: dict[str, list[Row]] = {f.name: [] for f in spec.fields}
    for case in cases:
        got = scores.get(case["id"])
        gold = [option_index(f, value_at(case["expected"], f)) for f in spec.fields]
        if not got or None in gold:
            continue
        for f, index in zip(spec.fields, gold):
            rows[f.name].append(Row(tuple(got[f.name]), index))
    if len(next(iter(rows.values()))) < MIN_CASES:
        return None
    profile, points = fit_profile("evaluated", cases[0]["schema"], Options(), rows, seed=seed,
                                  flag_below_accuracy=FLAG_ACCURACY)
    return points, profile.held_out


def scored(cases: Sequence[dict[str, Any]], answers: Answers) -> list[Case]:
    return [Case(c["schema"], c["expected"], answers.get(c["id"]) if isinstance(
        answers.get(c["id"]), dict) else None) for c in cases]


def above_chance(cases: Sequence[dict[str, Any]], answers: Answers, rounds: int = 1000
                 ) -> bool:
    """Whether a method's balanced accuracy beats 1/labels with its 95% interval."""
    first = next(iter(cases[0]["schema"]["properties"]))
    labels = {gold_label(c["schema"]["properties"][first], c["expected"][first])
              for c in cases}
    sample = scored(cases, answers)
    rng = random.Random(0)
    draws = [balanced_accuracy([rng.choice(sample) for _ in sample]) for _ in range(rounds)]
    return percentile(sorted(draws), 2.5) > 1 / len(labels)


def paired_balanced(tasks_a: Sequence[list[Case]], tasks_b: Sequence[list[Case]],
                    rounds: int = 1000) -> dict[str, float]:
    """Mean-over-tasks balanced accuracy of `a` minus `b`, cases resampled within tasks."""
    def mean(per_task: Sequence[tuple[list[Case], list[Case]]]) -> float:
        return sum(balanced_accuracy(a) - balanced_accuracy(b) for a, b in per_task) / len(
            per_task)

    pairs = list(zip(tasks_a, tasks_b))
    rng = random.Random(0)
    draws = []
    for _ in range(rounds):
        sample = []
        for a, b in pairs:
            picks = [rng.randrange(len(a)) for _ in a]
            sample.append(([a[i] for i in picks], [b[i] for i in picks]))
        draws.append(mean(sample))
    draws.sort()
    return {"difference": mean(pairs), "low": percentile(draws, 2.5),
            "high": percentile(draws, 97.5)}


def task_methods(task: dict[str, Any], cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method of one task: its answers and scores (derived ones computed here)."""
    answers, scores = task["answers"], task["scores"]
    out = {"default": (answers[DEFAULT], scores[DEFAULT]),
           "batch": by_batch(cases, answers[DEFAULT], scores[DEFAULT]),
           "ar_json": (answers[BASELINE], {})}
    for name, method in (("content_free", CONTENT_FREE), ("joint", JOINT)):
        if method in answers:
            out[name] = (answers[method], scores[method])
    return out


def by_field(cases: Sequence[dict[str, Any]], answers: Answers) -> dict[str, Any]:
    """Per field of a multi-field task: accuracy, and the answers' label shares against the
    gold's, to say which position or label a method loses on."""
    out: dict[str, Any] = {}
    for name in cases[0]["schema"]["properties"]:
        got = [answers.get(c["id"]) for c in cases]
        values = [g.get(name) if isinstance(g, dict) else None for g in got]
        gold = [c["expected"][name] for c in cases]
        labels = sorted({json.dumps(x) for x in gold})
        shares = {label: (sum(json.dumps(x) == label for x in values) / len(cases),
                          sum(json.dumps(x) == label for x in gold) / len(cases))
                  for label in labels}
        out[name] = {"accuracy": sum(a == b for a, b in zip(values, gold)) / len(cases),
                     "shares": shares}
    return out


def summary(cases: list[dict[str, Any]], methods: dict[str, Any]) -> dict[str, Any]:
    gold = scored(cases, {c["id"]: c["expected"] for c in cases})
    rows: dict[str, Any] = {"cases": len(cases), "gold_true_share": true_share(gold, gold=True)}
    base = scored(cases, methods["default"][0])
    ar = scored(cases, methods["ar_json"][0])
    multi = len(cases[0]["schema"]["properties"]) > 1
    for name, (answers, scores) in methods.items():
        got = scored(cases, answers)
        points = confidences(got, [scores.get(c["id"]) for c in cases]) if scores else []
        rows[name] = {"field": field_accuracy(got), "balanced": balanced_accuracy(got),
                      "exact": exact_accuracy(got),
                      **({"by_field": by_field(cases, answers),
                          "exact_vs_ar": paired_bootstrap(got, ar, exact=True)
                          if name != "ar_json" else None} if multi else {}),
                      "true_share": true_share(got),
                      "ece": expected_calibration_error(points) if points else None,
                      "vs_default": paired_bootstrap(got, base) if name != "default" else None,
                      "vs_ar": paired_bootstrap(got, ar) if name != "ar_json" else None}
    return rows


def pooled(entries: list[tuple[list[dict[str, Any]], dict[str, Any]]]) -> dict[str, Any]:
    """Cases of every task pooled for field accuracy and intervals; balanced accuracy as the
    mean over tasks, with its paired interval against the default and AR JSON."""
    cases = [c for task_cases, _ in entries for c in task_cases]
    names = [n for n in METHODS if all(n in m for _, m in entries)]
    merged = {n: ({k: v for _, m in entries for k, v in m[n][0].items()},
                  {k: v for _, m in entries for k, v in m[n][1].items()}) for n in names}
    out = summary(cases, merged)
    per_task = {n: [scored(c, m[n][0]) for c, m in entries] for n in names}
    for n in names:
        out[n]["balanced"] = sum(balanced_accuracy(t) for t in per_task[n]) / len(entries)
        out[n]["balanced_vs_default"] = paired_balanced(per_task[n], per_task["default"])
        out[n]["balanced_vs_ar"] = paired_balanced(per_task[n], per_task["ar_json"])
    out["tasks"] = len(entries)
    return out


def compare(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    per_task, groups = {}, defaultdict(list)
    profiles: dict[str, Any] = {}
    for run in runs:
        for source, task in run["tasks"].items():
            cases = public_data.load(source, run["limit"], balanced=run["sample"] == "balanced")
            methods = task_methods(task, cases)
            name = f"{source} ({run['sample']})"
            per_task[name] = summary(cases, methods)
            fitted = profile_points(cases, task["scores"][DEFAULT])
            if fitted:
                points, held_out = fitted
                profiles[name] = {k: {"ece": expected_calibration_error(v),
                                      "accuracy": sum(ok for _, ok in v) / len(v),
                                      "rows": len(v)} for k, v in points.items()}
                profiles[name]["low_confidence"] = held_out.get("low_confidence")
                profiles[name]["coverage"] = {k: coverage_curve(v) for k, v in points.items()}
            if run["sample"] != "balanced":
                continue
            if source in tasks.BBH and not above_chance(cases, task["answers"][BASELINE]):
                groups["bbh_at_chance"].append((cases, methods))
            elif source in tasks.UNTOUCHED_SINGLE:
                groups["untouched_single"].append((cases, methods))
            elif source in tasks.UNTOUCHED_MULTI:
                groups["untouched_multi"].append((cases, methods))
            else:
                groups["seen"].append((cases, methods))
    return {"tasks": per_task, "profiles": profiles,
            "pooled": {g: pooled(e) for g, e in groups.items()},
            "members": {g: [e[0][0]["id"].rsplit("-", 1)[0] for e in entries]
                        for g, entries in groups.items()}}


def coverage_curve(points: Sequence[tuple[float, bool]], steps: int = 20
                   ) -> list[tuple[float, float]]:
    """(share of answers kept, their accuracy) when only the most probable are kept."""
    ranked = sorted(points, key=lambda p: -p[0])
    out = []
    for k in range(1, steps + 1):
        kept = ranked[:max(1, round(len(ranked) * k / steps))]
        out.append((len(kept) / len(ranked), sum(ok for _, ok in kept) / len(kept)))
    return out


def plot_coverage(results: dict[str, Any], path: Path) -> None:
    """Accuracy against coverage on the held-out halves, one curve per task and map."""
    from benchmarks.harness import panel_row, save_figure

    fig, (ax,) = panel_row(1, panel_size=(6.5, 5))
    for name, p in results["profiles"].items():
        for key, style in (("none", "--"), ("profile", "-")):
            curve = p["coverage"][key]
            ax.plot([c for c, _ in curve], [a for _, a in curve], linestyle=style,
                    label=f"{name}, {'fitted' if key == 'profile' else 'raw'}")
    ax.axhline(FLAG_ACCURACY, color="grey", linestyle=":")
    ax.set(xlabel="share of answers kept (most probable first)",
           ylabel="accuracy of the kept answers", xlim=(0, 1), ylim=(0, 1.02),
           title="held-out halves: accuracy against coverage")
    ax.legend(fontsize=6, loc="lower left", ncol=2)
    save_figure(fig, path, dpi=110)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _delta(d: dict[str, float] | None) -> str:
    return "-" if not d else (f"{100 * d['difference']:+.1f} [{100 * d['low']:+.1f}, "
                              f"{100 * d['high']:+.1f}]")


def table(results: dict[str, Any]) -> str:
    head = ("| task | cases | method | field | exact | balanced | true (gold) | ECE | "
            "Δ vs default | Δ vs AR JSON |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    rows = [(name, r) for name, r in results["tasks"].items()] + \
        [(f"**pooled: {g}** ({r['tasks']} tasks)", r) for g, r in results["pooled"].items()]
    for name, r in rows:
        for m in METHODS:
            if m not in r:
                continue
            x = r[m]
            true = f"{_pct(x['true_share'])} ({_pct(r['gold_true_share'])})" \
                if x["true_share"] is not None else "-"
            lines.append(f"| {name} | {r['cases']} | {m} | {_pct(x['field'])} | "
                         f"{_pct(x.get('exact'))} | {_pct(x['balanced'])} | {true} | "
                         f"{'-' if x['ece'] is None else format(x['ece'], '.3f')} | "
                         f"{_delta(x['vs_default'])} | {_delta(x['vs_ar'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibration_methods",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="benchmarks.evaluate results")
    parser.add_argument("--out", type=Path, help="write the comparison as JSON (the form "
                        "benchmarks.figures renders) and its coverage curve beside it")
    parser.add_argument("--machine", default="", help="what measured the runs: model, dtype, "
                        "CPU, vLLM (said under the table)")
    args = parser.parse_args(argv)
    results = compare([json.loads(p.read_text()) for p in args.runs])
    print(table(results))
    for name, p in results["profiles"].items():
        flagged = p["low_confidence"] or {}
        print(f"profile, held-out half of {name}: ECE {p['none']['ece']:.3f} → "
              f"{p['profile']['ece']:.3f}, accuracy {_pct(p['none']['accuracy'])} → "
              f"{_pct(p['profile']['accuracy'])} ({p['none']['rows']} rows); flagged below "
              f"{flagged.get('threshold', float('nan')):.2f}: {_pct(flagged.get('share'))}%, "
              f"unflagged right {_pct(flagged.get('accuracy_above'))}%")
    for name, r in results["tasks"].items():
        for m in METHODS:
            for field, f in (r.get(m) or {}).get("by_field", {}).items():
                shares = ", ".join(f"{v} {100 * a:.0f}% (gold {100 * g:.0f}%)"
                                   for v, (a, g) in f["shares"].items())
                print(f"{name} {m} {field}: {_pct(f['accuracy'])}; {shares}")
            if (r.get(m) or {}).get("exact_vs_ar"):
                print(f"{name} {m} exact objects {_pct(r[m]['exact'])}, − AR "
                      f"{_delta(r[m]['exact_vs_ar'])}")
    for group, r in results["pooled"].items():
        for m in METHODS:
            if m in r and m != "default":
                print(f"{group}: {m} balanced − default {_delta(r[m]['balanced_vs_default'])},"
                      f" − AR {_delta(r[m]['balanced_vs_ar'])}")
    if args.out:
        args.out.write_text(json.dumps({"machine": args.machine, "rows": results}, indent=1))
        plot_coverage(results, args.out.with_suffix(".coverage.png"))
    return results


if __name__ == "__main__":
    main()
