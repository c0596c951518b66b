"""Answer quality of PCD and AR JSON on labelled cases, every method on one server.

    python -m benchmarks.evaluate [--data dev sick sms_spam bbh:navigate rotten_tomatoes …]
                                  [--limit N] [--model PATH] [--url URL]

Each `--data` source (see `benchmarks.public_data`) is one task: fetched at run time, sampled
with a fixed seed, reported on its own and pooled with the others. Every method gets the
same conversation (the message as one user turn) and the same fields; a method that fails on
a case answers nothing there, which counts against its accuracies. The pooled row leaves out
`dev`, the set the formulations were tuned on. Differences against AR
JSON come with a 95% paired bootstrap interval; PCD's returned probabilities get an expected
calibration error and a reliability diagram (PNG). `pcd_token_cf` is PCD token mode with
content-free calibration (`pcd_calibration: "content_free"`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks import public_data
from benchmarks.harness import add_server_flags, provenance, run_on_server, save_reliability
from benchmarks.client import Client, Outcome, load_tokenizer, make_task
from benchmarks.methods import METHODS, run_method
from benchmarks.metrics import (Case, balanced_accuracy, confidences, exact_accuracy,
                                field_accuracy, first_option_share, label_accuracy, median, p90,
                                paired_bootstrap, true_share, valid_rate)
from vllm_pcd.core.scoring import expected_calibration_error, reliability
from vllm_pcd.core.plan import DEFAULT_LAYOUT, LAYOUT_NAMES

DEFAULT_DATA = public_data.DEV
DEFAULT_METHODS = ["pcd_token", "pcd_token_json", "pcd_token_json_next", "pcd_token_cf",
                   "pcd_sequence", "ar_json"]
BASELINE = "ar_json"
# Sources the formulation was tuned on: reported, but pooled only when nothing else is given.
TUNED = {"dev"}


def load_cases(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The first `limit` cases of a JSON-lines file."""
    return public_data.jsonl(path)[:limit] if limit else public_data.jsonl(path)


def scored(cases: list[dict[str, Any]], outcomes: list[Outcome]) -> list[Case]:
    return [Case(c["schema"], c["expected"], o.object if o.ok else None)
            for c, o in zip(cases, outcomes)]


def method_report(cases: list[dict[str, Any]], outcomes: list[Outcome]) -> dict[str, Any]:
    failed = [o.status for o in outcomes if not o.ok]
    if failed and all(s.startswith("unsupported") for s in failed) and len(failed) == len(outcomes):
        return {"status": failed[0]}
    answers = scored(cases, outcomes)
    good = [o for o in outcomes if o.ok]
    points = confidences(answers, [o.extra.get("scores") for o in outcomes])

    def middle(values: list[Any]) -> float | None:
        return None if not values or None in values else median(values)

    return {
        "status": "ok" if not failed else f"{len(failed)} failed, e.g. {failed[0]}",
        "cases": len(outcomes),
        "field_accuracy": field_accuracy(answers),
        "boolean_accuracy": field_accuracy(answers, "boolean"),
        "enum_accuracy": field_accuracy(answers, "enum"),
        "exact_accuracy": exact_accuracy(answers),
        "label_accuracy": label_accuracy(answers),
        "balanced_accuracy": balanced_accuracy(answers),
        "schema_valid_rate": valid_rate(answers),
        "true_share": true_share(answers),
        "first_option_share": first_option_share(answers),
        "ece": expected_calibration_error(points),
        "reliability": reliability(points),
        "median_s": median([o.latency_s for o in good]),
        "p90_s": p90([o.latency_s for o in good]),
        "tokens_computed": middle([o.tokens_computed for o in good]),
        "backbone_calls": middle([o.backbone_calls for o in good]),
    }


def against_baseline(cases: list[dict[str, Any]], runs: dict[str, list[Outcome]]
                     ) -> dict[str, Any]:
    """Every method minus AR JSON on the same cases: field and exact accuracy, paired."""
    if BASELINE not in runs:
        return {}
    base = scored(cases, runs[BASELINE])
    return {m: {"field": paired_bootstrap(scored(cases, o), base),
                "exact": paired_bootstrap(scored(cases, o), base, exact=True)}
            for m, o in runs.items() if m != BASELINE and any(x.ok for x in o)}


def task_report(cases: list[dict[str, Any]], runs: dict[str, list[Outcome]]) -> dict[str, Any]:
    gold = [Case(c["schema"], c["expected"], c["expected"]) for c in cases]
    return {"cases": len(cases),
            "gold": {"true_share": true_share(gold, gold=True),
                     "first_option_share": first_option_share(gold, gold=True)},
            "methods": {m: method_report(cases, o) for m, o in runs.items()},
            "against_" + BASELINE: against_baseline(cases, runs)}


async def evaluate_task(client: Client, tokenizer: Any, source: str, cases: list[dict[str, Any]],
                        methods: list[str], concurrency: int = 1,
                        layout: str = DEFAULT_LAYOUT) -> dict[str, list[Outcome]]:
    """Each case's methods run one after another; up to `concurrency` cases at once (latencies
    are then measured under that load)."""
    gate = asyncio.Semaphore(concurrency)
    progress = tqdm(total=len(cases), desc=source, unit="case", file=sys.stderr)

    async def one(case: dict[str, Any]) -> dict[str, Outcome]:
        async with gate:
            task = make_task(tokenizer, case["schema"],
                             [{"role": "user", "content": case["message"]}], layout)
            out = {name: await run_method(name, client, task) for name in methods}
            progress.update()
            return out

    try:
        answered = await asyncio.gather(*(one(case) for case in cases))
    finally:
        progress.close()
    return {name: [out[name] for out in answered] for name in methods}


async def run(args: argparse.Namespace, url: str, serving: str) -> dict[str, Any]:
    code = provenance()
    tokenizer = load_tokenizer(args.model)
    client = await Client(url).connect()
    tasks, pooled_cases, pooled = {}, [], {}
    try:
        for source in args.data:
            cases = public_data.load(source, args.limit, balanced=args.sample == "balanced",
                                     exclude=args.exclude)
            runs = await evaluate_task(client, tokenizer, source, cases, args.methods,
                                       args.concurrency, args.layout)
            tasks[source] = {**task_report(cases, runs),
                             "answers": {m: {c["id"]: o.object if o.ok else o.status
                                             for c, o in zip(cases, out)}
                                         for m, out in runs.items()},
                             "scores": {m: {c["id"]: o.extra.get("scores")
                                            for c, o in zip(cases, out) if o.ok}
                                        for m, out in runs.items()}}
            args.out.with_suffix(".partial.json").write_text(json.dumps(tasks))
            if source not in TUNED or set(args.data) <= TUNED:
                pooled_cases += cases
                for m, out in runs.items():
                    pooled.setdefault(m, []).extend(out)
    finally:
        await client.close()
    return {"serving": serving, "model": str(args.model), "data": args.data, "limit": args.limit,
            "sample": args.sample, "exclude": args.exclude,
            "concurrency": args.concurrency, "layout": args.layout,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "code": code, "tasks": tasks,
            "overall": task_report(pooled_cases, pooled)}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _num(value: float | None, fmt: str = "g") -> str:
    return "-" if value is None else format(value, fmt)


def _interval(row: dict[str, float] | None) -> str:
    if row is None:
        return "-"
    return (f"{100 * row['difference']:+.1f} [{100 * row['low']:+.1f}, "
            f"{100 * row['high']:+.1f}]")


COLUMNS = ["method", "field", "bal", "bool", "enum", "labels", "exact", "Δfield vs AR [95%]",
           "Δexact vs AR [95%]", "true", "first", "ECE", "med s", "tokens", "calls"]


def task_rows(name: str, report: dict[str, Any]) -> list[str]:
    """Markdown rows of one task (accuracies and shares in %, gold shares on their own row)."""
    deltas = report["against_" + BASELINE]
    rows = []
    for method, rep in report["methods"].items():
        if "field_accuracy" not in rep:
            rows.append(f"| {name} | {report['cases']} | {method} | {rep['status']} |")
            continue
        delta = deltas.get(method, {})
        cells = [method, _pct(rep["field_accuracy"]), _pct(rep["balanced_accuracy"]),
                 _pct(rep["boolean_accuracy"]),
                 _pct(rep["enum_accuracy"]), _pct(rep.get("label_accuracy")),
                 _pct(rep["exact_accuracy"]),
                 _interval(delta.get("field")), _interval(delta.get("exact")),
                 _pct(rep["true_share"]), _pct(rep["first_option_share"]),
                 _num(rep["ece"], ".3f"), _num(rep["median_s"], ".3f"),
                 _num(rep["tokens_computed"]), _num(rep["backbone_calls"])]
        rows.append(f"| {name} | {report['cases']} | " + " | ".join(cells) + " |")
    gold = report["gold"]
    rows.append(f"| {name} | {report['cases']} | gold | | | | | | | | | "
                f"{_pct(gold['true_share'])} | {_pct(gold['first_option_share'])} | | | | |")
    return rows


def table(results: dict[str, Any]) -> str:
    lines = [f"{results['model']}; {results['serving']}; layout {results['layout']}", "",
             "| task | cases | " + " | ".join(COLUMNS) + " |",
             "|" + "---|" * (len(COLUMNS) + 2)]
    for name, report in results["tasks"].items():
        lines += task_rows(name, report)
    lines += task_rows("**pooled**", results["overall"])
    return "\n".join(lines)


def plot_reliability(results: dict[str, Any], path: Path) -> None:
    """Accuracy against returned probability, per PCD method, all tasks pooled."""
    curves = [(rep["reliability"], f"{method} (ECE {rep['ece']:.3f})", "-")
              for method, rep in results["overall"]["methods"].items() if rep.get("reliability")]
    save_reliability(curves, f"{Path(results['model']).name}: {results['overall']['cases']} cases",
                     path, legend_size=7)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from vllm_pcd.models import default_model_path

    parser = argparse.ArgumentParser(prog="python -m benchmarks.evaluate",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--data", nargs="+", default=["dev"],
                        help="sources: dev, sick, sick_multi, sms_spam, bbh:<task>, "
                             "rotten_tomatoes, bbc, rotten_tomatoes_multi, bbc_multi, or a "
                             ".jsonl path (groups: python -m benchmarks.tasks)")
    parser.add_argument("--model", default=str(default_model_path()),
                        help="any local model folder (served, and its tokenizer builds plans)")
    parser.add_argument("--url", help="attach to a running server (pcd plugin + xgrammar)")
    add_server_flags(parser)
    parser.add_argument("--limit", type=int, help="N cases per source, drawn with a fixed seed")
    parser.add_argument("--sample", choices=["natural", "balanced"], default="natural",
                        help="balanced: as many cases of each gold answer (of the first "
                             "field) as the rarest has, up to --limit")
    parser.add_argument("--exclude", type=int, nargs="*", default=[], metavar="N",
                        help="leave out every case that --limit N drew (fresh cases beside "
                             "earlier runs)")
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=list(METHODS))
    parser.add_argument("--layout", choices=LAYOUT_NAMES, default=DEFAULT_LAYOUT,
                        help="where every method is given the field list")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="cases in flight at once (accuracy is the same; latency is not)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results"
                        / "eval.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results = run_on_server(args, run)
    args.out.write_text(json.dumps(results, indent=2))
    plot_reliability(results, args.out.with_suffix(".reliability.png"))
    print(table(results))
    print(f"wrote {args.out} and {args.out.with_suffix('.reliability.png')}")
    return results


if __name__ == "__main__":
    main()
