"""Answer quality of PCD token, PCD sequence and AR JSON on labelled cases, one server.

    python -m benchmarks.evaluate [--data ../shared/eval/dev.jsonl] [--limit N] [--url URL]

A case is one JSON line: id, message, schema, expected (tags are ignored). Every method gets
the same conversation (the message as one user turn) and the same fields; a method that
fails on a case answers nothing there, which counts against its accuracies.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.methods import (METHODS, Client, Outcome, load_tokenizer, make_task, provenance,
                                run_method, run_on_server)
from benchmarks.metrics import (Case, exact_accuracy, field_accuracy, first_option_share, median,
                                p90, true_share, valid_rate)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "eval" / "dev.jsonl"
DEFAULT_METHODS = ["pcd_token", "pcd_sequence", "pcd_token_codes", "ar_json"]


def load_cases(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    cases = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return cases[:limit] if limit else cases


def method_report(cases: list[dict[str, Any]], outcomes: list[Outcome]) -> dict[str, Any]:
    failed = [o.status for o in outcomes if not o.ok]
    if failed and all(s.startswith("unsupported") for s in failed) and len(failed) == len(outcomes):
        return {"status": failed[0]}
    scored = [Case(c["schema"], c["expected"], o.object if o.ok else None)
              for c, o in zip(cases, outcomes)]
    good = [o for o in outcomes if o.ok]

    def middle(values: list[Any]) -> float | None:
        return None if not values or None in values else median(values)

    return {
        "status": "ok" if not failed else f"{len(failed)} failed, e.g. {failed[0]}",
        "cases": len(outcomes),
        "field_accuracy": field_accuracy(scored),
        "boolean_accuracy": field_accuracy(scored, "boolean"),
        "enum_accuracy": field_accuracy(scored, "enum"),
        "exact_accuracy": exact_accuracy(scored),
        "schema_valid_rate": valid_rate(scored),
        "true_share": true_share(scored),
        "first_option_share": first_option_share(scored),
        "median_s": median([o.latency_s for o in good]),
        "p90_s": p90([o.latency_s for o in good]),
        "tokens_computed": middle([o.tokens_computed for o in good]),
        "backbone_calls": middle([o.backbone_calls for o in good]),
    }


def disagreements(cases: list[dict[str, Any]], runs: dict[str, list[Outcome]]
                  ) -> list[dict[str, Any]]:
    """Every (case, field) where the methods that answered did not all answer the same."""
    rows = []
    for i, case in enumerate(cases):
        answered = {m: o[i].object for m, o in runs.items() if o[i].ok and o[i].object}
        for name in case["schema"]["properties"]:
            values = {m: obj.get(name) for m, obj in answered.items()}
            if len({json.dumps(v) for v in values.values()}) > 1:
                rows.append({"id": case["id"], "field": name, "expected": case["expected"][name],
                             "values": values})
    return rows


async def run(args: argparse.Namespace, url: str, serving: str) -> dict[str, Any]:
    code = provenance()
    tokenizer = load_tokenizer(args.model)
    cases = load_cases(args.data, args.limit)
    client = await Client(url).connect()
    runs: dict[str, list[Outcome]] = {m: [] for m in args.methods}
    try:
        for case in tqdm(cases, desc="evaluate", unit="case", file=sys.stderr):
            task = make_task(tokenizer, case["schema"],
                             [{"role": "user", "content": case["message"]}])
            for name in args.methods:
                earlier = runs[name][:1]
                if earlier and earlier[0].status.startswith("unsupported"):
                    runs[name].append(earlier[0])  # the server will not change its mind
                else:
                    runs[name].append(await run_method(name, client, task))
    finally:
        await client.close()
    gold = [Case(c["schema"], c["expected"], c["expected"]) for c in cases]
    return {
        "serving": serving,
        "model": str(args.model),
        "data": str(args.data),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "code": code,
        "cases": len(cases),
        "gold": {"true_share": true_share(gold, gold=True),
                 "first_option_share": first_option_share(gold, gold=True)},
        "methods": {m: method_report(cases, o) for m, o in runs.items()},
        "disagreements": disagreements(cases, runs),
        "answers": {m: {c["id"]: (o.object if o.ok else o.status) for c, o in zip(cases, out)}
                    for m, out in runs.items()},
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, fmt: str = "g") -> str:
    return "-" if value is None else format(value, fmt)


COLUMNS = [("field", "field_accuracy"), ("bool", "boolean_accuracy"), ("enum", "enum_accuracy"),
           ("exact", "exact_accuracy"), ("valid", "schema_valid_rate"), ("true", "true_share"),
           ("first", "first_option_share")]


def table(results: dict[str, Any]) -> str:
    head = f"{'method':<13}" + "".join(f"{c:>8}" for c, _ in COLUMNS) + \
        f"{'med_s':>8}{'p90_s':>8}{'tokens':>8}{'calls':>6}"
    lines = [f"{results['cases']} cases, {results['model']}", head]
    for name, rep in results["methods"].items():
        if "field_accuracy" not in rep:
            lines.append(f"{name:<13}{rep['status']}")
            continue
        lines.append(f"{name:<13}" + "".join(f"{_pct(rep[k]):>8}" for _, k in COLUMNS)
                     + f"{_num(rep['median_s'], '.3f'):>8}{_num(rep['p90_s'], '.3f'):>8}"
                     + f"{_num(rep['tokens_computed']):>8}{_num(rep['backbone_calls']):>6}")
    gold = results["gold"]
    lines.append(f"{'gold':<13}" + " " * 40 + f"{_pct(gold['true_share']):>8}"
                 f"{_pct(gold['first_option_share']):>8}")
    lines += [f"{name}: {rep['status']}" for name, rep in results["methods"].items()
              if rep["status"] != "ok" and "field_accuracy" in rep]
    rows = results["disagreements"]
    lines.append(f"\n{len(rows)} disagreements (case, field, gold: values per method)")
    for row in rows:
        values = ", ".join(f"{m}={json.dumps(v)}" for m, v in row["values"].items())
        lines.append(f"  {row['id']} {row['field']} gold={json.dumps(row['expected'])}: {values}")
    lines.append(results["serving"])
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from vllm_pcd.models import default_model_path

    parser = argparse.ArgumentParser(prog="python -m benchmarks.evaluate",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", default=str(default_model_path()),
                        help="any local model folder (served, and its tokenizer builds plans)")
    parser.add_argument("--url", help="attach to a running server (pcd plugin + xgrammar)")
    parser.add_argument("--limit", type=int, help="only the first N cases")
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=list(METHODS))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results"
                        / "eval.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results = run_on_server(args, run)
    args.out.write_text(json.dumps(results, indent=2))
    print(table(results))
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
