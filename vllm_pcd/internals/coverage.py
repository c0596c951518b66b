"""How much of the loaded model runs the W4A8-G128 scheme, counted as FlagOS' acceptance check
counts it, and which route PCD's restricted LM head takes.

Each body linear vLLM built (a Llama layer has four: the fused qkv, o, the fused gate-up and
down) either runs compressed-tensors' W4A8 int scheme (`CompressedTensorsW4A8Int`) at group
size 128, or falls back to something else: unquantized, another scheme, another group size.
The embedding and the head are no body linears; the head's weight and PCD's route over it are
reported beside the counts. One line is logged when the model loads (`PCD coverage: …`), and
`additional_config.pcd.strict_coverage` refuses to start on any fallback, or on a head PCD
cannot project row by row.

Runs in: the worker process.
Changes: `Worker.load_model` counts the body linears' schemes once the model is loaded.
Remove when: vLLM reports, and can require, its quantization coverage at load.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

from vllm.logger import init_logger

from vllm_pcd.compat import require_methods
from vllm_pcd.core.config import pcd_config
from vllm_pcd.internals import lm_head

logger = init_logger("vllm.pcd.coverage")

W4A8_G128 = "W4A8-G128"
GROUP_SIZE = 128
CONFIG_KEY = "strict_coverage"  # under additional_config.pcd


class CoverageError(RuntimeError):
    pass


@dataclass(frozen=True)
class Coverage:
    w4a8_g128: int                # body linears on CompressedTensorsW4A8Int, group 128
    fallbacks: dict[str, int]     # the other body linears, by what they run
    kernels: dict[str, int]       # the kernels the W4A8-G128 linears run
    head: str                     # the head's weight dtype and method
    head_route: str | None        # PCD's restricted-head route; None when PCD cannot take it
    head_problem: str | None      # why it cannot

    @property
    def fallback(self) -> int:
        return sum(self.fallbacks.values())

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fallback": self.fallback}

    def line(self) -> str:
        linears = self.w4a8_g128 + self.fallback
        kernels = ", ".join(f"{k} x{n}" for k, n in sorted(self.kernels.items())) or "none"
        fallbacks = ", ".join(f"{k} x{n}" for k, n in sorted(self.fallbacks.items()))
        route = self.head_route or f"stock ({self.head_problem})"
        return (f"{self.w4a8_g128} of {linears} body linears run {W4A8_G128} (kernels: "
                f"{kernels}), {self.fallback} fall back{f' ({fallbacks})' if fallbacks else ''}; "
                f"LM head {self.head}, PCD restricted route {route}")


def runs(layer: Any) -> str:
    """What a linear layer runs: W4A8_G128, or its scheme (with its group size) or method."""
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
        CompressedTensorsW4A8Int)

    scheme = getattr(layer, "scheme", None)
    if scheme is None:
        return type(layer.quant_method).__name__
    group = getattr(scheme, "group_size", None)
    if isinstance(scheme, CompressedTensorsW4A8Int) and group == GROUP_SIZE:
        return W4A8_G128
    return type(scheme).__name__ + (f" group {group}" if group is not None else "")


def count(runner: Any, vllm_config: Any) -> Coverage:
    """The coverage of the model this runner loaded."""
    from vllm.model_executor.layers.linear import LinearBase

    model = runner.get_model()
    w4a8, fallbacks, kernels = 0, {}, {}
    for module in model.modules():
        if not isinstance(module, LinearBase):
            continue
        what = runs(module)
        if what == W4A8_G128:
            w4a8 += 1
            kernel = type(module.scheme.kernel).__name__
            kernels[kernel] = kernels.get(kernel, 0) + 1
        else:
            fallbacks[what] = fallbacks.get(what, 0) + 1
    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    described = (f"{str(getattr(weight, 'dtype', 'no weight')).removeprefix('torch.')} "
                 f"({type(getattr(head, 'quant_method', None)).__name__})")
    problem = _head_problem(runner, model, head)
    route = lm_head.configured_route(vllm_config) if problem is None else None
    if problem is None and route is None:
        problem = f"{lm_head.ENV}=0"
    return Coverage(w4a8, fallbacks, kernels, described, route, problem)


def _head_problem(runner: Any, model: Any, head: Any) -> str | None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    processor = getattr(model, "logits_processor", None)
    if head is None or processor is None:
        return "the model has no lm_head or logits processor"
    if not isinstance(runner, GPUModelRunner):
        return f"{type(runner).__module__} (Model Runner V2) is not patched"
    return lm_head.runner_problem(runner) or lm_head.head_problem(processor, head, None, False)


def strict(vllm_config: Any) -> bool:
    return bool(pcd_config(getattr(vllm_config, "additional_config", None)).get(CONFIG_KEY))


def check(runner: Any, vllm_config: Any) -> Coverage:
    """Count, log the start-up line, and in strict mode refuse a fallback."""
    coverage = count(runner, vllm_config)
    logger.info("PCD coverage: %s", coverage.line())
    if strict(vllm_config) and (coverage.fallback or coverage.head_route is None):
        raise CoverageError(f"additional_config.pcd.{CONFIG_KEY}: every body linear must run "
                            f"{W4A8_G128} and PCD must project the LM head; {coverage.line()}")
    return coverage


def apply() -> None:
    from vllm.v1.worker.gpu_worker import Worker

    require_methods(Worker, "load_model", patch="coverage")
    load_model = Worker.load_model

    @functools.wraps(load_model)
    def load_model_counted(self: Any, *args: Any, **kwargs: Any) -> None:
        load_model(self, *args, **kwargs)
        check(self.model_runner, self.vllm_config)

    Worker.load_model = load_model_counted
