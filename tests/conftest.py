import os
from typing import Any

import pytest

from benchmarks.methods import server_args as benchmark_server_args
from vllm_pcd.models import default_model_path

CPU_BLOCK_SIZE = 128


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm024: also runs on vLLM 0.24.0, the FlagOS hosts' "
                            "version (PCD_VLLM=0.24.0 ./scripts/test.sh selects it)")


def computed_tokens(plan):
    """What the engine computes for a token-mode plan, on every supported vLLM (the fork):
    the shared context once and each request's own tokens."""
    return len(plan.shared_ids) + sum(len(s.suffix_ids) for s in plan.scorings)

SUPPORT_SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "enum": ["billing", "technical", "shipping", "account"],
                  "description": "The main issue in the message"},
        "refund_requested": {"type": "boolean",
                             "description": "Whether the customer asks for a refund"},
    },
    "required": ["topic", "refund_requested"],
    "additionalProperties": False,
}

SIX_FIELD_SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "enum": ["billing", "technical", "shipping", "account"]},
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"],
                      "description": "Overall tone of the customer"},
        "urgent": {"type": "boolean", "description": "Whether the customer needs help today"},
        "refund_requested": {"type": "boolean"},
        "channel": {"type": "string", "enum": ["email", "phone", "chat", "unknown"]},
        "language": {"type": "string", "enum": ["English", "Español", "Deutsch"]},
    },
    "required": ["topic", "sentiment", "urgent", "refund_requested", "channel", "language"],
    "additionalProperties": False,
}

MESSAGE = "I was charged twice. Please refund the duplicate charge."


@pytest.fixture(scope="session")
def model_path():
    path = default_model_path()
    if not (path / "config.json").exists():
        pytest.fail(f"default model missing at {path}: run scripts/setup.sh")
    return path


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="session")
def fp32_llm(model_path):
    """One in-process FP32 engine for the whole session (startup dominates test time)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_PLUGINS", "pcd")  # PCD's engine patches are only applied when asked
    from vllm import LLM

    # max_logprobs=-1 lets a neighbour ask for the full vocabulary (`test_neighbours.py`).
    llm = LLM(str(model_path), dtype="float32", enable_prefix_caching=True,
              disable_log_stats=False, max_model_len=4096, seed=0, max_logprobs=-1)
    yield llm
    del llm


@pytest.fixture(scope="module")
def reference_model(model_path):
    """The FP32 reference: the default model in plain transformers, no KV cache
    (`tests.helpers.reference_scores` reads it)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return model.eval()


API_KEY = "pcd-test-key"
# One plugin server for the HTTP tests and the benchmark smoke test: the benchmarks' flags (the
# dtype this CPU serves fastest, cached-token counts, xgrammar for the AR baseline) and an API
# key so every route's authentication is exercised too.


def server_args(**benchmark: Any) -> list[str]:
    """The test servers' flags: the benchmarks' (`benchmarks.methods.server_args`), a model
    length and the API key."""
    return [*benchmark_server_args(**benchmark), "--max-model-len", "4096", "--api-key", API_KEY]


SERVER_ARGS = server_args()


# The shared server's one calibration profile (`core.profiles`): a schema no other test asks.
PROFILED_SCHEMA = {
    "type": "object",
    "properties": {
        "urgent": {"type": "boolean", "description": "Whether the customer needs help today"},
        "channel": {"type": "string", "enum": ["email", "phone", "chat"],
                    "description": "How the customer wants to be answered"},
    },
    "required": ["urgent", "channel"],
    "additionalProperties": False,
}
PROFILE_TEMPERATURE = 2.0


def write_test_profile(folder, model_path):
    """A temperature for `channel`, and biases that always answer `urgent: false`, which is
    flagged low-confidence below 0.5 (never) and `channel` below 1.0 (always)."""
    from vllm_pcd.core.scoring import OptionBias, Temperature
    from vllm_pcd.core.profiles import Profile, write_profiles

    path = folder / "profile.json"
    write_profiles(path, [Profile(str(model_path), PROFILED_SCHEMA, {}, {
        "urgent": OptionBias(1.0, (-40.0, 40.0)), "channel": Temperature(PROFILE_TEMPERATURE)},
        {"urgent": 0.5, "channel": 1.0}, {"ece": 0.01, "cases": 10})])
    return path


@pytest.fixture(scope="session")
def pcd_server(model_path, tmp_path_factory):
    """Base URL of `VLLM_PLUGINS=pcd vllm serve` on the default model, answering vLLM's own
    structured-output requests too (a request opts out with `pcd_structured_outputs`)."""
    from vllm_pcd.launch import serve

    folder = tmp_path_factory.mktemp("serve")
    args = server_args(pcd_config={
        "calibration_profiles": [str(write_test_profile(folder, model_path))]})
    with serve(model_path, args=args, log_path=folder / "vllm.log") as url:
        yield url


@pytest.fixture(scope="session")
def client(pcd_server):
    import openai

    return openai.OpenAI(base_url=pcd_server + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def http(pcd_server):
    """An HTTP client of the shared server, with its API key and its model's name."""
    import httpx

    with httpx.Client(base_url=pcd_server, timeout=300,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as client:
        client.model = client.get("/v1/models").json()["data"][0]["id"]
        yield client


def run_interpreted(test_file) -> None:
    """Run `test_file`'s interpreted Triton tests in a child where TRITON_INTERPRET=1 comes
    before `import triton` (it cannot be switched on in a process that imported it)."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
         "interpret and not interpreted", str(test_file)],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
