"""The benchmark and the evaluation, in reduced form, against one real server.

Only that every supported method runs and answers schema-valid objects is checked; speed on a
shared CI machine says nothing, so no timing is asserted.
"""

import asyncio
import os

import pytest

from benchmarks import (bench_latency, bench_neighbours, bench_refusals, bench_throughput,
                        evaluate, workloads)
from benchmarks.client import Client, load_tokenizer, make_task
from benchmarks.methods import run_method
from tests.conftest import API_KEY

# What every model is served: these must always run. The others may answer "unsupported".
ALWAYS = {"pcd_token", "ar_json", "per_field", "floor", "pcd_systemone", "vllm_letters"}


@pytest.fixture(scope="module")
def url(pcd_server):
    """The suite's shared server (it runs the benchmark servers' flags too), with its key."""
    saved = os.environ.get("OPENAI_API_KEY")
    os.environ["OPENAI_API_KEY"] = API_KEY
    yield pcd_server
    if saved is None:
        os.environ.pop("OPENAI_API_KEY")
    else:
        os.environ["OPENAI_API_KEY"] = saved


def check_status(method, status):
    if method in ALWAYS:
        assert status == "ok", f"{method}: {status}"
    else:
        assert status == "ok" or status.startswith("unsupported"), f"{method}: {status}"


def test_baselines_compute_the_tokens_pcd_plans(url, model_path):
    """The client-side plan (used by per_field and floor) is the one the server computes."""
    schema = workloads.synthetic_schema(3)
    task = make_task(load_tokenizer(model_path), schema,
                     [{"role": "user", "content": "My router is broken, I want a refund."}])

    async def both():
        client = await Client(url).connect()
        try:
            return [await run_method(m, client, task) for m in ("pcd_token", "floor")]
        finally:
            await client.close()

    pcd, floor = asyncio.run(both())
    assert pcd.ok and floor.ok, (pcd.status, floor.status)
    ideal = len(task.plan.shared_ids) + task.plan.branch_tokens
    assert pcd.extra["tokens"]["ideal"] == ideal
    assert floor.tokens_computed == ideal


def test_quick_benchmark(url, model_path, tmp_path):
    results = bench_latency.main(["--quick", "--url", url, "--model", str(model_path),
                                  "--out", str(tmp_path / "latency")])
    assert (tmp_path / "latency.json").exists() and (tmp_path / "latency.png").exists()
    assert [(c["fields"], c["context_tokens"]) for c in results["cells"]] == [(1, 100), (3, 100)]
    for cell in results["cells"]:
        for method, row in cell["methods"].items():
            check_status(method, row["status"])
            if row["status"] == "ok":
                assert row["runs"] == 1 and row["median_s"] > 0
                assert row["schema_valid"] in (True, None), method
    assert [r["concurrency"] for r in results["concurrency"]] == [1, 2]
    assert all(r["failed"] == 0 for r in results["concurrency"])


def test_three_case_evaluation(url, model_path, tmp_path):
    if not evaluate.DEFAULT_DATA.exists():
        pytest.skip(f"no eval data at {evaluate.DEFAULT_DATA}")
    results = evaluate.main(["--data", str(evaluate.DEFAULT_DATA), "--limit", "3", "--url", url,
                             "--model", str(model_path), "--concurrency", "2",
                             "--out", str(tmp_path / "eval.json")])
    assert results["overall"]["cases"] == 3 and (tmp_path / "eval.reliability.png").exists()
    methods = results["overall"]["methods"]
    assert set(methods) == set(evaluate.DEFAULT_METHODS)
    for method, report in methods.items():
        check_status(method, report["status"])
        if report["status"] == "ok":
            assert report["schema_valid_rate"] == 1.0, method
            assert 0 <= report["field_accuracy"] <= 1
    assert set(results["overall"]["against_ar_json"]) == set(methods) - {"ar_json"}


def test_quick_throughput(url, model_path, tmp_path):
    results = bench_throughput.main(["--quick", "--url", url, "--model", str(model_path),
                                     "--out", str(tmp_path / "throughput")])
    assert (tmp_path / "throughput.json").exists() and (tmp_path / "throughput.png").exists()
    assert [(c["fields"], c["concurrency"]) for c in results["cells"]] == [(3, 1), (3, 2)]
    for cell in results["cells"]:
        assert set(cell["rows"]) == {f"{m}@{layout}" for m, layout in bench_throughput.ROWS}
        for name, row in cell["rows"].items():
            check_status(name.split("@")[0], row["status"])
            if row["status"] == "ok":
                assert row["failed"] == 0 and row["docs_per_s"] > 0
                assert row["documents"] == (2 if cell["concurrency"] == 1 else 4)
                assert row["schema_valid"] in (True, None), name
                assert row["tokens_per_doc"] > 0


def test_quick_refusal_benchmark(url, tmp_path):
    results = bench_refusals.main(["--quick", "--url", url, "--out", str(tmp_path / "r")])
    assert len(results["samples"]["loaded"]) == len(results["samples"]["idle"]) == 6
    assert results["oversized_sent"] > 0 and (tmp_path / "r.json").exists()


def test_quick_neighbour_benchmark(url, model_path, tmp_path):
    """Every arm times all of the neighbour's calls, and each load arm answered documents
    without a failure while it did."""
    results = bench_neighbours.main(["--quick", "--url", url, "--model", str(model_path),
                                     "--out", str(tmp_path / "n")])
    (cell,) = results["cells"]
    assert list(cell["runs"]) == [bench_neighbours.ALONE, *bench_neighbours.ROWS]
    for name, (run,) in cell["runs"].items():
        assert run["neighbour_calls"] == 3 and run["ttft_s"] > 0 and run["tpot_s"] > 0, name
        assert run["load_failures"] == 0, run["first_failure"]
        assert (run["load_answered"] > 0) == (name != bench_neighbours.ALONE), name
    assert (tmp_path / "n.json").exists() and (tmp_path / "n.png").exists()
