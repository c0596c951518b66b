"""A loaded engine, step by step: many documents' PCD calls at once against the floor's
prefills of the same number of documents.

    python -m benchmarks.bench_loaded_steps [--model PATH] [--fields 32] [--docs 32]
                                            [--reps 3] [--operators]

What many clients ask of the worker, without a server in between: one engine in this process
(`benchmarks.bench_steps.engine`), the field list cached as a tenant's documents would have it
(one warm-up call of each method), then every call on `--docs` documents not seen before
(synthetic tickets of 100-250 tokens). PCD answers them through the offline API
(`vllm_pcd.constrained` over the list: the contexts, then every branch) and the floor prefills
the same documents' prompts in one `generate`. The worker's step time per document is the
figure: PCD and the floor alternate, median of `--reps`. `--operators` adds one torch-profiled
rep of each, kept apart from the timings: the operators' self time per document shows what a
branch costs the worker beyond the tokens it computes (docs/performance.md).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks.bench_steps import OPERATORS, run_fields, step_parser, timed_steps
from benchmarks.workloads import tickets


def calls(llm: Any, model: str, fields: int, docs: int) -> dict[str, Callable[[int], None]]:
    """Each method's call on `docs` fresh documents (the argument seeds them)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from benchmarks.workloads import synthetic_schema
    from benchmarks.client import load_tokenizer, make_task
    from benchmarks.route_methods import floor_ids
    from vllm_pcd import constrained

    tokenizer, schema = load_tokenizer(model), synthetic_schema(fields)

    def floor(seed: int) -> None:
        prompts = [TokensPrompt(prompt_token_ids=floor_ids(
            make_task(tokenizer, schema, [{"role": "user", "content": text}]).plan))
            for text in tickets(tokenizer, docs, seed)]
        llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)

    return {"pcd": lambda seed: constrained(llm, tickets(tokenizer, docs, seed), schema),
            "floor": floor}


def measure(llm: Any, model: str, fields: int, docs: int, reps: int, operators: bool
            ) -> dict[str, Any]:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    methods = calls(llm, model, fields, docs)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in methods}
    profiled: dict[str, dict[str, float]] = {}
    seed = 1_000
    # rep 0 caches the field list and warms both up; it is not kept
    for rep in range(reps + 1 + operators):
        for name in (list(methods) if rep % 2 else list(reversed(methods))):
            seed += docs  # documents no call has seen
            with timed_steps(CPUModelRunner, rep > reps) as steps:
                start = time.perf_counter()
                methods[name](seed)
                total = time.perf_counter() - start
            if rep > reps:
                profiled[name] = {op: sum(s["operators_ms"].get(op, 0.0) for s in steps) / docs
                                  for op in OPERATORS}
            elif rep:
                runs[name].append({"s": total, "steps_s": sum(s["s"] for s in steps),
                                   "steps": len(steps),
                                   "requests": sum(s["requests"] for s in steps),
                                   "tokens": sum(s["tokens"] for s in steps)})
    return {"model": Path(model).name, "fields": fields, "docs": docs, "runs": runs,
            "operators_ms_per_doc": profiled}


def summary(result: dict[str, Any]) -> str:
    docs = result["docs"]
    lines = [f"{result['model']}, {result['fields']} fields, {docs} documents at once "
             f"(field list cached, median of {len(result['runs']['pcd'])})"]
    steps_ms = {}
    for name, runs in result["runs"].items():
        steps_ms[name] = 1e3 * statistics.median(r["steps_s"] for r in runs) / docs
        wall = 1e3 * statistics.median(r["s"] for r in runs) / docs
        lines.append(f"  {name:5s} worker steps {steps_ms[name]:6.1f} ms a document "
                     f"(wall {wall:.1f}); {runs[0]['steps']} steps, {runs[0]['requests']} "
                     f"requests scheduled, {runs[0]['tokens'] / docs:.0f} tokens a document")
        ops = result["operators_ms_per_doc"].get(name)
        if ops:
            lines.append("        " + ", ".join(f"{op} {ms:.1f}" for op, ms in ops.items())
                         + " ms a document (profiled rep)")
    lines.append(f"  PCD / floor: ×{steps_ms['pcd'] / steps_ms['floor']:.2f} the worker's time "
                 f"a document (×{steps_ms['floor'] / steps_ms['pcd']:.2f} its documents/s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = step_parser("python -m benchmarks.bench_loaded_steps", __doc__, [32], 3,
                         "loaded_steps.json",
                         "one more torch-profiled rep of each method (slower, kept apart)")
    parser.add_argument("--docs", type=int, default=32)
    args = parser.parse_args(argv)
    return run_fields(args, lambda llm, n: measure(llm, args.model, n, args.docs, args.reps,
                                                   args.operators), summary)


if __name__ == "__main__":
    main()
