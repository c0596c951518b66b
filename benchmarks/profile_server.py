"""Where a multiprocess server's time goes under PCD load: py-spy on each of its processes.

    python -m benchmarks.profile_server [--model PATH] [--fields 32] [--concurrency 1]
                                        [--warmup 15] [--seconds 30]

Starts one `vllm serve` with the benchmarks' flags (or attaches, `--url`), loads it with
`bench_throughput`'s PCD calls (one tenant's cache salt, so the field list is cached) at the
given concurrency, and after `--warmup` seconds samples the API server, the engine core and
the worker with `py-spy record --format raw` (py-spy is on the package registry: `pip install
py-spy`) for `--seconds`. Prints, per process, how busy it was, named shares of its samples,
and its busy time per engine request finished in the window (from the server's /metrics).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.harness import add_server_flags, provenance, server
from vllm_pcd.models import default_model_path

RATE = 50  # py-spy samples a second

# The frame where the worker waits for work and the engine core for the worker's reply: its
# samples are spinning, not work (the API server's idle samples py-spy leaves out itself).
WAITING = "MessageQueue.dequeue"

# Stack frames (substrings of py-spy's raw stacks) named by what they do.
SHARES = {
    "worker": {"idle (waiting for work)": WAITING,
               "model forward": "_model_forward",
               "CPU attention": "cpu_attention_with_kv_cache",
               "logits": "compute_logits",
               "PCD block copies": "copy_blocks",
               "vLLM block copies": "copy_kv_cache_blocks_inplace",
               "sampler": "sample_tokens"},
    "engine core": {"waiting for the worker": WAITING,
                    "scheduling": "Scheduler.schedule",
                    "update_from_output": "update_from_output"},
    "API server": {"PCD planning": "build_plan",
                   "tokenization": "_encode_plus",
                   "schema check": "check_schema",
                   "adding engine requests": "add_request",
                   "output handling": "output_handler",
                   "HTTP": "uvicorn"},
}


def server_processes(port: int) -> dict[str, int]:
    """The API server listening on `port`, and its engine core and worker."""
    import psutil

    def cmdline(process: psutil.Process) -> str:
        try:
            return " ".join(process.cmdline())
        except psutil.Error:
            return ""

    [api] = [p for p in psutil.process_iter()
             if " serve " in cmdline(p) and f"--port {port}" in cmdline(p)]
    found = {"API server": api.pid}
    for child in api.children(recursive=True):
        for name, title in (("engine core", "VLLM::EngineCore"), ("worker", "VLLM::Worker")):
            if title in cmdline(child):  # the process title vLLM sets
                found.setdefault(name, child.pid)
    return found


def finished_requests(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(float(m) for m in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)",
                                            text, re.M))


def record(pid: int, seconds: int, out: Path) -> subprocess.Popen:
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        raise SystemExit("py-spy is not installed in this environment: pip install py-spy")
    return subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate", str(RATE),
                             "--duration", str(seconds), "--format", "raw", "--nonblocking",
                             "-o", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stacks(path: Path) -> list[tuple[str, int]]:
    rows = [line.rstrip().rpartition(" ") for line in path.read_text().splitlines() if line]
    return [(stack, int(count)) for stack, _, count in rows]


def report(name: str, path: Path, seconds: int, requests: float) -> None:
    rows = stacks(path)
    samples = sum(count for _, count in rows)
    idle = sum(count for stack, count in rows if WAITING in stack)
    busy_s = (samples - idle) / RATE
    print(f"{name}: {samples} samples of {RATE * seconds}, busy {busy_s:.1f} s of {seconds} s, "
          f"{1e3 * busy_s / max(requests, 1):.2f} ms busy per engine request")
    for label, frame in SHARES[name].items():
        share = sum(count for stack, count in rows if frame in stack) / max(samples, 1)
        print(f"  {label:26s} {100 * share:5.1f}%")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_server",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="attach to a running server on this machine")
    add_server_flags(parser)
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--fields", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--seconds", type=int, default=30)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pcd-profile-"))
    with server(args.url, args.model, work / "server.log", flags=args.server_flags) as url:
        port = int(url.rsplit(":", 1)[1])
        load = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_throughput", "--url", url, "--model",
             args.model, "--fields", str(args.fields), "--concurrency", str(args.concurrency),
             "--docs", "1000", "--sequential-docs", "1000",
             "--rows", "pcd_token@schema_first", "--out", str(work / "load")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[1])
        try:
            time.sleep(args.warmup)
            before = finished_requests(url)
            spies = {name: record(pid, args.seconds, work / f"{name}.txt")
                     for name, pid in server_processes(port).items()}
            for spy in spies.values():
                spy.wait()
            requests = finished_requests(url) - before
        finally:
            load.kill()
    print(f"commit {provenance()['commit']}; {args.fields} fields, {args.concurrency} "
          f"client(s); {requests:.0f} engine requests finished in the {args.seconds} s window")
    for name in spies:
        report(name, work / f"{name}.txt", args.seconds, requests)


if __name__ == "__main__":
    main()
