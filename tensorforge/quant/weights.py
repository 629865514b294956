"""Symmetric per-channel weight scales: one scale per output channel of a layer's constant operand.

The output-channel axis depends on the layer: Conv weights are `[C_out, C_in/g, k...]` (axis 0),
ConvTranspose weights `[C_in, C_out/g, k...]` (axis 1; with groups, a channel index of axis 1 is shared by
the g groups, so its scale covers all of them), Gemm's `B` is `[K, N]` (axis 1) or `[N, K]` with transB
(axis 0), MatMul's `B` is `[..., K, N]` (the last axis). A constant left operand quantizes per row of the
output (MatMul / Gemm `A`: axis −2, or −1 with transA). `scale[c] = max |W[c]| / qmax` (127 for int8, 448
for float8 E4M3), zero-safe.
"""

from __future__ import annotations

import torch

from ..ir import Node
from .scale import QMAX, symmetric_scales


def output_channel_axis(node: Node, index: int, rank: int) -> int | None:
    """The axis of operand `index` (of rank `rank`) of `node` that indexes output channels, or None when the
    operand has none (a 1-D MatMul operand) and quantizes per tensor."""
    op = node.op_type
    if op in ("Conv", "FusedConv"):
        return 0 if index == 1 else None
    if op == "ConvTranspose":
        return 1 if index == 1 else None
    if rank < 2:
        return None
    if op in ("Gemm", "FusedGemm"):
        transposed = bool(node.attributes.get("transB" if index == 1 else "transA", 0))
    elif op == "MatMul":
        transposed = False
    else:
        raise ValueError(f"{node.label}: {op} has no quantizable weight")
    if index == 1:
        return rank - 2 if transposed else rank - 1
    return rank - 1 if transposed else rank - 2


def per_channel_amax(weight: torch.Tensor, axis: int | None) -> torch.Tensor:
    """`max |W|` over every axis but `axis` (a scalar when `axis` is None)."""
    magnitude = weight.detach().abs().double()
    if axis is None:
        return magnitude.amax()
    return magnitude.movedim(axis, 0).reshape(weight.shape[axis], -1).amax(dim=1)


def weight_scales(weight: torch.Tensor, axis: int | None, qmax: float = QMAX) -> torch.Tensor:
    """float32 scales, one per index of `axis` (a 1-element tensor when `axis` is None)."""
    return symmetric_scales(per_channel_amax(weight, axis).reshape(-1), qmax)
