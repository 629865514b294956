"""The Triton GEMM tactic: MatMul, Gemm and FusedGemm as one tiled kernel with the epilogue inside (CUDA)."""

from __future__ import annotations

from typing import Any

import torch

from ..ir import DType, Node, qualified_op
from ..kernels.triton.epilogue import ACTIVATION_CODES
from ..kernels.triton.gemm import gemm, gemm_configs, gemm_tma_configs
from ..ops.fused import DOMAIN
from .base import Kernel, Tactic, allocate, register_tactic

_FUSED_GEMM = f"{DOMAIN}::FusedGemm"
_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.BFLOAT16)


@register_tactic
class TritonGemmTactic(Tactic):
    """`Y = post(pre(alpha · op(A) @ op(B) + beta · C) + Z)`; float32 layers use TF32 dot products only in
    the tf32 variant (the flag its kernel runs under), IEEE float32 otherwise. Products by a constant 2-D weight
    also try TMA-fed tiles (`gemm_tma_configs`, on Hopper)."""

    family = "triton"
    name = "gemm"
    writes_into = True
    op_types = ("MatMul", "Gemm", _FUSED_GEMM)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA"
        a, b = node.inputs[0], node.inputs[1]
        if a.rank is None or b.rank is None:
            return "operand ranks are unknown"
        if a.rank < 2 or b.rank < 2:
            return f"matrix operands only (ranks {a.rank} and {b.rank}); a vector operand runs elsewhere"
        if a.dtype not in _FLOATS or b.dtype != a.dtype:
            return f"float16/bfloat16/float32 operands of one type only, got {a.dtype} and {b.dtype}"
        for key in ("pre", "post"):
            name = node.attributes.get(key, "")
            if name not in ACTIVATION_CODES:
                return f"no Triton epilogue for {key} activation {name!r}"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return gemm_configs(effort)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        """The space, and for a product by a constant 2-D weight (a linear layer: every batch folds into M)
        the TMA kernel's tiles."""
        weight = node.inputs[1]
        linear = weight.is_const and weight.rank == 2 and node.inputs[0].rank is not None
        return self.space(effort) + (gemm_tma_configs(effort) if linear else [])

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        attributes = node.attributes
        fused = qualified_op(node) == _FUSED_GEMM
        gemm_op = node.op_type in ("Gemm",) or fused
        options = {
            "alpha": float(attributes.get("alpha", 1.0)) if gemm_op else 1.0,
            "beta": float(attributes.get("beta", 1.0)) if gemm_op else 1.0,
            "trans_a": bool(attributes.get("transA", 0)) if gemm_op else False,
            "trans_b": bool(attributes.get("transB", 0)) if gemm_op else False,
            "pre": attributes.get("pre", ""),
            "pre_params": list(attributes.get("pre_params", ())),
            "post": attributes.get("post", ""),
            "post_params": list(attributes.get("post_params", ())),
        }
        tile = dict(config) if config else gemm_configs(0)[0]

        def kernel(inputs, alloc=None):
            a, b, c, z = (list(inputs) + [None] * 4)[:4]
            precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
            m = a.shape[-1] if options["trans_a"] else a.shape[-2]
            n = b.shape[-2] if options["trans_b"] else b.shape[-1]
            shape = (*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), m, n)
            out = allocate(alloc, 0, shape, a.dtype, a.device)
            return (gemm(a, b, c, z, **options, input_precision=precision, config=tile, out=out),)

        return kernel
