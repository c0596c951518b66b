"""Engine step by engine step: one cold PCD call against the floor's single prefill.

    python -m benchmarks.bench_steps [--model PATH] [--fields 8 32] [--context 100]
                                     [--reps 5] [--operators]

One engine in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, so the worker's steps can be
timed where they run), the benchmarks' synthetic schema and ticket, the prefix cache emptied
before every call so each is cold. Each model-runner step is timed around `execute_model`
(and its `sample_tokens` where the runner samples in a call of its own);
the call's time outside its steps is planning, submission and output handling. PCD and the
floor alternate call by call. `--operators` adds one more rep, torch-profiled and kept apart
from the timings: the self time of the operators that dominate a CPU forward, per step, shows
where a branch step's time goes beyond the tokens it computes (docs/performance.md, "Where
PCD's time goes beyond the floor").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from benchmarks.harness import provenance
from vllm_pcd.models import default_model_path, fast_dtype

OPERATORS = ("_C::onednn_mm", "_C::cpu_attention_with_kv_cache", "aten::copy_",
             "_C::weight_packed_linear", "_C::cpu_attn_reshape_and_cache", "aten::_log_softmax")


@contextlib.contextmanager
def timed_steps(runner_cls: Any, operators: bool) -> Iterator[list[dict[str, Any]]]:
    """Every step of the runner while the block runs: requests, tokens, seconds (and the
    operators' self milliseconds when asked). A step is its `execute_model` and, where the
    runner samples in a call of its own (`sample_tokens`, vLLM 0.32), that call too."""
    import torch

    steps: list[dict[str, Any]] = []
    stock = {name: getattr(runner_cls, name) for name in ("execute_model", "sample_tokens")
             if hasattr(runner_cls, name)}

    def timed(name: str) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            profiler = (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                        if operators else contextlib.nullcontext())
            start = time.perf_counter()
            with profiler:
                out = stock[name](self, *args, **kwargs)
            seconds = time.perf_counter() - start
            if name == "execute_model":
                scheduled = args[0] if args else kwargs["scheduler_output"]
                steps.append({"requests": len(scheduled.num_scheduled_tokens),
                              "tokens": scheduled.total_num_scheduled_tokens, "s": 0.0,
                              "operators_ms": {}})
            if not steps:  # sampling for a step taken before the block began
                return out
            step = steps[-1]
            step["s"] += seconds
            if operators:
                for e in profiler.key_averages():
                    if e.key in OPERATORS:
                        step["operators_ms"][e.key] = (step["operators_ms"].get(e.key, 0.0)
                                                       + e.self_cpu_time_total / 1e3)
            return out
        return call

    for name in stock:
        setattr(runner_cls, name, timed(name))
    try:
        yield steps
    finally:
        for name, method in stock.items():
            setattr(runner_cls, name, method)


def engine(model: str) -> Any:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_PLUGINS", "pcd")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM

    return LLM(model, dtype=fast_dtype(), enable_prefix_caching=True, max_model_len=4096,
               seed=0)


def measure(llm: Any, model: str, fields: int, context: int, reps: int, operators: bool
            ) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    from benchmarks.workloads import synthetic_schema, synthetic_ticket
    from benchmarks.client import load_tokenizer, make_task
    from benchmarks.route_methods import floor_ids
    from vllm_pcd import constrained

    tokenizer, schema = load_tokenizer(model), synthetic_schema(fields)
    text = synthetic_ticket(tokenizer, context, seed=1)
    floor_prompt = TokensPrompt(prompt_token_ids=floor_ids(
        make_task(tokenizer, schema, [{"role": "user", "content": text}]).plan))
    calls = {"pcd": lambda: constrained(llm, text, schema),
             "floor": lambda: llm.generate([floor_prompt], SamplingParams(max_tokens=1),
                                           use_tqdm=False)}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in calls}
    profiled: dict[str, list[dict[str, Any]]] = {}
    # rep 0 warms both up and is not kept; a last, profiled rep is kept apart (the profiler
    # slows the steps it watches)
    for rep in range(reps + 1 + operators):
        for name in (list(calls) if rep % 2 else list(reversed(calls))):
            llm.reset_prefix_cache()
            with timed_steps(CPUModelRunner, rep > reps) as steps:
                start = time.perf_counter()
                calls[name]()
                total = time.perf_counter() - start
            if rep > reps:
                profiled[name] = steps
            elif rep:
                runs[name].append({"s": total, "steps": steps,
                                   "outside_s": total - sum(s["s"] for s in steps)})
    return {"model": Path(model).name, "fields": fields, "context": context, "runs": runs,
            "operators": profiled}


def summary(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}, {result['fields']} fields, context ~{result['context']} "
             f"(cold, median of {len(result['runs']['pcd'])})"]
    median = {name: statistics.median(r["s"] for r in runs)
              for name, runs in result["runs"].items()}
    for name, runs in result["runs"].items():
        steps = [f"{s['requests']} req / {s['tokens']} tok "
                 f"{1e3 * statistics.median(r['steps'][i]['s'] for r in runs):.0f} ms"
                 for i, s in enumerate(runs[0]["steps"])]
        outside = statistics.median(r["outside_s"] for r in runs)
        lines.append(f"  {name:5s} {1e3 * median[name]:6.0f} ms  steps: {'; '.join(steps)}; "
                     f"outside the steps {1e3 * outside:.0f} ms")
        for step in result["operators"].get(name, []):
            ops = ", ".join(f"{k} {v:.1f}" for k, v in sorted(step["operators_ms"].items()))
            lines.append(f"        {step['requests']} req / {step['tokens']} tok: {ops} ms")
    lines.append(f"  PCD / floor: ×{median['pcd'] / median['floor']:.2f} the time")
    return "\n".join(lines)


def step_parser(prog: str, doc: str, fields: list[int], reps: int, out: str,
                operators_help: str | None = None) -> argparse.ArgumentParser:
    """The arguments the in-process engine benchmarks share: model, fields, reps, out, and
    operators where `operators_help` says what it does."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--fields", type=int, nargs="+", default=fields)
    parser.add_argument("--reps", type=int, default=reps)
    if operators_help:
        parser.add_argument("--operators", action="store_true", help=operators_help)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / out)
    return parser


def run_fields(args: argparse.Namespace, measure_fields: Callable[[Any, int], dict[str, Any]],
               summarize: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """One engine, one measurement per field count: printed, and saved with provenance."""
    llm = engine(args.model)
    results = [measure_fields(llm, n) for n in args.fields]
    for result in results:
        print(summarize(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**provenance(), "results": results}, indent=1))
    return results


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = step_parser("python -m benchmarks.bench_steps", __doc__, [8, 32], 5, "steps.json",
                         "torch-profile the last rep's steps (slows that rep)")
    parser.add_argument("--context", type=int, default=100, help="approximate ticket tokens")
    args = parser.parse_args(argv)
    return run_fields(args, lambda llm, n: measure(llm, args.model, n, args.context, args.reps,
                                                   args.operators), summary)


if __name__ == "__main__":
    main()
