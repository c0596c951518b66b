"""Quantized restricted projection, for FlagOS Arm hosts whose LM head runs quantized.

The arithmetic is the one FlagGems/KleidiAI publish, so the option logits match what the
engine's own quantized head would produce:
- activations: per token, asymmetric int8 (KleidiAI qai8dxp). The range [min(x, 0), max(x, 0)]
  maps onto [-128, 127]: multiplier m = 255 / range, scale 1/m, zero point chosen by the
  smaller rounding error and rounded half to even, q = clamp(round_half_away(x·m) + zp).
  Activations are taken in BF16 first, as FlagGems' kernel takes them.
- W4 (FL_INT4 heads): symmetric int4 per group of 128 along H with BF16 scales; the scale is
  the signed value of largest magnitude over -8 (ggml Q4_0, FlagGems' Arm quantizer), codes in
  [-8, 7]. A last group shorter than 128 behaves as zero-padded: zeros add nothing.
- W8 (FL_INT8_LMHEAD=1): symmetric int8 per row, scale = absmax / 127 in BF16.
- result: per group the integer dot Σ (q - zp)·w, times the group's weight scale, summed over
  groups in order in fp32, times the activation scale.
Only the rows of the allowed ids are quantized, once per set of ids (option set), cached.
"""

from __future__ import annotations

import importlib
import weakref
from collections import OrderedDict
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from vllm_pcd_kernels.quantized_head import GROUP, QuantizedHead, pack_int4

def round_half_away(x: Tensor) -> Tensor:
    """C roundf, exactly: the fraction x - trunc(x) is exact in floating point."""
    t = x.trunc()
    f = x - t
    return t + (f >= 0.5).to(x.dtype) - (f <= -0.5).to(x.dtype)


def quantize_activations(hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token asymmetric int8: q int8 [B, H], scale fp32 [B], zero point int32 [B]."""
    x = hidden.to(torch.bfloat16).float()
    lo = x.amin(1).clamp(max=0.0)
    hi = x.amax(1).clamp(min=0.0)
    span = hi - lo
    mult = torch.full_like(span, 255.0) / torch.where(span == 0, 255.0, span)
    scale = torch.ones_like(mult) / mult
    dmin, dmax = lo * mult, hi * mult
    zero = torch.where((dmin - 128.0) + (dmax + 127.0) > 0, -128.0 - dmin, 127.0 - dmax)
    zero = zero.clamp(-128.0, 127.0).round()
    q = (round_half_away(x * mult[:, None]) + zero[:, None]).clamp(-128.0, 127.0)
    return q.to(torch.int8), scale, zero.to(torch.int32)


def quantize_w4(rows: Tensor) -> tuple[Tensor, Tensor]:
    """[N, H] float -> codes int8 [N, H] in [-8, 7], scales bf16 [N, ceil(H/128)]."""
    n, h = rows.shape
    groups = -(-h // GROUP)
    w = F.pad(rows.float(), (0, groups * GROUP - h)).view(n, groups, GROUP)
    signed_max = w.gather(2, w.abs().argmax(2, keepdim=True))
    scale = signed_max / -8.0
    inverse = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
    codes = (w * inverse).round().clamp(-8, 7).to(torch.int8).view(n, -1)[:, :h]
    return codes.contiguous(), scale.squeeze(2).to(torch.bfloat16)


def quantize_w8(rows: Tensor) -> tuple[Tensor, Tensor]:
    """[N, H] float -> codes int8 [N, H], scales bf16 [N]."""
    w = rows.float()
    scale = (w.abs().amax(1) / 127.0).clamp(min=1e-8)
    codes = (w / scale[:, None]).round().clamp(-128, 127).to(torch.int8)
    return codes, scale.to(torch.bfloat16)


def quantize_head(weight: Tensor, scheme: str = "w4a8", chunk_rows: int = 8192) -> QuantizedHead:
    """Quantize a head [V, H], a chunk of rows at a time to bound the fp32 temporaries."""
    if weight.dim() != 2 or weight.numel() == 0:
        raise ValueError(f"need a non-empty [V, H] head weight; got {tuple(weight.shape)}")
    codes, scales = [], []
    for start in range(0, weight.shape[0], chunk_rows):
        if scheme == "w4a8":
            c, s = quantize_w4(weight[start:start + chunk_rows])
            c = pack_int4(c)
        elif scheme == "w8a8":
            c, s = quantize_w8(weight[start:start + chunk_rows])
        else:
            raise ValueError(f"scheme must be w4a8 or w8a8; got {scheme!r}")
        codes.append(c)
        scales.append(s)
    return QuantizedHead(scheme, torch.cat(codes), torch.cat(scales), weight.shape[1])


class OptionSetCache:
    """Values derived from a head for one set of allowed ids, least recently used first out.

    Keyed on the head object through a weak reference, so a head FlagOS releases is not
    kept alive here, and on the tensor version, so an in-place update invalidates (inference
    tensors keep no version: update those out of place).
    """

    def __init__(self, size: int = 64):
        self.size = size
        self.entries: OrderedDict[tuple, tuple[weakref.ref, Any]] = OrderedDict()

    def get(self, source: Any, key: tuple, make: Callable[[], Any]) -> Any:
        full = (id(source), _version(source), *key)
        hit = self.entries.get(full)
        if hit is not None and hit[0]() is source:
            self.entries.move_to_end(full)
            return hit[1]
        value = make()
        self.entries[full] = (weakref.ref(source), value)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return value


def _version(source: Any) -> int:
    if isinstance(source, Tensor) and not source.is_inference():
        return source._version
    return 0


OPTION_SETS = OptionSetCache()


def project_quantized(hidden: Tensor, table: Tensor | QuantizedHead, allowed: Tensor,
                      route: str) -> Tensor:
    """fp32 [B, K] logits of `allowed` by a w8a8-* or w4a8-* route (inputs already checked)."""
    scheme = route.split("-")[0]
    ids, local = torch.unique(allowed, return_inverse=True)
    key = (scheme, tuple(ids.tolist()))

    def quantized_rows() -> QuantizedHead:
        if isinstance(table, QuantizedHead):
            return table.select(ids)
        return quantize_head(table.index_select(0, ids), scheme)

    rows = OPTION_SETS.get(table, key, quantized_rows)
    if route == "w8a8-torch":
        return w8a8_reference(hidden, rows, local)
    if route == "w4a8-torch":
        return w4a8_reference(hidden, rows, local)
    if route == "w4a8-flaggems":
        packed = OPTION_SETS.get(table, key + ("flaggems",), lambda: flaggems_pack(rows))
        return _pick(flaggems_linear(hidden, packed, rows), local)
    from vllm_pcd_kernels.triton_w4a8 import w4a8_triton
    return w4a8_triton(hidden, rows, local)


def _pick(full: Tensor, local: Tensor) -> Tensor:
    """[B, N] logits over the selected rows -> [B, K] for local ids [K] or [B, K]."""
    return full.gather(1, local) if local.dim() == 2 else full[:, local]


def w4a8_reference(hidden: Tensor, rows: QuantizedHead, local: Tensor) -> Tensor:
    """The W4A8-G128 arithmetic in PyTorch; local indexes `rows`."""
    q, a_scale, zero = quantize_activations(hidden)
    b, h = q.shape
    groups = rows.scales.shape[1]
    pad = groups * GROUP - h
    # Every partial sum is an integer below 255·8·128 < 2**24: exact in fp32, any order.
    centered = F.pad((q.int() - zero[:, None]).float(), (0, pad)).view(b, groups, GROUP)
    weights = F.pad(rows.int_codes().float(), (0, pad)).view(-1, groups, GROUP)
    dots = torch.einsum("bgc,ngc->bng", centered, weights)
    w_scale = rows.scales.float()
    total = torch.zeros(dots.shape[:2], device=dots.device)
    for g in range(groups):  # fp32 sum in group order, as the kernels accumulate
        total = total + dots[:, :, g] * w_scale[:, g]
    return _pick(total * a_scale[:, None], local)


def w8a8_reference(hidden: Tensor, rows: QuantizedHead, local: Tensor) -> Tensor:
    """int8 per-row weights x int8 per-token activations; exact integer dots (fp64)."""
    q, a_scale, zero = quantize_activations(hidden)
    centered = (q.int() - zero[:, None]).double()
    dots = (centered @ rows.codes.double().T).float()
    return _pick(dots * rows.scales.float() * a_scale[:, None], local)


# ---------------------------------------------------------------------------- FlagGems

def flaggems_problem() -> str | None:
    """Why FlagGems' W4A8-G128 entry points cannot be used here, or None."""
    try:
        module = importlib.import_module("flag_gems.quantized_linear")
    except Exception as exc:  # a broken install raises more than ImportError
        return f"flag_gems.quantized_linear does not import: {exc!r}"
    missing = [n for n in ("pack_rhs_qsi4c128p", "w4a8_g128_linear") if not hasattr(module, n)]
    return f"flag_gems.quantized_linear lacks {', '.join(missing)}" if missing else None


def flaggems_pack(rows: QuantizedHead) -> Tensor:
    """Pack rows for w4a8_g128_linear, which needs N % 4 == 0 and K % 128 == 0: dummy rows
    (sliced off after) and zero columns (they add nothing) make up the difference."""
    from flag_gems.quantized_linear import pack_rhs_qsi4c128p
    codes = rows.int_codes()
    n, h = codes.shape
    n4 = -(-n // 4) * 4
    codes = F.pad(codes, (0, rows.scales.shape[1] * GROUP - h, 0, n4 - n))
    scales = F.pad(rows.scales.float(), (0, 0, 0, n4 - n), value=1.0)
    return pack_rhs_qsi4c128p(codes.contiguous(), scales.contiguous())


def flaggems_linear(hidden: Tensor, packed: Tensor, rows: QuantizedHead) -> Tensor:
    """fp32 [B, N] over the packed rows (FlagGems returns BF16)."""
    from flag_gems.quantized_linear import w4a8_g128_linear
    n = rows.vocab_size
    width = rows.scales.shape[1] * GROUP
    x = F.pad(hidden.to(torch.bfloat16), (0, width - hidden.shape[1])).contiguous()
    out = w4a8_g128_linear(x, packed, -(-n // 4) * 4, width)
    return out[:, :n].float()
