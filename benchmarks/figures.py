"""Tables of measured figures in README.md and docs/, generated from the results files that
the benchmarks wrote (`docs/results/<name>.json`), so a figure cannot drift from its
measurement: `tests/unit/test_docs.py` fails when a block differs from what its file renders.

A block in a page:
    <!-- figures:schema-cost -->
    ...the table, generated...
    <!-- /figures -->

    python -m benchmarks.figures          rewrite every block from its results file
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from benchmarks import bench_minicpm5, bench_schema_cost, calibration_methods

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# name -> (what renders its rows, the command that measured them)
TABLES: dict[str, tuple[Callable[[Any], str], str]] = {
    "schema-cost": (bench_schema_cost.table,
                    "python -m benchmarks.bench_schema_cost --out docs/results/schema-cost.json"),
    "public-eval": (
        calibration_methods.table,
        "python -m benchmarks.calibration_methods <runs> --out docs/results/public-eval.json"),
    "minicpm5-shape": (
        bench_minicpm5.table,
        "python -m benchmarks.bench_minicpm5 --out docs/results/minicpm5-shape.json"),
}
BLOCK = re.compile(r"(<!-- figures:([a-z0-9-]+) -->\n)(.*?)(<!-- /figures -->)", re.S)


def rendered(name: str) -> str:
    render, command = TABLES[name]
    results = json.loads((RESULTS / f"{name}.json").read_text())
    return (f"{render(results['rows'])}\n\n{results['machine']}; "
            f"`{command}` → `docs/results/{name}.json`.\n")


def blocks(text: str) -> list[tuple[str, str]]:
    """(name, current content) of every figures block in `text`."""
    return [(m.group(2), m.group(3)) for m in BLOCK.finditer(text)]


def write() -> int:
    for page in PAGES:
        text = page.read_text()
        new = BLOCK.sub(lambda m: m.group(1) + rendered(m.group(2)) + m.group(4), text)
        if new != text:
            page.write_text(new)
            print(f"rewrote the figures in {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(write())
