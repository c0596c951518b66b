"""Start `vllm serve` with the plugin as a subprocess on loopback, and wait until it answers.

Used by the demo, the end-to-end tests and the benchmarks, so all three run the server the
way a user does: the `vllm` command with `VLLM_PLUGINS=pcd`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vllm_command() -> str:
    """The `vllm` script beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("vllm")
    found = str(beside) if beside.exists() else shutil.which("vllm")
    if found is None:
        raise RuntimeError("the `vllm` command is not installed; run scripts/setup.sh")
    return found


@contextlib.contextmanager
def serve(model: str | os.PathLike, *, args: Sequence[str] = (), plugins: str | None = "pcd",
          port: int | None = None, kv_cache_gib: int = 2, log_path: str | os.PathLike | None = None,
          timeout_s: float = 900, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run `vllm serve MODEL` and yield its base URL (`http://127.0.0.1:PORT`)."""
    port = port or free_port()
    child_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
    # Run as `vllm serve` runs for users, whatever an in-process engine in this process set.
    for name in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        child_env.pop(name, None)
    child_env.update(env or {})
    if plugins is not None:
        child_env["VLLM_PLUGINS"] = plugins
    command = [vllm_command(), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
               *args]
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(command, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, timeout_s)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if log is not subprocess.DEVNULL:
            log.close()


def _wait_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited with code {process.returncode} before "
                               "becoming healthy (see its log)")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"vllm serve did not become healthy within {timeout_s:.0f} s")
