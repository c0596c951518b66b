"""The step benchmarks on the suite's in-process engine: a cold PCD call is two engine steps
(the shared context, then every branch in one), the floor one, and the profiled rep is kept
apart from the timings; a loaded run schedules every document's requests; the attention
benchmark runs the kernel on both shapes of the same queries. No time is asserted."""

import pytest

from benchmarks import bench_steps


def test_a_cold_call_is_a_context_step_then_one_branch_step(fp32_llm, model_path):
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    stock = CPUModelRunner.execute_model
    result = bench_steps.measure(fp32_llm, str(model_path), fields=3, context=20, reps=2,
                                 operators=True)
    assert CPUModelRunner.execute_model is stock  # the timing hook is taken off again
    pcd, floor = result["runs"]["pcd"], result["runs"]["floor"]
    assert len(pcd) == len(floor) == 2
    for run in pcd:
        context, branches = run["steps"]
        assert context["requests"] == 1 and branches["requests"] >= 3  # a request per field
        assert run["outside_s"] >= 0
    assert all([s["requests"] for s in run["steps"]] == [1] for run in floor)
    # the floor computes the context and each branch position once, in its one step
    assert context["tokens"] < floor[0]["steps"][0]["tokens"] <= context["tokens"] + \
        branches["tokens"]
    profiled = result["operators"]["pcd"]
    assert len(profiled) == 2 and all(step["operators_ms"] for step in profiled)
    assert "PCD / floor" in bench_steps.summary(result)


def test_a_loaded_step_count_is_every_document_s_requests(fp32_llm, model_path):
    from benchmarks import bench_loaded_steps

    result = bench_loaded_steps.measure(fp32_llm, str(model_path), fields=3, docs=2, reps=1,
                                        operators=True)
    (pcd,), (floor,) = result["runs"]["pcd"], result["runs"]["floor"]
    assert pcd["requests"] >= 2 * (1 + 3) and floor["requests"] >= 2  # a context and 3 branches
    assert floor["steps"] <= pcd["steps"] and pcd["steps_s"] > 0
    assert all(sum(result["operators_ms_per_doc"][name].values()) > 0
               for name in ("pcd", "floor"))
    assert "PCD / floor" in bench_loaded_steps.summary(result)


def test_the_attention_benchmark_times_both_shapes_of_the_same_queries():
    import torch

    from benchmarks import bench_branch_attention

    row = bench_branch_attention.measure((9, 3, 64), torch.float32, context=200, branches=4,
                                         query_len=3, reps=2, groups=2, cold=True)
    assert row["branches_ms"] > 0 and row["one_request_ms"] > 0
    assert row["ratio"] == pytest.approx(row["branches_ms"] / row["one_request_ms"])
