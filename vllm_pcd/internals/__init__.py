"""Every change this plugin makes to vLLM internals, in one package.

`apply()` checks the vLLM version first and refuses an untested one; each module below
patches one concern and is written against the versions in `vllm_pcd.compat`.
- `validation`: the API server verifies each request's PCD tag as vLLM validates it.
- `handler`: vLLM's chat handler answers PCD requests (every door that calls it); other
  doors refuse `pcd_schema`.
- `intake`: the engine core verifies each request's PCD tag (`tags`) as it arrives.
- `admission`: a PCD request's branches enter the scheduler together (one backbone call).
- `fork`: branches reuse the shared context's KV at its exact length (partial block copied).
- `lm_head`: PCD rows project the LM head onto their allowed token ids only.
- `coverage`: counts the body linears on the W4A8-G128 scheme and the head's route at load,
  and refuses a fallback in strict mode.
- `sampler`: a batch mixing exact-id and top-k log-probabilities keeps each row's own.
- `runner`: the engine runs the model runner `lm_head` patches (V1) unless told otherwise.
- `entry_points`: attaches the serving layer to `vllm run-batch` and, where vLLM has no
  endpoint plugins, to the API server.
- `errors`: which engine errors are the client's.
- `version`: what differs between the supported vLLMs, one package per version (`v0_24`,
  `v0_32`, `v0_33`) behind one interface, chosen once from `compat`.
"""

from __future__ import annotations

from vllm_pcd.internals.version import adapter

_applied = False


def active() -> bool:
    """Whether this process runs with PCD's engine patches (the plugin was asked for, on a
    supported vLLM)."""
    return _applied


def apply() -> None:
    """Idempotent: the plugin entry may run more than once in a process."""
    global _applied
    if _applied:
        return
    adapter()  # refuses a vLLM without an adapter before anything is patched
    from vllm_pcd.internals import (admission, coverage, fork, handler, intake, lm_head, runner,
                                    sampler, tags, validation)

    tags.channel_key()  # generated here, before vLLM spawns the processes that inherit it
    intake.apply()
    validation.apply()
    handler.refuse_stray_schema()
    admission.apply()
    fork.apply()  # where the adapter says it is off, that is said at start-up
    lm_head.apply()
    coverage.apply()  # after lm_head: its line follows the head's route line
    runner.apply()
    sampler.apply()
    _applied = True
