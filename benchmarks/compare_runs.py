"""Two `benchmarks.evaluate` runs over the same sources and limit, compared case by case.

    python -m benchmarks.compare_runs A.json METHOD_A B.json METHOD_B

`evaluate` pairs methods within one run; this pairs them across runs (another layout,
another commit, another checkpoint of the same model): per task and pooled over the public
tasks, method A minus method B in field and exact-object accuracy, with 95% paired bootstrap
intervals. The cases are drawn again from `public_data` with the runs' own limit (the same
seed, so the same cases). Where both runs returned option scores (PCD methods), it also says
how far B's scores follow A's: the share of fields whose most probable value agrees, and the
difference in each option's probability (median and largest), as `quantized_quality` reports
for the head.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from benchmarks.evaluate import TUNED
from benchmarks.metrics import Case, median, paired_bootstrap
from benchmarks.public_data import load


def _interval(a: list[Case], b: list[Case], exact: bool) -> str:
    got = paired_bootstrap(a, b, exact=exact)
    return (f"{100 * got['difference']:+.1f} [{100 * got['low']:+.1f}, "
            f"{100 * got['high']:+.1f}]")


def compare(run_a: dict, method_a: str, run_b: dict, method_b: str) -> list[str]:
    drawn = ("limit", "sample", "exclude")
    if [run_a.get(k) or None for k in drawn] != [run_b.get(k) or None for k in drawn]:
        raise SystemExit("the runs drew different cases (--limit, --sample or --exclude)")
    balanced = run_a.get("sample") == "balanced"
    lines, pooled_a, pooled_b = [], [], []
    for task in run_a["tasks"]:
        if task not in run_b["tasks"]:
            continue
        cases = load(task, run_a["limit"], balanced=balanced, exclude=run_a.get("exclude") or ())
        answers_a = run_a["tasks"][task]["answers"][method_a]
        answers_b = run_b["tasks"][task]["answers"][method_b]
        a = [Case(c["schema"], c["expected"], answers_a.get(c["id"])) for c in cases]
        b = [Case(c["schema"], c["expected"], answers_b.get(c["id"])) for c in cases]
        lines.append(f"{task}: field {_interval(a, b, False)}  exact {_interval(a, b, True)}")
        if task not in TUNED:
            pooled_a, pooled_b = pooled_a + a, pooled_b + b
    if pooled_a:
        lines.append(f"pooled public: field {_interval(pooled_a, pooled_b, False)}  "
                     f"exact {_interval(pooled_a, pooled_b, True)}")
    return lines


def agreement(run_a: dict, method_a: str, run_b: dict, method_b: str) -> list[str]:
    """Per task: fields whose most probable value agrees, and each option's probability
    apart, from the scores both runs returned for the same cases."""
    lines = []
    for task in run_a["tasks"]:
        if task not in run_b["tasks"]:
            continue
        scores_a = run_a["tasks"][task].get("scores", {}).get(method_a) or {}
        scores_b = run_b["tasks"][task].get("scores", {}).get(method_b) or {}
        same, apart = [], []
        for case, fields_a in scores_a.items():
            fields_b = scores_b.get(case)
            if not fields_a or not fields_b:
                continue
            for name, logprobs in fields_a.items():
                if name not in fields_b:
                    continue
                pa = [math.exp(v) for v in logprobs]
                pb = [math.exp(v) for v in fields_b[name]]
                same.append(max(range(len(pa)), key=pa.__getitem__)
                            == max(range(len(pb)), key=pb.__getitem__))
                apart += [abs(x - y) for x, y in zip(pa, pb)]
        if same:
            lines.append(f"{task}: {sum(same)}/{len(same)} fields agree "
                         f"({100 * sum(same) / len(same):.1f}%), option probability apart "
                         f"median {median(apart):.4f}, largest {max(apart):.4f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    path_a, method_a, path_b, method_b = argv if argv is not None else sys.argv[1:]
    runs = [json.loads(Path(p).read_text()) for p in (path_a, path_b)]
    print(f"{method_a} ({path_a}) minus {method_b} ({path_b}), points")
    print("\n".join(compare(runs[0], method_a, runs[1], method_b)))
    print("\n".join(agreement(runs[0], method_a, runs[1], method_b)))


if __name__ == "__main__":
    main()
