"""`vllm.general_plugins` entry: runs in every vLLM process (API server, engine core, worker).

It refuses an untested vLLM version, then installs the engine-side changes PCD relies on.
"""

from __future__ import annotations

from vllm_pcd import internals


def register() -> None:
    internals.apply()
