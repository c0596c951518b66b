"""The restricted head under tensor parallelism: a tiny random-weight Llama (4 heads of 64, 2 layers,
an untied head, SmolLM2's tokenizer) answered offline at TP=1 and TP=2 in FP32. Answers and
scores agree within 1e-4, and at TP=2 the head is still restricted (measured)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MESSAGE, SIX_FIELD_SCHEMA

TOLERANCE = 1e-4


def tiny_llama(model_path, out):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=256, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=False)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(out)
    for name in os.listdir(model_path):
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges")) or \
                name == "chat_template.jinja":
            shutil.copy(os.path.join(model_path, name), out)
    return out


def answer(model, tp, out):
    """One offline PCD answer in a child process (each TP size needs its own engine)."""
    env = {**os.environ, "VLLM_PLUGINS": "pcd", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    if tp > 1:  # one NUMA node here: vLLM's CPU workers need their cores named, one each
        cores = os.cpu_count() or 1
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(r % cores) for r in range(tp))
    path = out / f"tp{tp}.json"
    run = subprocess.run([sys.executable, "-m", "tests.engine.test_tensor_parallel", str(model),
                          str(tp), str(path)], env=env, capture_output=True, text=True,
                         timeout=900, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def tiny_model(model_path, tmp_path_factory):
    return tiny_llama(model_path, tmp_path_factory.mktemp("tiny-llama"))


def test_tp2_answers_as_tp1_with_the_head_restricted(tiny_model, tmp_path):
    one, two = answer(tiny_model, 1, tmp_path), answer(tiny_model, 2, tmp_path)
    assert one["object"] == two["object"]
    for name, scores in one["scores"].items():
        assert max(abs(a - b) for a, b in zip(scores, two["scores"][name])) < TOLERANCE, name
    for result in (one, two):
        assert result["projection"]["restricted_requests"] > 0, result["projection"]
        assert result["projection"]["fallbacks"] == 0, result["projection"]


def main(model, tp, out):
    from vllm import LLM

    from vllm_pcd import constrained

    llm = LLM(model, dtype="float32", tensor_parallel_size=int(tp), max_model_len=1024,
              enable_prefix_caching=True, seed=0)
    result = constrained(llm, MESSAGE, SIX_FIELD_SCHEMA, formulation="codes")
    with open(out, "w") as f:
        json.dump({"object": result.object,
                   "scores": {r.field.name: list(r.scores) for r in result.fields},
                   "projection": result.diagnostics()["projection"]}, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
