"""The Triton GEMM tactics (CUDA): `triton.gemm`, MatMul, Gemm and FusedGemm as one tiled kernel with the
epilogue inside (`triton.gemm-tma`: in TMA-fed tiles for linear layers on Hopper); `triton.gemm-quantized`, an
int8 / E4M3 QuantizedGemm as one TMA-fed kernel (Hopper) with the activation quantized on load and the
dequantizing epilogue inside."""

from __future__ import annotations

from typing import Any

import torch

from ..ir import DType, Node, qualified_op
from ..kernels.triton import conv_tma
from ..kernels.triton.epilogue import ACTIVATION_CODES, activation_args, quant_code
from ..kernels.triton.gemm import gemm, gemm_configs, gemm_tma_configs
from ..ops.fused import DOMAIN, QUANT_TYPES
from .base import Kernel, PerWeight, Tactic, allocate, register_tactic
from .variant import float_type

_FUSED_GEMM = f"{DOMAIN}::FusedGemm"
_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.BFLOAT16)


def _activation_problem(node: Node) -> str | None:
    """Why the node's pre or post activation has no Triton epilogue (None when both have one)."""
    for key in ("pre", "post"):
        name = node.attributes.get(key, "")
        if name not in ACTIVATION_CODES:
            return f"no Triton epilogue for {key} activation {name!r}"
    return None


@register_tactic
class TritonGemmTactic(Tactic):
    """`Y = post(pre(alpha · op(A) @ op(B) + beta · C) + Z)`; float32 layers use TF32 dot products only in
    the tf32 variant (the flag its kernel runs under), IEEE float32 otherwise."""

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
        return _activation_problem(node)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return gemm_configs(effort)

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


@register_tactic
class TritonGemmTmaTactic(TritonGemmTactic):
    """`triton.gemm` in TMA-fed tiles (`gemm_tma_configs`, `conv_tma.gemm_rows`) for a product by a constant 2-D
    weight (a linear layer: every batch folds into M) on Hopper; a call the rows kernel cannot take (alpha, a full
    C, unaligned rows) runs the pointer kernel with the same tiles."""

    name = "gemm-tma"

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        problem = super().supports(node, opset, device)
        if problem:
            return problem
        weight = node.inputs[1]
        if not (weight.is_const and weight.rank == 2):
            return "a product by a constant 2-D weight only (a linear layer)"
        return conv_tma.hopper_problem(device)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return gemm_tma_configs(effort)


@register_tactic
class TritonQuantizedGemmTactic(Tactic):
    """QuantizedGemm `Y = post(pre(Σ q_a·q_b · x_scale · Bs[n] + C) + Z)` as `conv_tma.gemm_rows`: the rows
    kernel with TMA-fed operands, int8 products summed exactly in int32 (E4M3 ones in float32), a float A
    quantized as it is loaded (an A of the layer's type read as it is), the epilogue and, with `y_scale`, the
    output's requantization inside: one kernel where `vendor.cublas-int8` runs a quantization, the product and a
    torch epilogue. The weight is stored K-major once. Hopper or newer; C a bias row or absent, Z of Y's shape
    (float, or quantized and added as Z · z_scale)."""

    family = "triton"
    name = "gemm-quantized"
    op_types = (f"{DOMAIN}::QuantizedGemm",)
    precisions = ("fp16", "bf16")  # A float32 quantized on load needs more shared memory than these tiles have
    sees_precision = True  # a float output in the variant's type

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA"
        problem = conv_tma.hopper_problem(device)
        if problem:
            return problem
        _, b, c, z = (list(node.inputs) + [None] * 4)[:4]
        if not b.is_const or b.rank != 2:
            return "a constant 2-D weight only"
        k, n = b.shape
        if k % 16 or n % 16:
            return f"TMA moves rows in multiples of 16 bytes: K and N multiples of 16 (8-bit rows), not {k} and {n}"
        if c is not None and c.name and tuple(c.shape or ()) != (n,):
            return f"C must be a bias row [{n}], got {list(c.shape or ())}"
        if z is not None and z.name and tuple(z.shape or ()) != tuple(node.outputs[0].shape or ()):
            return "the residual must have the output's shape"
        return _activation_problem(node)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return gemm_tma_configs(effort, quantized=True)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        a = node.attributes
        quant = quant_code(a.get("quant", "int8"))
        x_scale, y_scale, z_scale = float(a["x_scale"]), float(a.get("y_scale", 0.0)), float(a.get("z_scale", 0.0))
        pre = activation_args(a.get("pre", ""), a.get("pre_params", ()))
        post = activation_args(a.get("post", ""), a.get("post_params", ()))
        tile = dict(config) if config else gemm_tma_configs(0, quantized=True)[0]
        sizes = tuple(tile[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"))
        k_major = PerWeight(lambda w: w.t().contiguous().t())  # [K, N] with K contiguous
        out_dtype = QUANT_TYPES[a.get("quant", "int8")].torch if y_scale else float_type(config)

        def kernel(inputs, alloc=None):
            x, w, c, z, w_scale = (list(inputs) + [None] * 5)[:5]
            rows = x.reshape(-1, x.shape[-1])
            out = allocate(alloc, 0, (*x.shape[:-1], w.shape[1]), out_dtype, x.device)
            y = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
            problem = conv_tma.gemm_rows(
                rows, k_major(w), c, z.reshape(-1, z.shape[-1]) if z is not None else None, y.view(-1, w.shape[1]),
                pre, post, sizes, quant=quant, weight_scale=w_scale.float().contiguous(), x_scale=x_scale,
                y_scale=y_scale, z_scale=z_scale, persistent=tile.get("PERSISTENT", 0),
            )  # fmt: skip
            if problem:
                raise ValueError(f"triton.gemm-quantized: {problem}")
            if y is not out:
                out.copy_(y)
            return (out,)

        return kernel
