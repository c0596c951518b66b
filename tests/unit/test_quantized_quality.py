"""benchmarks/quantized_quality.py on two dev cases: the comparison is not vacuous (the
reference against itself agrees exactly, quantization moves scores), and the hidden state it
projects is the one the model's own LM head reads."""

import pytest
import torch

from benchmarks import quantized_quality as qq
from benchmarks.evaluate import DEFAULT_DATA, load_cases
from vllm_pcd.core.plan import DEFAULT_FORMULATION, Options, build_plan
from vllm_pcd.core.schema import parse_schema

ROUTES = {k: qq.ROUTES[k] for k in ("torch/fp32", "torch/bf16", "w8a8-torch", "w4a8-torch",
                                     "w4a8-flaggems")}


@pytest.fixture(scope="module")
def model(model_path):
    torch.set_num_threads(1)
    return qq.load_model(model_path)


@pytest.fixture(scope="module")
def cases():
    if not DEFAULT_DATA.exists():
        pytest.skip(f"no dev set at {DEFAULT_DATA}")
    return load_cases(DEFAULT_DATA, 2)


def test_report(model, tokenizer, cases):
    report = qq.measure(model, tokenizer, cases, ROUTES)
    assert report["cases"] == 2 and report["reference"] == "torch/fp32"
    assert report["routes"]["w8a8-torch"] == "w8a8-torch"
    assert "cannot run here" in report["skipped_routes"]["w4a8-flaggems"]  # x86: probed, refused
    assert set(report["formulations"]) == {DEFAULT_FORMULATION, "codes"}
    for form in report["formulations"].values():
        assert 0 < form["served"] <= form["fields"]
        rows = form["compared"]
        assert set(rows) == {"torch/fp32", "torch/bf16", "w8a8-torch", "w4a8-torch"}
        assert all(r["fields"] == form["served"] for r in rows.values())
        assert rows["torch/fp32"] == {"fields": form["served"], "agreement": 1.0,
                                      "max_abs_diff": 0.0, "median_abs_diff": 0.0, "flips": []}
        assert rows["w8a8-torch"]["max_abs_diff"] > 0
        assert rows["w4a8-torch"]["max_abs_diff"] > 0
        assert 0 <= rows["w4a8-torch"]["agreement"] <= 1
    assert qq.table(report).count("\n") >= 10


def test_hidden_is_what_the_lm_head_reads(model, tokenizer, cases):
    """The cached branch forward's last hidden state, through the head, gives the logits of a
    whole-branch forward: it is the final-norm state, at the right position."""
    case = cases[0]
    plan = build_plan(tokenizer, parse_schema(case["schema"]),
                      [{"role": "user", "content": case["message"]}], Options(formulation="codes"))
    hiddens = qq.branch_hiddens(model, plan, [0, 1])
    for i, hidden in hiddens.items():
        ids = [*plan.shared_ids, *plan.scorings[i].suffix_ids]
        with torch.inference_mode():
            expected = model(torch.tensor([ids])).logits[0, -1]
            got = model.lm_head(hidden)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
