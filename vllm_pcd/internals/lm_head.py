"""PCD rows of a batch project the LM head onto their allowed token ids only.

A token-mode branch reads the log-probabilities of a few option tokens, renormalised over
exactly those tokens, so the full-vocabulary projection of its row is wasted work. A request
tagged with allowed ids (`Tags.allowed`) gets, at every position it samples, logits
h · W[ids]ᵀ (+ bias[ids], then the processor's soft cap and scale) from
`vllm_pcd_kernels.project`, written into a float32 row that is -inf everywhere else. vLLM's
log-softmax over that row is the distribution renormalised over the ids, which is what PCD
reports anyway, and a greedy sample is one of them. Untagged rows of the same batch go
through the stock head.

Rows are the V1 model runner's sample positions: one per request of its input batch, in
order, without speculative decoding. The runner is known to the logits processor only while
it executes a step, so prompt log-probabilities and dummy runs keep the stock head. Model
Runner V2, LoRA, speculative decoding, a vocabulary-parallel or quantized head, and
logits-as-input models keep it too, with a warning. `PCD_RESTRICTED_HEAD=0` turns it off.

The projection's arithmetic follows the host (`vllm_pcd_kernels.select_route`: dense, or on a
FlagOS Arm host what its quantized head computes), unless `--additional-config
'{"pcd": {"projection": "dense|w8a8|w4a8"}}'` or env PCD_PROJECTION chooses. The route is
chosen and logged when the model loads, so FLAGGEMS_ARM_Q4_STRICT=1 fails start-up, not a step.

Runs in: the worker process.
Changes: `LogitsProcessor.forward`, `GPUModelRunner.execute_model` and `Worker.load_model`
  project tagged rows onto their allowed ids.
Remove when: vLLM computes a request's logits over a given subset of the vocabulary, and its
  Model Runner V2 does too.
"""

from __future__ import annotations

import contextvars
import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
from vllm.logger import init_logger

from vllm_pcd.compat import require_methods
from vllm_pcd.core.config import pcd_config
from vllm_pcd.internals.tags import allowed_ids
from vllm_pcd.internals.version import adapter

# Under "vllm" so the messages go where vLLM's own do, at its level.
logger = init_logger("vllm.pcd.lm_head")

ENV = "PCD_RESTRICTED_HEAD"
CONFIG_KEY = "projection"  # under additional_config.pcd

# The V1 runner executing the current step, read by the logits processor.
_RUNNER: contextvars.ContextVar[Any] = contextvars.ContextVar("pcd_runner", default=None)


@dataclass
class Stats:
    """What the restricted head did in this process (tests and diagnostics read it)."""

    route: str | None = None  # the kernels route of the last restricted projection
    steps: int = 0            # logits computations with at least one restricted row
    rows: int = 0             # restricted rows in all


STATS = Stats()


def _warn_once(reason: str) -> None:
    logger.warning_once("PCD restricted LM head off (%s): full projection", reason)


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def runner_problem(runner: Any) -> str | None:
    """Why this V1 runner's rows cannot be restricted; None when they can."""
    if runner.speculative_config is not None:
        return "speculative decoding samples several rows per request"
    if runner.lora_config:
        return "LoRA wraps the logits processor"
    return None


def head_problem(processor: Any, lm_head: Any, bias: torch.Tensor | None,
                 skip_gather: bool) -> str | None:
    """Why this head cannot be projected row by row here; None when it can."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    if processor.logits_as_input or skip_gather:
        return "the model computes its own logits"
    rows = processor.org_vocab_size  # the head rows this rank must hold
    if getattr(lm_head, "tp_size", 1) != 1:
        shard = getattr(lm_head, "shard_indices", None)
        if shard is None or shard.num_added_elements:
            return "the tensor-parallel head has no plain vocabulary shards"
        rows = shard.org_vocab_end_index - shard.org_vocab_start_index
    method = getattr(lm_head, "quant_method", None)
    if not isinstance(method, (UnquantizedEmbeddingMethod, UnquantizedLinearMethod)):
        return f"the head is quantized ({type(method).__name__})"
    weight = getattr(lm_head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] < rows:
        return "the head has no dense [vocab, hidden] weight"
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        return f"the logits bias is {tuple(bias.shape)}, not one value per head row"
    return None


def tagged_rows(runner: Any, rows: int, vocab: int) -> tuple[list[int], list[list[int]]]:
    """Restricted rows of this step's logits and each one's ids (row i = request i)."""
    req_ids = runner.input_batch.req_ids
    if len(req_ids) != rows:
        return [], []
    picked, ids = [], []
    for row, req_id in enumerate(req_ids):
        state = runner.requests.get(req_id)
        params = state.sampling_params if state else None
        allowed = allowed_ids(params.extra_args if params is not None else None, vocab)
        if allowed is not None:
            picked.append(row)
            ids.append(list(allowed))
    return picked, ids


def configured_scheme(vllm_config: Any) -> str | None:
    """additional_config.pcd.projection, or None: env PCD_PROJECTION, then the host decide."""
    return pcd_config(getattr(vllm_config, "additional_config", None)).get(CONFIG_KEY)


def configured_route(vllm_config: Any) -> str | None:
    """The route the engine's restricted head serves with this configuration (None when the
    head is switched off): what the response diagnostics report. The engine logs at start-up
    whether its runner can take the head at all."""
    if not enabled():
        return None
    device = torch.device(vllm_config.device_config.device_type)
    return projection_route(device, configured_scheme(vllm_config))


@functools.cache
def projection_route(device: torch.device, scheme: str | None = None) -> str:
    """The route for this device and choice, logged once: the start-up coverage line."""
    from vllm_pcd_kernels import ROUTES, select_route

    route = select_route(device, scheme)
    logger.info("PCD restricted LM head: route %s (%s arithmetic) on %s", route, ROUTES[route],
                device)
    return route


def _allowed_values(lm_head: Any, hidden: torch.Tensor, allowed: torch.Tensor,
                    bias: torch.Tensor | None, route: str) -> tuple[torch.Tensor, str]:
    """[rows, K] float32 logits of the allowed ids. Under tensor parallelism each rank holds
    the head rows of one vocabulary shard: it projects the allowed ids it owns, writes 0 for
    the others, and a sum over the ranks gives every value exactly (each id is owned once).
    No full-vocabulary log-sum-exp is needed: restricted rows are renormalised over their
    allowed ids, which is what PCD reports."""
    from vllm_pcd_kernels import project

    if getattr(lm_head, "tp_size", 1) == 1:
        result = project(hidden, lm_head.weight, allowed, bias, route)
        return result.logits, result.route
    from vllm.distributed import tensor_model_parallel_all_reduce

    values, got = shard_values(lm_head, hidden, allowed, bias, route)
    return tensor_model_parallel_all_reduce(values), got


def shard_values(lm_head: Any, hidden: torch.Tensor, allowed: torch.Tensor,
                 bias: torch.Tensor | None, route: str) -> tuple[torch.Tensor, str]:
    """This rank's share of the allowed logits: its own ids projected, 0 elsewhere."""
    from vllm_pcd_kernels import project

    shard = lm_head.shard_indices
    owned = (allowed >= shard.org_vocab_start_index) & (allowed < shard.org_vocab_end_index)
    local = torch.where(owned, allowed - shard.org_vocab_start_index, 0)
    result = project(hidden, lm_head.weight, local, bias, route)
    return torch.where(owned, result.logits, 0.0), result.route


def _receives_logits(processor: Any, lm_head: Any) -> bool:
    """Whether the stock head gives this rank logits: under tensor parallelism without
    all-gather, only the first rank gets any (the rest receive None)."""
    if getattr(lm_head, "tp_size", 1) == 1 or getattr(processor, "use_all_gather", True):
        return True
    from vllm.distributed import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank() == 0


def restricted_logits(processor: Any, lm_head: Any, hidden: torch.Tensor,
                      bias: torch.Tensor | None, rows: list[int], ids: list[list[int]],
                      stock: Any, scheme: str | None = None) -> torch.Tensor | None:
    """[num_rows, vocab] float32 logits: `rows` projected onto their ids (-inf elsewhere) by
    the route for `scheme`, the others by the stock head over the whole batch, `stock(hidden)`
    (None where it gives this tensor-parallel rank none): a GEMM's rounding depends on its
    shape, so only the same batch keeps a neighbour's logits bit for bit what they are
    without PCD. The allowed logits are rounded to the dtype the
    stock head returns (the model's, or `head_dtype`) before the soft cap and scale, so the
    restricted and unrestricted fields of one request share the stock head's arithmetic."""
    device = hidden.device
    picked = torch.tensor(rows, device=device)
    width = max(map(len, ids))
    # Rows pad with their own last id: repeated ids write the same value.
    allowed = torch.tensor([a + a[-1:] * (width - len(a)) for a in ids], device=device)
    logits, route = _allowed_values(lm_head, hidden[picked], allowed, bias,
                                    projection_route(device, scheme))
    logits = logits.to(getattr(processor, "head_dtype", None) or hidden.dtype).float()
    if processor.soft_cap is not None:
        logits = torch.tanh(logits / processor.soft_cap) * processor.soft_cap
    if processor.scale != 1.0:
        logits = logits * processor.scale
    if not _receives_logits(processor, lm_head):
        return None
    if len(rows) < hidden.shape[0]:  # plain rows share the step
        whole = stock(hidden)
        if whole is None:  # a tensor-parallel rank the stock head gathers nothing to
            return None
        out = whole.float()
        out[picked] = float("-inf")
    else:
        out = torch.full((hidden.shape[0], processor.org_vocab_size), float("-inf"),
                         dtype=torch.float32, device=device)
    out[picked[:, None], allowed] = logits
    STATS.route = route
    STATS.steps += 1
    STATS.rows += len(rows)
    return out


def apply() -> None:
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    require_methods(LogitsProcessor, "forward", patch="lm_head")
    require_methods(GPUModelRunner, "execute_model", patch="lm_head")
    require_methods(Worker, "load_model", patch="lm_head")

    forward = LogitsProcessor.forward
    execute_model = GPUModelRunner.execute_model
    load_model = Worker.load_model

    def choose(self: Any, lm_head: Any, hidden_states: torch.Tensor,
               embedding_bias: torch.Tensor | None, skip_gather: bool,
               stock: Any) -> torch.Tensor | None:
        """The restricted head for PCD's rows where it applies; `stock` everywhere else."""
        runner = _RUNNER.get()
        if runner is None or type(self) is not LogitsProcessor or hidden_states.dim() != 2 \
                or not enabled():
            return stock(hidden_states)
        rows, ids = tagged_rows(runner, hidden_states.shape[0], self.org_vocab_size)
        if not rows:
            return stock(hidden_states)
        problem = head_problem(self, lm_head, embedding_bias, skip_gather)
        if problem is not None:
            _warn_once(problem)
            return stock(hidden_states)
        return restricted_logits(self, lm_head, hidden_states, embedding_bias, rows, ids,
                                 stock, configured_scheme(runner.vllm_config))

    @functools.wraps(execute_model)
    def execute_model_tracked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if runner_problem(self) is not None:
            return execute_model(self, *args, **kwargs)
        token = _RUNNER.set(self)
        try:
            return execute_model(self, *args, **kwargs)
        finally:
            _RUNNER.reset(token)

    @functools.wraps(load_model)
    def load_model_checked(self: Any, *args: Any, **kwargs: Any) -> None:
        load_model(self, *args, **kwargs)
        runner = self.model_runner
        if not isinstance(runner, GPUModelRunner):
            _warn_once(f"{type(runner).__module__} (Model Runner V2) is not patched; "
                       "VLLM_USE_V2_MODEL_RUNNER=0 selects the V1 runner")
        elif (problem := runner_problem(runner)) is not None:
            _warn_once(problem)
        elif enabled():
            projection_route(runner.device, configured_scheme(self.vllm_config))

    LogitsProcessor.forward = adapter().logits_forward(forward, choose)
    GPUModelRunner.execute_model = execute_model_tracked
    Worker.load_model = load_model_checked
