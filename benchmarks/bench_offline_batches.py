"""Offline batches as large as the KV cache holds, against fixed batches of 256 documents.

    python -m benchmarks.bench_offline_batches [--model PATH] [--fields 32] [--docs 32 128]
                                               [--reps 1]

`vllm_pcd.constrained` over a list submits the documents in batches: every context of a
batch, then every branch. A batch whose blocks outgrow the KV cache has the engine evict
contexts whose branches have not run yet (the least recently used blocks go first), and
those branches compute their context again. Both arms run on one in-process engine
(`benchmarks.bench_steps.engine`, 2 GiB of KV cache unless `VLLM_CPU_KVCACHE_SPACE` says
otherwise), the field list cached, alternating, each call on documents no call has seen:
- `kv`: today's batches, sized by the KV cache (`pipeline.batches`);
- `fixed`: the batches before them, 256 documents whatever the cache holds.
Printed per arm: documents/s, tokens computed a document, the batches; and the ratios.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks.workloads import tickets
from benchmarks.bench_steps import run_fields, step_parser

ARMS = ("kv", "fixed")


def counting(sizes: list[int]) -> Any:
    """`pipeline.batches`, noting each batch's size in `sizes`."""
    from vllm_pcd import pipeline

    real = pipeline.batches

    def batches(*args: Any) -> Any:
        for batch in real(*args):
            sizes.append(len(batch[1]))
            yield batch
    return batches


def one_call(llm: Any, texts: list[str], schema: dict[str, Any], arm: str) -> dict[str, Any]:
    from vllm_pcd import constrained, pipeline

    sizes: list[int] = []
    with mock.patch.object(pipeline, "batches", counting(sizes)), \
            mock.patch.object(pipeline, "kv_room",
                              pipeline.kv_room if arm == "kv" else lambda llm: None):
        start = time.perf_counter()
        results = constrained(llm, texts, schema)
        seconds = time.perf_counter() - start
    tokens = [r.diagnostics()["tokens"] for r in results]
    return {"s": seconds, "batches": sizes,
            "computed": sum(t["computed"] for t in tokens) / len(texts),
            "ideal": sum(t["ideal"] for t in tokens) / len(texts)}


def measure(llm: Any, model: str, fields: int, docs: list[int], reps: int) -> dict[str, Any]:
    from benchmarks.workloads import synthetic_schema
    from benchmarks.client import load_tokenizer
    from vllm_pcd import constrained, pipeline

    tokenizer, schema = load_tokenizer(model), synthetic_schema(fields)
    constrained(llm, tickets(tokenizer, 2, 1), schema)  # caches the field list, warms up
    rows = []
    seed = 10_000
    for count in docs:
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        for rep in range(reps):
            for arm in (ARMS if rep % 2 == 0 else ARMS[::-1]):
                seed += count  # documents no call has seen
                runs[arm].append(one_call(llm, tickets(tokenizer, count, seed), schema, arm))
        rows.append({"docs": count, "runs": runs})
    return {"model": Path(model).name, "fields": fields, "kv_room": pipeline.kv_room(llm),
            "rows": rows}


def summary(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}, {result['fields']} fields, field list cached; KV room "
             f"(blocks, block size) {result['kv_room']}"]
    for row in result["rows"]:
        docs, rate, computed = row["docs"], {}, {}
        lines.append(f"  {docs} documents in one call (median of {len(row['runs']['kv'])})")
        for arm, runs in row["runs"].items():
            rate[arm] = docs / statistics.median(r["s"] for r in runs)
            computed[arm] = statistics.median(r["computed"] for r in runs)
            lines.append(f"    {arm:5s} {rate[arm]:5.2f} documents/s, {computed[arm]:6.0f} "
                         f"tokens computed a document (ideal alone {runs[0]['ideal']:.0f}), "
                         f"batches {runs[0]['batches']}")
        lines.append(f"    kv / fixed: ×{rate['kv'] / rate['fixed']:.2f} documents/s, "
                     f"×{computed['kv'] / computed['fixed']:.2f} the tokens")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = step_parser("python -m benchmarks.bench_offline_batches", __doc__, [32], 1,
                         "offline_batches.json")
    parser.add_argument("--docs", type=int, nargs="+", default=[32, 128])
    args = parser.parse_args(argv)
    return run_fields(args, lambda llm, n: measure(llm, args.model, n, args.docs, args.reps),
                      summary)


if __name__ == "__main__":
    main()
