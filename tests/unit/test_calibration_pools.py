"""`benchmarks.calibration` pools held-out rows per group and over every task, from saved rows
(no model): the pooled figures are the groups' rows together, never a mean of their ECEs."""

import json
import math
import random

from benchmarks import calibration

SCHEMA = {"type": "object", "properties": {"x": {"type": "string", "enum": ["a", "b"]}},
          "required": ["x"], "additionalProperties": False}


def leaning_rows(n: int, seed: int) -> list:
    """Rows whose scores lean to `a` whatever the gold: a prior a per-option bias removes."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        gold = rng.randrange(2)
        p = 0.8 if gold == 0 else 0.55 + 0.1 * rng.random()
        rows.append([[math.log(p), math.log(1 - p)], gold])
    return rows


def test_every_task_pools_the_groups_held_out_rows(tmp_path, capsys):
    saved = tmp_path / "rows.json"
    saved.write_text(json.dumps({
        "groups": {"seen": ["one"], "untouched": ["two"]},
        "rows": {"seen": [[SCHEMA, {"x": leaning_rows(80, 1)}]],
                 "untouched": [[SCHEMA, {"x": leaning_rows(120, 2)}]]}}))
    results = calibration.main(["--rows", str(saved), "--out", str(tmp_path / "out")])
    pools = results["pooled"]
    assert pools["seen"]["profile"]["rows"] == 40 and pools["untouched"]["profile"]["rows"] == 60
    assert pools["every task"]["profile"]["rows"] == 100
    right = (pools["seen"]["profile"]["accuracy"] * 40 + pools["untouched"]["profile"]["accuracy"]
             * 60) / 100
    assert abs(pools["every task"]["profile"]["accuracy"] - right) < 1e-9
    assert pools["every task"]["profile"]["ece"] < pools["every task"]["uncalibrated"]["ece"]
    assert "## every task" in capsys.readouterr().out
