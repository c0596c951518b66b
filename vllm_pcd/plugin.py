"""`vllm.general_plugins` entry: runs in every vLLM process (API server, engine core, worker).

It refuses an untested vLLM version before any request is served.
"""

from __future__ import annotations

from vllm_pcd.compat import check_vllm_version


def register() -> None:
    check_vllm_version()
