"""A W4A8-G128 compressed-tensors checkpoint, FlagOS' format, written by
`python -m vllm_pcd.quantized_checkpoint` from a small random Llama and served with the plugin:
the checkpoint states the contract, vLLM runs every body linear on `CompressedTensorsW4A8Int`
(strict coverage on), PCD answers with the fork's ideal tokens and projects the BF16 head,
and its scores follow transformers' forward of the dequantized checkpoint. On vLLM 0.32 and
0.24 alike."""

import json
import subprocess
import sys

import openai
import pytest
import torch
from safetensors import safe_open

from tests.conftest import API_KEY, MESSAGE, SIX_FIELD_SCHEMA, computed_tokens, server_args
from tests.helpers import pcd, reference_candidate_sums, reference_scores
from vllm_pcd import quantized_checkpoint as qc
from vllm_pcd.core.plan import DEFAULT_FORMULATION, Options, build_plan
from vllm_pcd.core.schema import parse_schema
from vllm_pcd.launch import serve
from vllm_pcd.pipeline import as_messages

pytestmark = pytest.mark.vllm024  # FlagOS hosts serve this format on vLLM 0.24

LAYERS = 2
LINEARS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
           "mlp": ("gate_proj", "up_proj", "down_proj")}
# The largest difference in a field's option score (nats) between PCD on the served W4A8
# model (BF16) and transformers' FP32 forward of the dequantized checkpoint. vLLM's W4A8
# kernel quantizes each token's activations to INT8, the reference does not; measured on this
# model: 0.16 served in BF16, 0.12 in FP32. The BF16 source model's scores lie further away.
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(the BF16 source, its W4A8 checkpoint, one with the down projections kept dense)."""
    root = tmp_path_factory.mktemp("w4a8")
    source = qc.write_tiny_llama(root / "bf16", LAYERS)
    partial = qc.write_w4a8(source, root / "partial", ignore=["re:.*down_proj$"])
    return source, root / "w4a8", partial


@pytest.fixture(scope="module")
def w4a8(checkpoints):
    """The full conversion, run as its command runs it."""
    source, out, _ = checkpoints
    assert qc.main(["w4a8", "--source", str(source), "--out", str(out)]) == 0
    return out


def test_the_checkpoint_states_the_flagos_contract(w4a8):
    assert qc.quantization_of(w4a8) == {
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                        "group_size": 128, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                  "strategy": "token", "group_size": None, "dynamic": True}}},
        "ignore": ["lm_head"]}


def test_body_weights_are_int4_codes_in_groups_of_128_and_the_head_stays_bf16(checkpoints,
                                                                               w4a8):
    source, _, _ = checkpoints
    with safe_open(source / "model.safetensors", "pt") as bf16, \
            safe_open(w4a8 / "model.safetensors", "pt") as quantized:
        for name in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"):
            kept = quantized.get_tensor(name)
            assert kept.dtype == torch.bfloat16 and torch.equal(kept, bf16.get_tensor(name))
        for layer in range(LAYERS):
            for block, names in LINEARS.items():
                for linear in names:
                    prefix = f"model.layers.{layer}.{block}.{linear}."
                    codes, scale = (quantized.get_tensor(prefix + "weight"),
                                    quantized.get_tensor(prefix + "weight_scale"))
                    original = bf16.get_tensor(prefix + "weight").float()
                    rows, columns = original.shape
                    assert codes.dtype == torch.int8 and codes.shape == original.shape
                    assert -8 <= codes.min() and codes.max() <= 7
                    assert scale.dtype == torch.bfloat16
                    assert scale.shape == (rows, columns // qc.GROUP_SIZE)
                    groups = scale.float().repeat_interleave(qc.GROUP_SIZE, 1)
                    # each value within one step of its group's grid (the top code clamps)
                    assert ((codes.float() * groups - original).abs() <= groups).all()


@pytest.fixture(scope="module")
def served(w4a8, tmp_path_factory):
    """`VLLM_PLUGINS=pcd vllm serve` on the W4A8 checkpoint, in BF16 as FlagOS serves it, with
    strict coverage: it starts only if every body linear runs W4A8-G128."""
    log = tmp_path_factory.mktemp("served") / "vllm.log"
    args = [*server_args(dtype="bfloat16", pcd_config={"strict_coverage": True}),
            "--enforce-eager"]
    with serve(w4a8, args=args, log_path=log) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
        yield client, log


def test_start_up_reports_every_body_linear_on_w4a8_g128_and_the_head_route(served):
    _, log = served
    lines = [line for line in log.read_text().splitlines() if "PCD coverage:" in line]
    assert len(lines) == 1
    assert lines[0].endswith(
        f"PCD coverage: {4 * LAYERS} of {4 * LAYERS} body linears run W4A8-G128 (kernels: "
        f"Dynamic4bitLinearKernel x{4 * LAYERS}), 0 fall back; LM head bfloat16 "
        "(UnquantizedEmbeddingMethod), PCD restricted route torch")


@pytest.fixture(scope="module")
def references(checkpoints, w4a8):
    """transformers' FP32 forwards: the dequantized checkpoint (activations left in float),
    and the BF16 source it was quantized from."""
    from compressed_tensors.quantization import disable_quantization
    from transformers import AutoModelForCausalLM

    dequantized = AutoModelForCausalLM.from_pretrained(w4a8, dtype=torch.float32).eval()
    dequantized.apply(disable_quantization)
    source = AutoModelForCausalLM.from_pretrained(checkpoints[0], dtype=torch.float32).eval()
    return dequantized, source


@pytest.mark.parametrize("formulation", ["codes", DEFAULT_FORMULATION])
def test_pcd_answers_with_the_ideal_tokens_and_the_dequantized_models_scores(
        served, references, w4a8, formulation):
    from transformers import AutoTokenizer

    client, _ = served
    response = pcd(client, SIX_FIELD_SCHEMA, extra_kwargs={"pcd_formulation": formulation})
    diag = response.model_extra["pcd"]
    plan = build_plan(AutoTokenizer.from_pretrained(w4a8), parse_schema(SIX_FIELD_SCHEMA),
                      as_messages(MESSAGE), Options(formulation=formulation))
    assert diag["backbone_calls"] == 2
    assert diag["tokens"]["computed"] == computed_tokens(plan)
    if formulation == "codes":  # one request a field: exactly the ideal tokens
        assert diag["tokens"]["computed"] == diag["tokens"]["ideal"]
    assert diag["projection"] == {"route": "torch", "fallbacks": 0,
                                  "restricted_requests": sum(s.restricted for s in plan.scorings)}
    assert set(json.loads(response.choices[0].message.content)) == set(
        SIX_FIELD_SCHEMA["properties"])
    worst = {}
    for name, model in zip(("dequantized", "source"), references):
        worst[name] = 0.0
        for i, fp in enumerate(plan.fields):
            if formulation == "codes":
                expected = reference_scores(model, plan.branch_ids(i), fp.code_ids)
            else:
                sums = torch.tensor(reference_candidate_sums(model, plan.shared_ids, fp))
                expected = (sums - torch.logsumexp(sums, 0)).tolist()
            got = [c["score"] for c in diag["fields"][fp.field.name]["candidates"]]
            worst[name] = max(worst[name], *(abs(a - b) for a, b in zip(got, expected)))
    assert worst["dequantized"] < TOLERANCE < worst["source"], worst


def test_the_coverage_command_counts_a_fallback(checkpoints):
    """Down projections kept dense: one linear a layer falls back, and the command says so
    with exit 1."""
    run = subprocess.run([sys.executable, "-m", "vllm_pcd.coverage", str(checkpoints[2]),
                          "--dtype", "bfloat16"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report == {"w4a8_g128": 3 * LAYERS, "fallback": LAYERS,
                      "fallbacks": {"UnquantizedLinearMethod": LAYERS},
                      "kernels": {"Dynamic4bitLinearKernel": 3 * LAYERS},
                      "head": "bfloat16 (UnquantizedEmbeddingMethod)", "head_route": "torch",
                      "head_problem": None}


def test_strict_coverage_refuses_to_start_on_a_fallback(checkpoints, tmp_path):
    args = [*server_args(dtype="bfloat16", pcd_config={"strict_coverage": True}),
            "--enforce-eager"]
    with pytest.raises(RuntimeError, match="exited with code"):
        with serve(checkpoints[2], args=args, log_path=tmp_path / "vllm.log"):
            pass
    log = (tmp_path / "vllm.log").read_text()
    assert f"{3 * LAYERS} of {4 * LAYERS} body linears run W4A8-G128" in log
    assert "CoverageError: additional_config.pcd.strict_coverage" in log


def test_the_coverage_command_counts_a_deeper_config_without_its_weights(w4a8, tmp_path):
    """The checkpoint's config at 42 layers, no weights (vLLM's dummy loader): the count is of
    the layers vLLM builds, 4 a layer, as FlagOS' acceptance check expects for MiniCPM5 (168)."""
    deeper = tmp_path / "deeper"
    deeper.mkdir()
    for item in w4a8.iterdir():
        if item.suffix != ".safetensors" and item.is_file():
            (deeper / item.name).write_bytes(item.read_bytes())
    config = json.loads((w4a8 / "config.json").read_text())
    (deeper / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 42}))
    run = subprocess.run([sys.executable, "-m", "vllm_pcd.coverage", str(deeper), "--dtype",
                          "bfloat16", "--load-format", "dummy"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert (report["w4a8_g128"], report["fallback"]) == (168, 0)
