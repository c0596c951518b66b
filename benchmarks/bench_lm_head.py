"""End-to-end PCD latency with the restricted LM head on and off, in one run.

    python -m benchmarks.bench_lm_head [--fields 8 32] [--context 300] [--reps 5] [--bound]

One offline bf16 `vllm.LLM` with its engine in this process, so `PCD_RESTRICTED_HEAD` can be
switched between calls: each cell warms both modes once (unmeasured), then alternates off/on
calls, so load on a shared machine hits both alike; medians are shown. Every call runs under
a fresh cache salt, so none reuses another's KV blocks. "logits" is the time the engine spent
computing logits during the call (the part the head changes: wrapped here, in-process);
"branches" the step that runs every branch; "total" adds planning and the shared prefill.
The codes formulation restricts every field; the default json one only the fields whose
values part at their first token. The projection alone is timed by benchmarks.bench_projection.

The engine runs one unbound OpenMP thread unless --bound keeps vLLM's binding (a thread per
core): on a shared CPU every parallel op then waits for a bound thread that another job
descheduled (~5 ms each, measured on 2 loaded cores), which drowns the head's compute.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from benchmarks.workloads import synthetic_schema, synthetic_ticket
from benchmarks.client import load_tokenizer
from vllm_pcd.models import default_model_path


def logits_timer() -> list[float]:
    """Seconds of every logits computation from now on, appended as they happen."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    spent: list[float] = []
    forward = LogitsProcessor.forward

    def timed_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = forward(self, *args, **kwargs)
        spent.append(time.perf_counter() - start)
        return out

    LogitsProcessor.forward = timed_forward
    return spent


def timed(llm: Any, text: str, schema: dict[str, Any], formulation: str, on: bool,
          salt: str, spent: list[float]) -> tuple[tuple[float, float, float], Any]:
    """(total, branch step, logits) seconds of one PCD call, and its result."""
    from vllm_pcd import constrained
    from vllm_pcd.internals import lm_head

    os.environ[lm_head.ENV] = "1" if on else "0"
    spent.clear()
    start = time.perf_counter()
    result = constrained(llm, text, schema, formulation=formulation, cache_salt=salt)
    return (time.perf_counter() - start, result.execution.branches_s, sum(spent)), result


def cell(llm: Any, text: str, fields: int, formulation: str, reps: int,
         spent: list[float]) -> str:
    """One table line: medians off and on and their ratios, and what the head restricted."""
    from vllm_pcd.internals import lm_head

    schema = synthetic_schema(fields)
    tag = f"bench-lm-head-{fields}-{formulation}-{time.time_ns()}"
    times: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    results = {}
    for on in (False, True):
        timed(llm, text, schema, formulation, on, f"{tag}-warm-{on}", spent)
    before = lm_head.STATS.rows
    for rep in range(reps):
        for on in (False, True):
            measured, results[on] = timed(llm, text, schema, formulation, on,
                                          f"{tag}-{rep}-{on}", spent)
            times[on].append(measured)
    restricted = (lm_head.STATS.rows - before) // reps
    line = (f"{fields:>6} {formulation:>7} "
            f"{restricted:>3}/{len(results[True].plan.scorings()):<3}")
    for i in range(3):
        off, on = (statistics.median(t[i] for t in times[m]) * 1e3 for m in (False, True))
        line += f" | {off:>8.1f} {on:>8.1f} {off / on:>6.2f}x"
    return f"{line} | {results[False].object == results[True].object}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_lm_head",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--fields", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--formulations", nargs="+", default=["codes", "json"])
    parser.add_argument("--context", type=int, default=300,
                        help="conversation length in tokens (the field list comes on top)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--bound", action="store_true",
                        help="keep vLLM's OpenMP threads, one bound per core")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the switch must reach the worker
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_PLUGINS", "pcd")  # the engine patches are what it measures
    if not args.bound:
        os.environ.update(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
    from vllm import LLM

    from vllm_pcd.internals import lm_head

    text = synthetic_ticket(load_tokenizer(args.model), args.context)
    llm = LLM(args.model, dtype="bfloat16", enable_prefix_caching=True, max_model_len=4096,
              seed=0)
    spent = logits_timer()
    head = (f"{'fields':>6} {'form.':>7} {'rows':>7} | {'total ms: off':>13} {'on':>8} "
            f"{'ratio':>7} | {'branches: off':>13} {'on':>8} {'ratio':>7} | "
            f"{'logits: off':>13} {'on':>8} {'ratio':>7} | same object")
    threads = "vLLM's bound OpenMP threads" if args.bound else "1 unbound OpenMP thread"
    lines = [f"context {args.context} tokens, median of {args.reps}, {threads}, "
             "rows = restricted / scoring requests", head, "-" * len(head)]
    lines += [cell(llm, text, f, form, args.reps, spent)
              for f in args.fields for form in args.formulations]
    lines.append(f"route: {lm_head.STATS.route}")
    report = "\n".join(lines)
    print(report)
    return report


if __name__ == "__main__":
    main()
