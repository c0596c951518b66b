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
    for key, label in (("uncalibrated", "uncalibrated"), ("profile", "fitted profile")):
        side = results["pooled"][key]
        bins = side["reliability"]
        ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], marker="o",
                label=f"{label} (ECE {side['ece']:.3f})")
    ax.set(xlabel="probability of the returned value", ylabel="share correct", xlim=(0, 1),
           ylim=(0, 1), title=f"{Path(results['model']).name}, {results['dtype']}: held-out "
           f"{results['pooled']['profile']['rows']} fields")
    ax.legend(fontsize=8, loc="upper left")
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from vllm_pcd.calibrate import calibrate
    from vllm_pcd.models import default_model_path, fast_dtype

    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibration",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--data", nargs="+", default=DEFAULT_DATA)
    parser.add_argument("--limit", type=int, default=120, help="cases per task")
    parser.add_argument("--dtype", default=fast_dtype())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--options", default="{}", help="PCD options, as JSON keywords")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "calibration")
    args = parser.parse_args(argv)
    import json

    options = Options.of(json.loads(args.options))
    cases = [c for source in args.data for c in public_data.load(source, args.limit)]
    os.environ.setdefault("VLLM_PLUGINS", "pcd")
    from vllm import LLM

    llm = LLM(args.model, dtype=args.dtype, max_model_len=4096, enable_prefix_caching=True,
              seed=0)
    start = time.perf_counter()
    text = io.StringIO()
    profiles, pooled = calibrate(llm, args.model, cases, options, seed=args.seed, out=text)
    results = {"model": args.model, "dtype": args.dtype, "data": args.data,
               "limit": args.limit, "seed": args.seed, "options": args.options,
               "seconds": time.perf_counter() - start, **provenance(),
               "tasks": [{"fields": [f for f in p.fields], **p.held_out} for p in profiles],
               "pooled": {"uncalibrated": summary(pooled["none"]),
                          "profile": summary(pooled["profile"])},
               "table": text.getvalue()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    publish(args.out, results, lambda path: plot(results, path), lambda r: r["table"])
    return results


if __name__ == "__main__":
    main()
