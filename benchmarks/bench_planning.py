"""Planning one call (schema check and plan), from scratch against with what planning keeps.

    python -m benchmarks.bench_planning [--model PATH ...] [--fields 8 32] [--docs 20]

The API server plans every PCD call on one thread: it parses the schema (with JSON Schema's
meta-check) and tokenizes the conversation and every field's continuations. Documents asked
the same schema repeat the schema's part, so planning keeps the parsed schema and the tails'
tokens (`core.schema.parse_schema`, `core.plan.in_context.tail_ids`). This times `--docs`
synthetic tickets (about 300 tokens each) a call at a time, each call either with the caches
emptied first ("scratch") or kept ("kept"), alternating, and prints the medians and their
ratio. Both must give the same plans.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

from benchmarks.workloads import synthetic_schema, synthetic_ticket
from benchmarks.client import load_tokenizer
from vllm_pcd.core.plan import Options, Plan, build_plan, in_context
from vllm_pcd.core.schema import parse as schema_module, parse_schema
from vllm_pcd.models import default_model_path


def plan_call(tokenizer: Any, schema: dict[str, Any], document: str) -> Plan:
    """What the server does before any engine work for one call."""
    return build_plan(tokenizer, parse_schema(schema), [{"role": "user", "content": document}],
                      Options())


def emptied() -> None:
    schema_module._parse_kept.cache_clear()
    in_context._kept_tail.cache_clear()


def timed(call: Callable[[], Plan]) -> tuple[float, Plan]:
    start = time.perf_counter()
    plan = call()
    return time.perf_counter() - start, plan


def measure(tokenizer: Any, fields: int, docs: int) -> dict[str, Any]:
    schema = synthetic_schema(fields)
    documents = [synthetic_ticket(tokenizer, 300, seed) for seed in range(docs)]
    plan_call(tokenizer, schema, documents[0])  # the template and tokenizer warm up
    scratch, kept = [], []
    for document in documents:
        emptied()
        cold_s, cold = timed(lambda: plan_call(tokenizer, schema, document))
        plan_call(tokenizer, schema, documents[0])  # what an earlier document left
        warm_s, warm = timed(lambda: plan_call(tokenizer, schema, document))
        if warm != cold:
            raise AssertionError(f"kept caches planned another plan at {fields} fields")
        scratch.append(cold_s)
        kept.append(warm_s)
    return {"fields": fields, "docs": docs, "scratch_ms": 1000 * statistics.median(scratch),
            "kept_ms": 1000 * statistics.median(kept)}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", nargs="+", default=[str(default_model_path())])
    parser.add_argument("--fields", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--docs", type=int, default=20)
    args = parser.parse_args(argv)
    rows = []
    print("| model | fields | from scratch (ms, median) | kept (ms) | scratch / kept |")
    print("|---|---|---|---|---|")
    for model in args.model:
        tokenizer = load_tokenizer(model)
        for fields in args.fields:
            row = {"model": model, **measure(tokenizer, fields, args.docs)}
            rows.append(row)
            print(f"| {model.rstrip('/').split('/')[-1]} | {fields} | {row['scratch_ms']:.2f} "
                  f"| {row['kept_ms']:.2f} | ×{row['scratch_ms'] / row['kept_ms']:.1f} |")
    return rows


if __name__ == "__main__":
    main()
