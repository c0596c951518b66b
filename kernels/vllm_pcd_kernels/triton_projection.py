"""Triton kernel for the gathered projection: one program per (row, block of allowed ids).

Each program loads the ids of its block, walks H in BLOCK_H chunks (masked, so any hidden
size works), and accumulates w·h in fp32. Ids [K] shared by every row are read with a zero
row stride instead of being expanded. Runs on CPU tensors under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _gathered_kernel(hidden_ptr, weight_ptr, ids_ptr, out_ptr, H, K,
                     stride_hidden, stride_weight, stride_ids, stride_out,
                     BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    row = tl.program_id(0)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    ids = tl.load(ids_ptr + row * stride_ids + offs_k, mask=mask_k, other=0)
    w_rows = weight_ptr + ids[:, None] * stride_weight
    acc = tl.zeros([BLOCK_K], dtype=tl.float32)
    for start in range(0, H, BLOCK_H):
        offs_h = start + tl.arange(0, BLOCK_H)
        mask_h = offs_h < H
        x = tl.load(hidden_ptr + row * stride_hidden + offs_h, mask=mask_h, other=0.0)
        w = tl.load(w_rows + offs_h[None, :], mask=mask_k[:, None] & mask_h[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    tl.store(out_ptr + row * stride_out + offs_k, acc, mask=mask_k)


def gathered_projection(hidden: Tensor, weight: Tensor, allowed: Tensor,
                        block_h: int = 256) -> Tensor:
    """fp32 [B, K]: hidden [B, H] cast to the weight dtype, weight [V, H], ids [K] or [B, K]."""
    h = hidden.to(weight.dtype).contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    ids = allowed.contiguous()
    batch, k = h.shape[0], ids.shape[-1]
    out = torch.empty(batch, k, dtype=torch.float32, device=h.device)
    block_k = 16 if k <= 16 else 32
    grid = (batch, triton.cdiv(k, block_k))
    _gathered_kernel[grid](h, weight, ids, out, h.shape[1], k,
                           h.stride(0), weight.stride(0), ids.stride(0) if ids.dim() == 2 else 0,
                           out.stride(0), BLOCK_K=block_k, BLOCK_H=block_h)
    return out
