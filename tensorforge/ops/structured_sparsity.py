"""2:4 structured sparsity of a layer's weight: which matrix it is, whether it has the pattern, pruning to it.

A product `Y = X · Wᵀ` with `W` of [N, K] has the 2:4 pattern when every run of four consecutive weights along
the reduction axis K (`W[n, 4j : 4j + 4]`) holds at most two nonzeros. Ampere's and Hopper's sparse tensor cores
then skip the zeros: half the weight's bytes and, at best, twice the dense rate. The layers that qualify are
FusedGemm with a constant B (W is `B` with `transB`, else `Bᵀ`), int8 QuantizedGemm (W is `Bqᵀ`) and 1×1
FusedConv without groups or dilation (W is the weight's [Cout, Cin]); a k×k convolution reduces over Cin·k·k in
an order our kernels choose, not over a matrix that exists, and is left dense.
"""

from __future__ import annotations

import torch

from ..ir import Node
from .fused import DOMAIN

GROUP, KEPT = 4, 2  # of every GROUP consecutive weights along K, at most KEPT nonzero


def weight_matrix(node: Node) -> torch.Tensor | None:
    """The layer's weight as W [N, K] (a view of the constant, K the reduction axis), or None for a layer whose
    weight is not such a matrix (see the module docstring). The ONNX ops the fused ones are made of (Gemm, MatMul
    with a constant matrix B, Conv) count too, so that a model can be pruned before it is optimized."""
    if node.domain not in (DOMAIN, "", "ai.onnx") or len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    weight = node.inputs[1]
    if not weight.is_const or not isinstance(weight.const, torch.Tensor):
        return None
    const, a = weight.const, node.attributes
    if node.op_type == "QuantizedGemm" and node.domain == DOMAIN and const.dtype == torch.int8:
        return const.t()  # Bq [K, N]
    if not const.is_floating_point():
        return None
    if node.op_type in ("FusedGemm", "Gemm") and const.dim() == 2 and not a.get("transA", 0):
        return const if a.get("transB", 0) else const.t()
    if node.op_type == "MatMul" and const.dim() == 2:
        return const.t()
    if node.op_type in ("FusedConv", "Conv") and const.dim() == 4 and tuple(const.shape[2:]) == (1, 1):
        if a.get("group", 1) == 1 and all(d == 1 for d in a.get("dilations") or (1, 1)):
            return const.reshape(const.shape[0], const.shape[1])
    return None


def weight_from_matrix(node: Node, matrix: torch.Tensor) -> torch.Tensor:
    """The constant weight of `node` whose `weight_matrix` is `matrix` (its inverse)."""
    if node.op_type in ("MatMul", "QuantizedGemm") or (
        node.op_type in ("FusedGemm", "Gemm") and not node.attributes.get("transB", 0)
    ):
        matrix = matrix.t()
    return matrix.reshape(node.inputs[1].const.shape).contiguous()


def is_2to4(matrix: torch.Tensor) -> bool:
    """Whether every run of four along the last axis of `matrix` holds at most two nonzeros (K a multiple of 4)."""
    rows, k = matrix.shape
    if k % GROUP or not rows:
        return False
    groups = matrix.reshape(rows, k // GROUP, GROUP)
    return bool(groups.ne(0).sum(dim=-1).le(KEPT).all())


def prune_2to4(matrix: torch.Tensor) -> torch.Tensor:
    """`matrix` with the two smallest-magnitude weights of every run of four along the last axis set to zero (ties
    keep the earlier weight), as magnitude pruning does; K must be a multiple of 4."""
    rows, k = matrix.shape
    groups = matrix.reshape(rows, k // GROUP, GROUP)
    order = groups.abs().argsort(dim=-1, descending=True, stable=True)
    keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, order[..., :KEPT], True)
    return groups.where(keep, torch.zeros((), dtype=matrix.dtype)).reshape(rows, k)
