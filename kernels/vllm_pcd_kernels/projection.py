"""LM head projected only onto the allowed token ids: logits = h · W[allowed]ᵀ (+ bias[allowed]).

A PCD row needs the logits of a few option codes, not of the whole vocabulary, so the
projection gathers those rows of the head and skips the rest. `project` checks the inputs,
picks a route (see `select_route`) and reports which one ran.

Routes (`ProjectionResult.route`):
  torch                   dense, PyTorch gather + matmul, any device (the CPU path)
  triton                  dense, our Triton kernel on CUDA tensors
  triton-interpret        the same kernel on CPU tensors, only when TRITON_INTERPRET=1 is set
                          and the caller asked for route="triton" (tests)
  w8a8-torch              int8 per-row weights x int8 per-token activations, PyTorch reference
  w4a8-torch              int4 group-128 weights x int8 activations, PyTorch reference
  w4a8-triton             the same arithmetic in Triton (CUDA; "-interpret" as above)
  w4a8-flaggems           FlagGems' packed W4A8-G128 kernel on an AArch64 FlagOS host
"""

from __future__ import annotations

import os
import platform
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

import vllm_pcd_kernels.w4a8 as w4a8

SCHEMES = ("dense", "w8a8", "w4a8")
ROUTES = {  # a route a caller may ask for -> the arithmetic it computes
    "torch": "dense",
    "triton": "dense",
    "w8a8-torch": "w8a8",
    "w4a8-torch": "w4a8",
    "w4a8-triton": "w4a8",
    "w4a8-flaggems": "w4a8",
}
_FALLBACK = {"triton": "torch", "w4a8-triton": "w4a8-torch", "w4a8-flaggems": "w4a8-torch"}


@dataclass(frozen=True)
class ProjectionResult:
    logits: Tensor  # float32 [B, K]
    route: str


@dataclass(frozen=True, eq=False)
class HeadRows:
    """Rows of the LM head copied out before FlagOS empties the BF16 weight.

    With FLAGGEMS_RELEASE_BF16_LM_HEAD=1 vLLM-FL replaces lm_head.weight with an empty
    tensor once its quantized copy is packed; a snapshot of the option-code rows taken at load
    keeps the restricted projection exact without keeping the whole head.
    """

    ids: Tensor  # int64 [M], sorted, unique
    rows: Tensor  # [M, H]
    vocab_size: int

    def local(self, allowed: Tensor) -> Tensor:
        """Positions of `allowed` ids among the snapshot rows; refuses ids it does not hold."""
        pos = torch.searchsorted(self.ids, allowed).clamp_(max=len(self.ids) - 1)
        missing = self.ids[pos] != allowed
        if bool(missing.any()):
            raise ValueError(f"token ids {allowed[missing].unique().tolist()[:8]} are not in the "
                             "head snapshot; snapshot every option code before the release")
        return pos


def snapshot_rows(weight: Tensor, ids: Tensor | list[int]) -> HeadRows:
    """Copy the rows `ids` of a (still full) head weight [V, H]."""
    _require_weight(weight)
    ids = torch.as_tensor(ids, dtype=torch.long, device=weight.device).unique()
    if ids.numel() == 0:
        raise ValueError("a head snapshot needs at least one token id")
    _check_range(ids, weight.shape[0])
    return HeadRows(ids, weight.index_select(0, ids), weight.shape[0])


def head_for_projection(weight: Tensor, quantized: w4a8.QuantizedHead | HeadRows | None = None
                        ) -> Tensor | w4a8.QuantizedHead | HeadRows:
    """What to project with: the BF16 head while it exists, else the copy kept for it."""
    if weight.numel():
        return weight
    if quantized is None:
        _require_weight(weight)
    return quantized


def _require_weight(weight: Tensor) -> None:
    if weight.numel() == 0:
        raise ValueError(
            "lm_head.weight is empty (FlagOS released it: FLAGGEMS_RELEASE_BF16_LM_HEAD=1); "
            "pass a QuantizedHead (vllm_pcd_kernels.quantize_head) or a HeadRows snapshot "
            "(vllm_pcd_kernels.snapshot_rows) taken before the release")


def _check_range(ids: Tensor, vocab: int) -> None:
    lo, hi = (int(x) for x in torch.aminmax(ids))
    if lo < 0 or hi >= vocab:
        raise ValueError(f"allowed token ids must lie in [0, {vocab}); got min {lo}, max {hi}")


# ---------------------------------------------------------------------------- route selection

def flagos_host() -> bool:
    """An AArch64 host told to run FlagGems' Arm backend."""
    return (platform.machine().lower() in ("aarch64", "arm64")
            and os.environ.get("FLAGGEMS_VENDOR", "").lower() == "arm")


def strict_mode() -> bool:
    """FlagGems' reading of FLAGGEMS_ARM_Q4_STRICT: strict unless "0", and unset means strict
    on a FlagOS host (its default); elsewhere unset means lenient."""
    value = os.environ.get("FLAGGEMS_ARM_Q4_STRICT")
    if value is None:
        return flagos_host()
    return value.strip() != "0"


def _cannot_run(route: str, device: torch.device) -> str | None:
    """Why `route` cannot run for tensors on `device`, or None when it can."""
    if route in ("triton", "w4a8-triton"):
        if device.type != "cuda":
            return f"needs CUDA tensors, got {device.type}"
        try:
            import triton  # noqa: F401
        except ImportError as exc:
            return f"triton does not import: {exc}"
    if route == "w4a8-flaggems":
        if not flagos_host():
            return "needs an AArch64 host with FLAGGEMS_VENDOR=arm"
        if device.type != "cpu":
            return "FlagGems' Arm W4A8 kernel runs on CPU tensors only"
        return w4a8.flaggems_problem()
    return None


def select_route(device: torch.device | str = "cpu", scheme: str | None = None, *,
                 strict: bool | None = None) -> str:
    """The route for tensors on `device`.

    The arithmetic follows the host unless chosen (`scheme`, else env PCD_PROJECTION among
    dense / w8a8 / w4a8): a FlagOS host (AArch64, FLAGGEMS_VENDOR=arm, flag_gems importable)
    computes what its quantized head computes (w8a8 with FL_INT8_LMHEAD=1, else w4a8 through
    FlagGems); elsewhere dense. The backend is FlagGems on FlagOS, Triton on CUDA, else
    PyTorch. When the preferred backend cannot run we fall back to the PyTorch route with a
    warning, or raise RuntimeError if `strict` (default: `strict_mode()`).
    """
    device = torch.device(device)
    if strict is None:
        strict = strict_mode()
    chosen = scheme or os.environ.get("PCD_PROJECTION") or None
    if chosen is not None and chosen not in SCHEMES:
        raise ValueError(f"projection scheme must be one of {SCHEMES}; got {chosen!r}")
    arm = flagos_host()
    if chosen is None and arm:
        problem = _cannot_run("w4a8-flaggems", device)
        if problem is None:
            chosen = "w8a8" if os.environ.get("FL_INT8_LMHEAD") == "1" else "w4a8"
        elif strict:
            raise RuntimeError(f"FLAGGEMS_VENDOR=arm but FlagGems cannot run: {problem} "
                               "(FLAGGEMS_ARM_Q4_STRICT strict mode)")
        else:
            warnings.warn(f"FLAGGEMS_VENDOR=arm but FlagGems cannot run ({problem}); "
                          "projecting the dense head with PyTorch", stacklevel=2)
    chosen = chosen or "dense"
    cuda = device.type == "cuda"
    preferred = {
        "dense": "triton" if cuda else "torch",
        "w8a8": "w8a8-torch",
        "w4a8": "w4a8-flaggems" if arm else "w4a8-triton" if cuda else "w4a8-torch",
    }[chosen]
    problem = _cannot_run(preferred, device)
    if problem is None:
        return preferred
    if strict:
        raise RuntimeError(f"projection route {preferred} cannot run: {problem} "
                           "(FLAGGEMS_ARM_Q4_STRICT strict mode)")
    warnings.warn(f"projection route {preferred} cannot run ({problem}); "
                  f"using {_FALLBACK[preferred]}", stacklevel=2)
    return _FALLBACK[preferred]


def _resolve(route: str | None, device: torch.device, fixed_scheme: str | None) -> str:
    """An explicit route is honoured or refused; a scheme or None goes through selection."""
    if route is None or route in SCHEMES:
        route = select_route(device, route or fixed_scheme)
    elif route not in ROUTES:
        raise ValueError(f"unknown route {route!r}; expected one of {sorted(ROUTES)} or {SCHEMES}")
    if fixed_scheme is not None and ROUTES[route] != fixed_scheme:
        raise ValueError(f"a {fixed_scheme} head cannot take route {route!r}")
    if route.endswith("triton") and device.type == "cpu" \
            and os.environ.get("TRITON_INTERPRET") == "1":
        return route + "-interpret"
    if (problem := _cannot_run(route, device)) is not None:
        raise ValueError(f"route {route!r} cannot run here: {problem}")
    return route


# ---------------------------------------------------------------------------- projection

def project(hidden: Tensor, weight, allowed: Tensor, bias: Tensor | None = None,
            route: str | None = None) -> ProjectionResult:
    """Logits of the allowed ids only: float32 [B, K].

    hidden [B, H]; weight [V, H] (fp32/bf16/fp16), a `QuantizedHead` or a `HeadRows`
    snapshot; allowed int [B, K] (ids per row) or [K] (the same ids for every row), repeats
    allowed; bias [V] or None. `route` is a route name, a scheme name or None (selection).
    """
    quantized = isinstance(weight, w4a8.QuantizedHead)
    snapshot = isinstance(weight, HeadRows)
    if not (quantized or snapshot):
        _require_weight(weight)
        if weight.dim() != 2 or not weight.is_floating_point():
            raise ValueError(f"weight must be a float [V, H] tensor; got {tuple(weight.shape)} "
                             f"{weight.dtype}")
    table = weight.rows if snapshot else weight
    vocab = weight.vocab_size if (quantized or snapshot) else weight.shape[0]
    size = weight.hidden_size if quantized else table.shape[1]
    allowed = _check(hidden, table, allowed, bias, vocab, size)
    route = _resolve(route, hidden.device, weight.scheme if quantized else None)

    rows = weight.local(allowed) if snapshot else allowed
    if ROUTES[route.removesuffix("-interpret")] == "dense":
        if route == "torch":
            logits = gathered_matmul(hidden, table, rows)
        else:
            from vllm_pcd_kernels.triton_projection import gathered_projection
            logits = gathered_projection(hidden, table, rows)
    else:
        logits = w4a8.project_quantized(hidden, table, rows, route)
    if bias is not None:
        logits += bias[allowed].float()
    return ProjectionResult(logits, route)


def _check(hidden: Tensor, table: Tensor | w4a8.QuantizedHead, allowed: Tensor,
           bias: Tensor | None, vocab: int, size: int) -> Tensor:
    if hidden.dim() != 2 or not hidden.is_floating_point():
        raise ValueError(f"hidden must be a float [B, H] tensor; got {tuple(hidden.shape)} "
                         f"{hidden.dtype}")
    if hidden.shape[1] != size:
        raise ValueError(f"hidden size {hidden.shape[1]} does not match the head's {size}")
    if not isinstance(allowed, Tensor) or allowed.is_floating_point() or allowed.is_complex() \
            or allowed.dtype == torch.bool:
        raise ValueError("allowed must be an integer tensor of token ids")
    if allowed.dim() not in (1, 2) or allowed.shape[-1] == 0:
        raise ValueError(f"allowed must be [K] or [B, K] with K >= 1; got {tuple(allowed.shape)}")
    if allowed.dim() == 2 and allowed.shape[0] != hidden.shape[0]:
        raise ValueError(f"allowed has {allowed.shape[0]} rows but hidden has {hidden.shape[0]}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != vocab):
        raise ValueError(f"bias must be [{vocab}]; got {tuple(bias.shape)}")
    devices = {hidden.device, allowed.device, table.device}
    if len(devices) != 1:
        raise ValueError(f"hidden, weight and allowed must share a device; got {devices}")
    _check_range(allowed, vocab)
    return allowed.long()


def gathered_matmul(hidden: Tensor, weight: Tensor, allowed: Tensor) -> Tensor:
    """The PyTorch route: hidden cast to the weight dtype, then fp32 products and sums.

    Per-row ids, as measured on a 2-core x86 CPU (`python -m benchmarks.bench_projection
    --strategies --threads 1`, batch 32): while rows share ids (union <= 8 K), one matmul onto
    the union wins, up to 40x at union = K; when they share few, a product-sum on the gathered
    rows wins, done a few rows at a time so the fp32 copy stays in cache (~1 MB): 7x faster
    than one [B, K, H] copy at K = 256, H = 2560, and ahead of bmm.
    """
    h = hidden.to(weight.dtype).float()
    if allowed.dim() == 1:
        return h @ weight.index_select(0, allowed).float().T
    batch, k = allowed.shape
    ids, inverse = torch.unique(allowed, return_inverse=True)
    if len(ids) <= 8 * k:
        return (h @ weight.index_select(0, ids).float().T).gather(1, inverse)
    out = h.new_empty(batch, k)
    step = max(1, (1 << 18) // (k * weight.shape[1]))
    for start in range(0, batch, step):
        part = slice(start, start + step)
        rows = weight.index_select(0, allowed[part].reshape(-1)).float().view(-1, k, h.shape[1])
        out[part] = (rows * h[part, None]).sum(2)
    return out
