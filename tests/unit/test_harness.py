"""The benchmark harness starts its server as the operator asked: an operator's own `vllm
serve` flags reach the command line, and the results say they were there."""

import contextlib

from benchmarks import harness
from benchmarks.methods import SERVER_ARGS


def test_server_flags_reach_vllm_serve_and_the_serving_note(monkeypatch, tmp_path):
    started = []

    @contextlib.contextmanager
    def fake_serve(model, *, args, kv_cache_gib, log_path):
        started.append(tuple(args))
        yield "http://127.0.0.1:1"

    monkeypatch.setattr("vllm_pcd.launch.serve", fake_serve)
    args = harness.server_parser("x", "doc", "quick").parse_args(
        ["--server-flags", "--block-size 32 --max-num-seqs '64'", "--model", "m",
         "--out", str(tmp_path / "r")])

    async def run(_args, url, serving):
        return {"url": url, "serving": serving}

    results = harness.run_on_server(args, run)
    assert started == [(*SERVER_ARGS, "--block-size", "32", "--max-num-seqs", "64")]
    assert results["serving"].endswith("with --block-size 32 --max-num-seqs '64'")

    attached = harness.server_parser("x", "doc", "quick").parse_args(
        ["--url", "http://h:2", "--server-flags", "--block-size 32", "--out", str(tmp_path / "a")])
    assert harness.run_on_server(attached, run)["url"] == "http://h:2" and len(started) == 1


def test_serving_note_names_the_dtype_the_server_was_started_in():
    fast = harness.fast_dtype()
    other = "float32" if fast != "float32" else "bfloat16"
    assert harness.serving_note(None, "").startswith(f"serving {fast} (the faster dtype")
    assert harness.serving_note(None, "", dtype=fast).startswith(f"serving {fast} (the faster")
    named = harness.serving_note(None, "--block-size 32", dtype=other)
    assert named.startswith(f"serving {other}, named") and named.endswith("with --block-size 32")
    assert harness.serving_note("http://h:2", "", dtype=other).startswith("attached to http://h:2")
