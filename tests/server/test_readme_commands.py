"""The commands README.md tells a user to type, run from the README's own text.

The first command (`./scripts/demo.sh`, which sets up and runs `python -m vllm_pcd.demo`) runs
as a user runs it: the demo starts its own server and must exit 0 having printed the object,
the backbone calls, the tokens and every field's scores. The quick-start request, the SDK's
`pcd_schema` and `parse()` examples, the `/v1/decisions` request and the offline example are
read from the README's fenced blocks and run against the suite's shared server (or its
in-process engine), which serves the same plugin on the same model; where a line carries the
value it shows in a comment (`expr   # value`), the run must give that value. `vllm run-batch`
is run by tests/server/test_doors.py on the same kind of file the README's example writes.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import API_KEY

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
VENV_BIN = str(Path(sys.executable).parent)


def block(anchor: str, language: str) -> str:
    """The first fenced `language` block after the README text `anchor`."""
    at = README.index(anchor)
    found = re.compile(rf"^```{language}\n(.*?)^```", re.S | re.M).search(README, at)
    assert found, f"no {language} block after {anchor!r}"
    return found.group(1)


def against(script: str, url: str) -> str:
    """A README shell script aimed at the suite's server: its host and API key."""
    host = urlsplit(url).netloc
    script = script.replace("localhost:8000/v1/",
                            f"-H 'Authorization: Bearer {API_KEY}' {host}/v1/")
    return script.replace("localhost:8000", host)


def run_bash(script: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": VENV_BIN + os.pathsep + os.environ["PATH"]}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def check_shown_values(code: str, namespace: dict) -> int:
    """Each `expr   # value` line whose comment is a Python value gives that value."""
    checked = 0
    for line in code.splitlines():
        expr, sep, shown = line.partition("#")
        if not sep or not expr.strip() or "=" in expr.replace("==", ""):
            continue
        try:
            expected = eval(shown.strip(), namespace)  # noqa: S307  a value shown in the README
        except Exception:  # a prose comment
            continue
        assert eval(expr.strip(), namespace) == expected, line  # noqa: S307
        checked += 1
    return checked


# -- the first command -----------------------------------------------------------------------

def test_the_first_command_is_the_demo():
    first = block("## Quick start", "bash").split("#")[0].strip()
    assert first == "./scripts/demo.sh"
    script = (ROOT / "scripts" / "demo.sh").read_text()
    assert script.rstrip().splitlines()[-1].endswith('-m vllm_pcd.demo "$@"')


def test_the_demo_exits_0_and_prints_the_answer_calls_tokens_and_scores(tmp_path):
    """`python -m vllm_pcd.demo` as demo.sh runs it: its own server, its own request."""
    from vllm_pcd.demo import DEMO_SCHEMA

    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    run = subprocess.run([sys.executable, "-m", "vllm_pcd.demo"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    log = tmp_path / "vllm-demo.log"
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:] + (
        log.read_text()[-3000:] if log.exists() else "")
    lines = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
             for line in run.stdout.splitlines() if " : " in line}
    answer = json.loads(lines["answer"])
    assert list(answer) == list(DEMO_SCHEMA["properties"])
    assert lines["calls"].startswith("2 backbone calls")
    # The demo's server reveals cache hits, so the computed count is shown.
    assert re.match(r"computed \d+ \(ideal \d+ = shared \d+ \+ distinct branch \d+\)",
                    lines["tokens"]), lines["tokens"]
    for name, field in DEMO_SCHEMA["properties"].items():
        row = next(line for line in run.stdout.splitlines() if line.strip().startswith(name))
        options = field.get("enum", [True, False])
        assert all(f"{json.dumps(o)}=" in row for o in options), row


def test_the_demo_says_why_it_cannot_show_computed_tokens():
    """A server without --enable-prompt-tokens-details leaves the computed count out of the
    diagnostics (it would reveal cache hits): the demo says so instead of failing."""
    from vllm_pcd.demo import report

    diag = {"backbone_calls": 2, "calibrated": False,
            "tokens": {"shared": 90, "branch": 12, "ideal": 102},
            "fields": {"topic": {"candidates": [{"value": "billing", "probability": 0.9},
                                                {"value": "shipping", "probability": 0.1}],
                                 "margin": 2.2}}}
    lines = report('{"topic":"billing"}', diag, 0.5)
    tokens = next(line for line in lines if line.startswith("tokens"))
    assert "ideal 102 = shared 90 + distinct branch 12" in tokens
    assert "hidden (start the server with --enable-prompt-tokens-details" in tokens
    assert any('"billing"=0.90' in line for line in lines)


# -- the doors, from the README's blocks, on the shared server -------------------------------

def test_the_quick_start_request(pcd_server):
    script = block("Serve any model yourself", "bash")
    lines = script.splitlines()
    serve = [line for line in lines if " vllm serve " in line]
    assert len(serve) == 1 and serve[0].startswith("VLLM_PLUGINS=pcd ")
    # The suite's server stands in for the one the README starts (same plugin and model).
    kept = "\n".join(line for line in lines
                     if line not in serve and not line.startswith("source "))
    run = run_bash(against(kept, pcd_server))
    assert run.returncode == 0, run.stderr[-3000:]
    body = json.loads(run.stdout)
    shown = re.search(r"# choices\[0\]\.message\.content: (\{.*?\})", script).group(1)
    assert json.loads(body["choices"][0]["message"]["content"]) == json.loads(shown)
    assert body["pcd"]["backbone_calls"] == 2


@pytest.fixture(scope="module")
def sdk_namespace(pcd_server):
    """The README's `pcd_schema` example run as written, on the suite's server."""
    code = block("**`pcd_schema` with the OpenAI SDK**", "python")
    assert 'base_url="http://127.0.0.1:8000/v1", api_key="unused"' in code
    code = code.replace('base_url="http://127.0.0.1:8000/v1", api_key="unused"',
                        f'base_url="{pcd_server}/v1", api_key="{API_KEY}"')
    namespace: dict = {}
    exec(compile(code, "README.md (pcd_schema example)", "exec"), namespace)  # noqa: S102
    namespace["checked"] = check_shown_values(code, namespace)
    return namespace


def test_the_sdk_pcd_schema_example(sdk_namespace):
    assert sdk_namespace["checked"] == 1
    assert sdk_namespace["r"].model_extra["pcd"]["backbone_calls"] == 2


def test_the_sdk_parse_example(sdk_namespace):
    code = block("**The SDK's `parse()`**", "python")
    exec(compile(code, "README.md (parse example)", "exec"), sdk_namespace)  # noqa: S102
    assert check_shown_values(code, sdk_namespace) == 1
    assert "pcd" in sdk_namespace["r"].model_extra


def test_the_decisions_example(pcd_server, model_path):
    script = block("**`/v1/decisions`**", "bash")
    run = run_bash(f'MODEL="{model_path}"\n' + against(script, pcd_server))
    assert run.returncode == 0, run.stderr[-3000:]
    answers = json.loads(run.stdout)["answers"]
    assert [a["name"] for a in answers] == ["refund", "team"]
    assert answers[1]["choice"] in ("billing", "tech")


def test_the_offline_example(fp32_llm, model_path, sdk_namespace):
    """The offline block, on the suite's in-process engine in place of `LLM(model_path)`."""
    code = block("**Offline `LLM`**", "python")
    assert "llm = LLM(model_path)" in code
    code = code.replace("llm = LLM(model_path)", "llm = suite_llm")
    namespace = {"suite_llm": fp32_llm, "model_path": str(model_path),
                 "SCHEMA": sdk_namespace["SCHEMA"]}
    exec(compile(code, "README.md (offline example)", "exec"), namespace)  # noqa: S102
    assert set(namespace["result"].object) == set(namespace["SCHEMA"]["properties"])
    assert namespace["result"].diagnostics()["backbone_calls"] == 2
    assert len(namespace["results"]) == 2


def test_the_run_batch_example_writes_a_pcd_batch_file(tmp_path, model_path):
    """The README's batch file is one chat line with a pcd_schema, the kind of line
    tests/server/test_doors.py feeds `vllm run-batch`; the command is the same one."""
    script = block("**`vllm run-batch`**", "bash")
    make, command = script.rsplit("\n", 2)[0], script.rstrip().splitlines()[-1]
    assert command.startswith("VLLM_PLUGINS=pcd vllm run-batch -i batch.jsonl -o answers.jsonl")
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", f'MODEL="{model_path}"\n' + make],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    [line] = map(json.loads, (tmp_path / "batch.jsonl").read_text().splitlines())
    assert line["url"] == "/v1/chat/completions"
    assert line["body"]["model"] == str(model_path)
    assert "pcd_schema" in line["body"]["chat_template_kwargs"]
