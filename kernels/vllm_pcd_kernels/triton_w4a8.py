"""The W4A8-G128 arithmetic of kernels/vllm_pcd_kernels/w4a8.py in two Triton kernels.

1. `_quantize_rows_kernel`: per token asymmetric int8 (one program per row).
2. `_w4a8_kernel`: one program per (row, block of allowed ids); per group of 128 the exact
   int32 dot of (q - zp) with the unpacked int4 codes, then acc += dot · scale in fp32, in
   group order, and a final product with the activation scale.

Every step is the reference's IEEE operation in the reference's order: integer sums are exact,
divisions use div_rn, and the kernels are compiled with enable_fp_fusion=False so that no
multiply-add (acc + dot·scale, or the fraction x·m - trunc in the rounding) becomes an FMA.
So the logits agree bit for bit: checked under TRITON_INTERPRET=1 by tests/engine/test_w4a8.py, and
on a GPU by benchmarks/gpu_projection_check.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from vllm_pcd_kernels.quantized_head import GROUP, QuantizedHead


@triton.jit
def _round_half_away(v):
    t = v.to(tl.int32).to(tl.float32)
    f = v - t
    return t + tl.where(f >= 0.5, 1.0, 0.0) - tl.where(f <= -0.5, 1.0, 0.0)


@triton.jit
def _round_half_even(v):
    t = v.to(tl.int32).to(tl.float32)
    f = v - t
    odd = (t.to(tl.int32) % 2) != 0
    up = (f > 0.5) | ((f == 0.5) & odd)
    down = (f < -0.5) | ((f == -0.5) & odd)
    return t + tl.where(up, 1.0, 0.0) - tl.where(down, 1.0, 0.0)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, zero_ptr, H, stride_x, stride_q,
                          BLOCK_H: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < H
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    lo = tl.minimum(tl.min(x, axis=0), 0.0)  # padding lanes are 0, inside the range anyway
    hi = tl.maximum(tl.max(x, axis=0), 0.0)
    span = hi - lo
    mult = tl.math.div_rn(255.0, tl.where(span == 0.0, 255.0, span))
    scale = tl.math.div_rn(1.0, mult)
    dmin = lo * mult
    dmax = hi * mult
    zero = tl.where((dmin - 128.0) + (dmax + 127.0) > 0.0, -128.0 - dmin, 127.0 - dmax)
    zero = _round_half_even(tl.minimum(tl.maximum(zero, -128.0), 127.0))
    q = tl.minimum(tl.maximum(_round_half_away(x * mult) + zero, -128.0), 127.0)
    tl.store(q_ptr + row * stride_q + offs, q.to(tl.int8), mask=mask)
    tl.store(scale_ptr + row, scale)
    tl.store(zero_ptr + row, zero.to(tl.int32))


@triton.jit
def _w4a8_kernel(q_ptr, zero_ptr, a_scale_ptr, codes_ptr, w_scale_ptr, ids_ptr, out_ptr,
                 H, K, G, stride_q, stride_codes, stride_w_scale, stride_ids, stride_out,
                 BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr):
    row = tl.program_id(0)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    ids = tl.load(ids_ptr + row * stride_ids + offs_k, mask=mask_k, other=0)
    zero = tl.load(zero_ptr + row)
    offs_g = tl.arange(0, GROUP_SIZE)
    shift = (offs_g % 2) * 4  # even elements in the low nibble
    acc = tl.zeros([BLOCK_K], dtype=tl.float32)
    for g in range(0, G):
        offs_h = g * GROUP_SIZE + offs_g
        mask_h = offs_h < H
        qa = tl.load(q_ptr + row * stride_q + offs_h, mask=mask_h, other=0).to(tl.int32)
        centered = tl.where(mask_h, qa - zero, 0)
        packed = tl.load(codes_ptr + ids[:, None] * stride_codes + (offs_h // 2)[None, :],
                         mask=mask_k[:, None] & mask_h[None, :], other=0).to(tl.int32)
        w = (((packed >> shift[None, :]) & 15) ^ 8) - 8
        dot = tl.sum(w * centered[None, :], axis=1)
        s = tl.load(w_scale_ptr + ids * stride_w_scale + g, mask=mask_k, other=0.0)
        acc += dot.to(tl.float32) * s.to(tl.float32)
    acc = acc * tl.load(a_scale_ptr + row)
    tl.store(out_ptr + row * stride_out + offs_k, acc, mask=mask_k)


def quantize_activations_triton(hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Same contract as vllm_pcd_kernels.w4a8.quantize_activations."""
    x = hidden.to(torch.bfloat16).contiguous()
    batch, h = x.shape
    q = torch.empty(batch, h, dtype=torch.int8, device=x.device)
    scale = torch.empty(batch, dtype=torch.float32, device=x.device)
    zero = torch.empty(batch, dtype=torch.int32, device=x.device)
    _quantize_rows_kernel[(batch,)](x, q, scale, zero, h, x.stride(0), q.stride(0),
                                    BLOCK_H=triton.next_power_of_2(h), enable_fp_fusion=False)
    return q, scale, zero


def w4a8_triton(hidden: Tensor, rows: QuantizedHead, local: Tensor) -> Tensor:
    """fp32 [B, K]: local [K] or [B, K] indexes the w4a8 `rows`."""
    q, a_scale, zero = quantize_activations_triton(hidden)
    ids = local.contiguous()
    batch, k = q.shape[0], ids.shape[-1]
    out = torch.empty(batch, k, dtype=torch.float32, device=q.device)
    block_k = 16 if k <= 16 else 32
    _w4a8_kernel[(batch, triton.cdiv(k, block_k))](
        q, zero, a_scale, rows.codes, rows.scales, ids, out,
        q.shape[1], k, rows.scales.shape[1], q.stride(0), rows.codes.stride(0),
        rows.scales.stride(0), ids.stride(0) if ids.dim() == 2 else 0, out.stride(0),
        BLOCK_K=block_k, GROUP_SIZE=GROUP, enable_fp_fusion=False)
    return out
