"""PCD's engine runs the V1 model runner, the one its restricted LM head patches.

vLLM 0.32 picks Model Runner V2 by default wherever Triton has a GPU driver, i.e. on every
ordinary CUDA host, and V2 computes logits on its own path. PCD's restricted head patches V1
only (V2 cannot run without a GPU driver, so a V2 adapter could not be tested on CPU), so when
PCD is on and the user did not choose a runner, vLLM is asked for V1, which 0.32 still
supports on GPUs, and the choice is logged once. A user who sets
`VLLM_USE_V2_MODEL_RUNNER=1` keeps V2; PCD then answers with the full head, and every answer's
`projection.fallbacks` says so. Features that need V2 (they override the variable in vLLM
itself) keep it the same way.

Runs in: every process that builds vLLM's configuration (API server, engine core).
Changes: the default of `VLLM_USE_V2_MODEL_RUNNER` when PCD is on and the user chose none.
Remove when: the restricted head (`lm_head`) patches Model Runner V2.
"""

from __future__ import annotations

import functools
import os
from typing import Any

ENV = "VLLM_USE_V2_MODEL_RUNNER"


def choose_v1(stock_picks_v2: bool, user_choice: str | None) -> bool:
    """Whether PCD asks for V1 instead of the runner vLLM would pick."""
    return stock_picks_v2 and user_choice is None


def patch_runner_choice(config_cls: Any, log: Any) -> None:
    """Wrap `config_cls.use_v2_model_runner` (a property) with PCD's choice."""
    stock = config_cls.use_v2_model_runner.fget

    @functools.wraps(stock)
    def use_v2_model_runner(self: Any) -> bool:
        picks_v2 = stock(self)
        if choose_v1(picks_v2, os.environ.get(ENV)):
            log("vllm-pcd runs Model Runner V1, the runner its restricted LM head patches "
                f"({ENV}=1 keeps V2, with the full head)")
            return False
        return picks_v2

    config_cls.use_v2_model_runner = property(use_v2_model_runner)


def apply() -> None:
    from vllm.config import VllmConfig
    from vllm.logger import init_logger

    if not isinstance(getattr(VllmConfig, "use_v2_model_runner", None), property):
        from vllm_pcd.compat import UnsupportedVLLMVersion

        raise UnsupportedVLLMVersion("vllm-pcd runner: VllmConfig.use_v2_model_runner is not "
                                     "a property; this vLLM is not the one it was written for")
    patch_runner_choice(VllmConfig, init_logger("vllm.pcd.runner").info_once)
