"""Fitted calibration on public tasks, measured on the half of each task no fit saw.

    python -m benchmarks.calibration [--model PATH] [--data SRC …] [--limit N] [--out PATH]

Each task (`benchmarks.public_data` source, one schema per task) gets a profile from
`vllm_pcd.calibrate`: fitted on one seeded half of its cases, the method chosen by
cross-validation inside that half, then measured on the other half. The table gives, per task
and pooled, the held-out ECE and accuracy without and with the profile and their paired
difference; the PNG is the pooled held-out reliability diagram, before and after.
"""

from __future__ import annotations

import argparse
import io
import os
import time
from pathlib import Path
from typing import Any

from benchmarks import public_data
from benchmarks.harness import provenance, publish, save_figure
from vllm_pcd.core.fitting import expected_calibration_error, reliability
from vllm_pcd.core.options import Options

DEFAULT_DATA = ["bigbench:presuppositions_as_nli", "bigbench:epistemic_reasoning",
                "bigbench:fact_checker/fever", "rotten_tomatoes", "bbc"]
# Tasks nothing here was tuned on, chosen before their results were seen: pooled apart.
UNTOUCHED = ["bigbench:sports_understanding", "bigbench:navigate"]


def summary(points: list[tuple[float, bool]]) -> dict[str, Any]:
    return {"rows": len(points), "ece": expected_calibration_error(points),
            "accuracy": sum(ok for _, ok in points) / len(points),
            "reliability": reliability(points)}


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect calibration")
    for group, pooled in results["pooled"].items():
        for key, label in (("uncalibrated", "uncalibrated"), ("profile", "fitted")):
            bins = pooled[key]["reliability"]
            ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins],
                    marker="o", linestyle="-" if key == "profile" else "--",
                    label=f"{group}, {label} (ECE {pooled[key]['ece']:.3f})")
    ax.set(xlabel="probability of the returned value", ylabel="share correct", xlim=(0, 1),
           ylim=(0, 1), title=f"{Path(results['model']).name}, {results['dtype']}: held-out halves")
    ax.legend(fontsize=8, loc="upper left")
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from vllm_pcd.calibrate import calibrate
    from vllm_pcd.models import default_model_path, fast_dtype

    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibration",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--data", nargs="+", default=DEFAULT_DATA)
    parser.add_argument("--untouched", nargs="*", default=UNTOUCHED,
                        help="tasks pooled apart from --data")
    parser.add_argument("--limit", type=int, default=120, help="cases per task")
    parser.add_argument("--dtype", default=fast_dtype())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--options", default="{}", help="PCD options, as JSON keywords")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "calibration")
    args = parser.parse_args(argv)
    import json

    options = Options.of(json.loads(args.options))
    groups = {"tuned": args.data, "untouched": args.untouched}
    os.environ.setdefault("VLLM_PLUGINS", "pcd")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM

    llm = LLM(args.model, dtype=args.dtype, max_model_len=4096, enable_prefix_caching=True,
              seed=0)
    start = time.perf_counter()
    text = io.StringIO()
    tasks, pooled = [], {}
    for group, sources in groups.items():
        if not sources:
            continue
        print(f"## {group}: {', '.join(sources)}", file=text)
        cases = [c for source in sources for c in public_data.load(source, args.limit)]
        profiles, points = calibrate(llm, args.model, cases, options, seed=args.seed, out=text)
        tasks += [{"group": group, "fields": list(p.fields), **p.held_out} for p in profiles]
        pooled[group] = {"uncalibrated": summary(points["none"]),
                         "profile": summary(points["profile"])}
    results = {"model": args.model, "dtype": args.dtype, "groups": groups,
               "limit": args.limit, "seed": args.seed, "options": args.options,
               "seconds": time.perf_counter() - start, **provenance(), "tasks": tasks,
               "pooled": pooled, "table": text.getvalue()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    publish(args.out, results, lambda path: plot(results, path), lambda r: r["table"])
    return results


if __name__ == "__main__":
    main()
