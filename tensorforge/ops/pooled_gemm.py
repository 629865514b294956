"""`tensorforge::PooledGemm(X, B, C?)`: a global average pool, the flattening of its [N, C, 1, 1] result and the
FusedGemm that reads it, in one node (a classifier's head):

    Y = FusedGemm(Flatten(GlobalAveragePool(X)), B, C; transB, pre, pre_params, post, post_params)

X is 4-D (N, C, H, W), B the [C, K] weight ([K, C] with transB), C a bias over the K output columns; no residual,
alpha and beta 1. The reference evaluates exactly those three nodes. The point of the node is the CPU kernel
(`kernels.cpu.pointwise`, `PointwiseConv.pooled`): the pool and the product in one call, where a network at batch 1
spent more on the pool's and the flattening's calls than on their arithmetic.
"""

from __future__ import annotations

from .fused import DOMAIN, OPSET, fused_gemm
from .pool import global_average_pool
from .registry import OpContext, register


@register("PooledGemm", since=OPSET, domain=DOMAIN)
def pooled_gemm(ctx: OpContext, x, b, c=None, *, transB=0, pre="", pre_params=(), post="", post_params=()):
    pooled = global_average_pool(ctx, x).flatten(1)
    return fused_gemm(ctx, pooled, b, c, transB=transB, pre=pre, pre_params=pre_params, post=post,
                      post_params=post_params)  # fmt: skip
