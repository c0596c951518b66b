"""What each hostile schema family costs to parse or refuse, at growing sizes: the pure core
alone (no server), so the table shows the cost model itself. Read the last columns: the time
per kilobyte stays flat (or falls) as a family grows, which is what linear means.

    python -m benchmarks.bench_schema_cost [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

from benchmarks.hostile_schemas import SCHEMA_FAMILIES
from vllm_pcd.core.schema import SchemaError, parse as schema_module, parse_schema


def timed_parse(raw: Any, reps: int) -> tuple[float, str]:
    """Median seconds of a cold parse (the cache cleared each time), and its outcome."""
    times, outcome = [], ""
    for _ in range(reps):
        schema_module._parse_kept.cache_clear()
        start = time.perf_counter()
        try:
            spec = parse_schema(raw)
            outcome = f"answered ({spec.total_candidates} values)"
        except SchemaError as err:
            outcome = f"400 {err.rule}"
        times.append(time.perf_counter() - start)
    return statistics.median(times), outcome


def measure(reps: int) -> list[dict[str, Any]]:
    parse_schema(SCHEMA_FAMILIES["unused_definitions"][0](4))  # imports before timing
    rows = []
    for family, (build, sizes) in SCHEMA_FAMILIES.items():
        for size in sizes:
            raw = build(size)
            seconds, outcome = timed_parse(raw, reps)
            rows.append({"family": family, "size": size, "bytes": len(json.dumps(raw)),
                         "seconds": seconds, "outcome": outcome})
    return rows


def machine() -> str:
    """The CPU, as the results' note names it."""
    info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines()
                      if line.startswith("flags")), []))
    named = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return (f"{model} ({', '.join(named) or 'no AVX2'}), {os.cpu_count()} cores, "
            f"Python {platform.python_version()}")


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| family | size | body KB | parse or refusal ms | ms per KB | outcome |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        kb = r["bytes"] / 1024
        lines.append(f"| {r['family']} | {r['size']} | {kb:.1f} | {r['seconds'] * 1e3:.2f} | "
                     f"{r['seconds'] * 1e3 / kb:.3f} | {r['outcome']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_schema_cost",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    rows = measure(args.reps)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine(), "rows": rows}, f, indent=2)
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
