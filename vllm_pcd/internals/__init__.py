"""Every change this plugin makes to vLLM internals, in one package.

`apply()` checks the vLLM version first and refuses an untested one; each module below
patches one concern and is written against the versions in `vllm_pcd.compat`.
- `admission`: a PCD request's branches enter the scheduler together (one backbone call).
- `fork`: branches reuse the shared context's KV at its exact length (partial block copied).
"""

from __future__ import annotations

from vllm_pcd.compat import check_vllm_version

_applied = False


def apply() -> None:
    """Idempotent: the plugin entry may run more than once in a process."""
    global _applied
    if _applied:
        return
    check_vllm_version()
    from vllm_pcd.internals import admission, fork

    admission.apply()
    fork.apply()
    _applied = True
