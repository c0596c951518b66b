"""GPU check of the Triton routes: compile, compare with PyTorch, time against the full head.

    python -m benchmarks.gpu_projection_check          # from the repository root, ~1 minute

1. dense "triton" vs a float64 reference for fp32/bf16/fp16 weights, hidden 576/896/1536/2560,
   K 1..256 (repeated ids), shared and per-row ids, with and without bias;
2. "w4a8-triton" vs "w4a8-torch" (the reference arithmetic, same device): bit-identical, as
   kernels/vllm_pcd_kernels/triton_w4a8.py is built to be (IEEE steps in the same order, no FMA
   contraction);
3. times: full projection (h·Wᵀ in BF16 over the vocabulary, then the allowed columns) vs
   project(route="triton") end to end and the bare kernel;
4. where vLLM is installed (and `--model`, default the provisioned SmolLM2, exists): serves
   `VLLM_PLUGINS=pcd vllm serve` on vLLM's default runner choice and checks that a PCD
   answer's measured diagnostics say its requests were restricted on the triton route (PCD
   asks vLLM for the V1 runner on GPUs: vllm_pcd/internals/runner.py), and that an 8-field
   call over a long context computes exactly its ideal tokens (the fork); on whichever
   supported vLLM is installed, so a GPU host with 0.33 runs its adapter's served path;
5. the release's own question on this GPU (unless `--skip-minicpm5`): the MiniCPM5-2B
   stand-in (42 layers, random weights, written if missing with the default model's
   tokenizer: `vllm_pcd.standin`) served, PCD against AR JSON and the floor at 3, 8 and 32
   fields, cold (`benchmarks.bench_minicpm5`, results in docs/results/minicpm5-shape-gpu.json
   beside the CPU's);
then one summary line. Exits 0 when every check that could run passed, 1 when one failed, 2
when there is no CUDA device.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import torch

from vllm_pcd_kernels import project


def reference(h, w, allowed, bias):
    full = h.to(w.dtype).double() @ w.double().T
    if bias is not None:
        full = full + bias.double()
    return full[:, allowed] if allowed.dim() == 1 else full.gather(1, allowed)


def check_dense(dev) -> bool:
    ok = True
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        worst = 0.0
        for hidden in (576, 896, 1536, 2560):
            w = (torch.randn(32000, hidden, device=dev) / hidden ** 0.5).to(dtype)
            bias = torch.randn(32000, device=dev).to(dtype)
            for batch in (1, 32):
                h = torch.randn(batch, hidden, device=dev)
                for k in (1, 2, 7, 32, 256):
                    for shape in ((k,), (batch, k)):
                        allowed = torch.randint(0, 32000, shape, device=dev)
                        allowed[..., -1] = allowed[..., 0]
                        b = bias if k == 7 else None
                        got = project(h, w, allowed, b, route="triton")
                        assert got.route == "triton" and got.logits.dtype == torch.float32
                        err = (got.logits.double() - reference(h, w, allowed, b)).abs().max()
                        worst = max(worst, err.item())
        passed = worst < 1e-3  # fp32 sums of O(1) terms; a tile-order change moves ~1e-6
        ok &= passed
        print(f"dense triton {str(dtype):>15}: max |err| vs float64 {worst:.2e} "
              f"{'ok' if passed else 'FAIL'}")
    return ok


def check_w4a8(dev) -> bool:
    worst, same, total = 0.0, 0, 0
    for hidden in (576, 896, 2560):
        w = (torch.randn(8000, hidden, device=dev) / hidden ** 0.5).bfloat16()
        for batch, k in ((1, 7), (32, 32), (8, 256)):
            h = torch.randn(batch, hidden, device=dev)
            allowed = torch.randint(0, 8000, (batch, k), device=dev)
            got = project(h, w, allowed, route="w4a8-triton")
            want = project(h, w, allowed, route="w4a8-torch").logits
            assert got.route == "w4a8-triton"
            worst = max(worst, (got.logits - want).abs().max().item())
            same += (got.logits == want).sum().item()
            total += want.numel()
    passed = same == total
    print(f"w4a8 triton vs torch: max |diff| {worst:.2e}, bit-identical {same}/{total} "
          f"{'ok' if passed else 'FAIL'}")
    return passed


def cuda_ms(fn, reps=100) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def timings(dev) -> None:
    from vllm_pcd_kernels.triton_projection import gathered_projection
    print(f"{'vocab':>6} {'hidden':>6} {'batch':>5} {'K':>4} {'full ms':>8} {'project ms':>10} "
          f"{'kernel ms':>9} {'full/kernel':>11}")
    for vocab in (49152, 73448, 151936):
        for hidden in (576, 2560):
            w = (torch.randn(vocab, hidden, device=dev) / hidden ** 0.5).bfloat16()
            for batch in (1, 32):
                h = torch.randn(batch, hidden, device=dev)
                for k in (2, 8, 32, 256):
                    allowed = torch.randint(0, vocab, (batch, k), device=dev)
                    full = cuda_ms(lambda: (h.bfloat16() @ w.T).gather(1, allowed))
                    routed = cuda_ms(lambda: project(h, w, allowed, route="triton"))
                    kernel = cuda_ms(lambda: gathered_projection(h, w, allowed))
                    print(f"{vocab:>6} {hidden:>6} {batch:>5} {k:>4} {full:>8.4f} "
                          f"{routed:>10.4f} {kernel:>9.4f} {full / kernel:>11.1f}", flush=True)


def check_served(model: Path) -> bool | None:
    """PCD requests on a real GPU server, on the vLLM installed (the adapter `compat` picks
    for it, 0.33's included): restricted on the Triton route, and forked exactly (a long
    shared context, fresh cache salt: the tokens computed equal the ideal). None when vLLM or
    the model is not here."""
    if importlib.util.find_spec("vllm") is None or not (model / "config.json").exists():
        print(f"served check skipped: needs vLLM installed and a model at {model}")
        return None
    import httpx

    from vllm_pcd.compat import adapter_name, vllm_version
    from vllm_pcd.launch import serve

    print(f"served check: vLLM {vllm_version()}, adapter {adapter_name()}")
    schema = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
              "properties": {"a": {"enum": ["x", "y", "z"]}, "b": {"type": "boolean"}}}
    many = {"type": "object", "additionalProperties": False,
            "required": [f"f{i}" for i in range(8)],
            "properties": {f"f{i}": {"type": "boolean"} for i in range(8)}}
    text = " ".join(f"Sentence {i} of a long shared document about item {i % 7}."
                    for i in range(60))
    # the computed tokens are shown only where vLLM reveals cache hits
    with serve(model, args=["--max-model-len", "4096", "--enable-prompt-tokens-details"],
               log_path="gpu-serve.log") as url:
        name = httpx.get(url + "/v1/models").json()["data"][0]["id"]

        def pcd(message: str, fields: dict, **kwargs: str) -> dict:
            body = {"model": name, "messages": [{"role": "user", "content": message}],
                    "chat_template_kwargs": {"pcd_schema": fields, **kwargs},
                    "cache_salt": f"gpu-check-{time.time_ns()}"}
            return httpx.post(url + "/v1/chat/completions", json=body, timeout=300).json()["pcd"]

        projection = pcd("Pick one.", schema, pcd_formulation="codes")["projection"]
        tokens = pcd(text, many)["tokens"]
    restricted = (projection["route"] == "triton" and projection["restricted_requests"] == 2
                  and projection["fallbacks"] == 0)
    forked = tokens["computed"] == tokens["ideal"]
    print(f"served PCD request: projection {projection} {'ok' if restricted else 'FAIL'}")
    print(f"served fork, 8 fields: tokens {tokens} {'ok' if forked else 'FAIL'}")
    return restricted and forked


def check_minicpm5() -> bool | None:
    """The stand-in served on this GPU, measured as the CPU measures it (no throughput cells:
    the cold latencies are the release's comparison). None when it cannot be written here
    (its tokenizer comes from the default model, which a host without the registry lacks)."""
    from benchmarks import bench_minicpm5
    from vllm_pcd.models import minicpm5_shape

    try:
        minicpm5_shape()
    except Exception as err:  # no default model to take the tokenizer from, no disk
        print(f"MiniCPM5-2B stand-in skipped: it cannot be written here ({err})")
        return None
    results = bench_minicpm5.main(["--fields", "3", "8", "32", "--reps", "3",
                                   "--throughput-fields", "--head-reps", "5",
                                   "--out", "docs/results/minicpm5-shape-gpu.json"])
    latency = [r for r in results["rows"] if r["table"] == "latency"]
    return bool(latency) and all(r["pcd_token_s"] and r["ar_json_s"] for r in latency)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_projection_check")
    parser.add_argument("--model", type=Path, default=None,
                        help="model for the served check (default: the provisioned SmolLM2)")
    parser.add_argument("--skip-minicpm5", action="store_true",
                        help="leave out serving the 42-layer MiniCPM5-2B stand-in "
                             "(benchmarks.bench_minicpm5, docs/results/minicpm5-shape-gpu.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU (the CPU tests run the same kernels "
              "under TRITON_INTERPRET=1: pytest tests/engine/test_kernels.py "
              "tests/engine/test_w4a8.py)")
        return 2
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    torch.manual_seed(0)
    with torch.inference_mode():
        results = {"dense": check_dense(dev), "w4a8": check_w4a8(dev)}
        timings(dev)
    if args.model is None:
        from vllm_pcd.models import default_model_path

        args.model = default_model_path()
    results["served"] = check_served(args.model)
    if not args.skip_minicpm5:
        results["minicpm5"] = check_minicpm5()
    failed = [k for k, v in results.items() if v is False]
    print("summary: " + ", ".join(f"{k} {'skipped' if v is None else 'ok' if v else 'FAIL'}"
                                  for k, v in results.items())
          + (f" -> FAILED: {failed}" if failed else " -> all that ran passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
