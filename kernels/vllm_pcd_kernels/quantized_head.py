"""The quantized LM-head rows the W4A8/W8 routes read, and their int4 packing.

Shared by the torch reference (`vllm_pcd_kernels.w4a8`) and the Triton kernels
(`vllm_pcd_kernels.triton_w4a8`), so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

GROUP = 128  # int4 weights share one scale per group of this many hidden units


def pack_int4(codes: Tensor) -> Tensor:
    """int8 [N, H] in [-8, 7] -> uint8 [N, ceil(H/2)]; element 2j in the low nibble."""
    codes = F.pad(codes, (0, codes.shape[1] % 2)).to(torch.int16) & 15
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed: Tensor, hidden_size: int) -> Tensor:
    p = packed.to(torch.int16)
    nibbles = torch.stack((p & 15, p >> 4), dim=2).view(p.shape[0], -1)[:, :hidden_size]
    return ((nibbles ^ 8) - 8).to(torch.int8)


@dataclass(frozen=True, eq=False)
class QuantizedHead:
    """A quantized copy of (rows of) the LM head.

    w4a8: codes uint8 [V, ceil(H/2)] (two int4 per byte), scales bf16 [V, ceil(H/128)];
    w8a8: codes int8 [V, H], scales bf16 [V]. Build it with `quantize_head` before FlagOS
    empties the BF16 weight, or from a checkpoint's codes and scales.
    """

    scheme: str
    codes: Tensor
    scales: Tensor
    hidden_size: int

    def __post_init__(self):
        if self.scheme not in ("w4a8", "w8a8"):
            raise ValueError(f"quantized head scheme must be w4a8 or w8a8; got {self.scheme!r}")
        four = self.scheme == "w4a8"
        width = -(-self.hidden_size // 2) if four else self.hidden_size
        if self.codes.dim() != 2 or self.codes.shape[1] != width:
            raise ValueError(f"{self.scheme} codes must be [V, {width}]; "
                             f"got {tuple(self.codes.shape)}")
        scales = (self.codes.shape[0], -(-self.hidden_size // GROUP)) if four \
            else (self.codes.shape[0],)
        if tuple(self.scales.shape) != scales:
            raise ValueError(f"{self.scheme} scales must be {list(scales)}; "
                             f"got {list(self.scales.shape)}")

    @property
    def vocab_size(self) -> int:
        return self.codes.shape[0]

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def select(self, ids: Tensor) -> QuantizedHead:
        return QuantizedHead(self.scheme, self.codes.index_select(0, ids),
                             self.scales.index_select(0, ids), self.hidden_size)

    def int_codes(self) -> Tensor:
        """int8 [V, H]."""
        if self.scheme == "w8a8":
            return self.codes
        return unpack_int4(self.codes, self.hidden_size)
