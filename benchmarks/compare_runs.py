"""Two `benchmarks.evaluate` runs over the same sources and limit, compared case by case.

    python -m benchmarks.compare_runs A.json METHOD_A B.json METHOD_B

`evaluate` pairs methods within one run; this pairs them across runs (another layout,
another commit): per task and pooled over the public tasks, method A minus method B in field
and exact-object accuracy, with 95% paired bootstrap intervals. The cases are drawn again
from `public_data` with the runs' own limit (the same seed, so the same cases).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.evaluate import TUNED
from benchmarks.metrics import Case, paired_bootstrap
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


def main(argv: list[str] | None = None) -> None:
    path_a, method_a, path_b, method_b = argv if argv is not None else sys.argv[1:]
    runs = [json.loads(Path(p).read_text()) for p in (path_a, path_b)]
    print(f"{method_a} ({path_a}) minus {method_b} ({path_b}), points")
    print("\n".join(compare(runs[0], method_a, runs[1], method_b)))


if __name__ == "__main__":
    main()
