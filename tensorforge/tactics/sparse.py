"""The sparse family: layers whose weight has the 2:4 pattern, on the sparse tensor cores.

`sparse.semi-structured` runs FusedGemm with a constant weight and 1×1 FusedConv without groups or padding
(`ops.structured_sparsity.weight_matrix`) as `rows · Wᵀ` through cuSPARSELt or, on compute capability 8.x,
CUTLASS (`kernels.sparse_gemm`), in fp16 or bf16, when W has at most two nonzeros in every four along K;
`sparse.semi-structured-int8` does the same for int8 QuantizedGemm, with exact int32 sums and
`vendor.cublas-int8`'s epilogue. The zeros are the model's: a weight without the pattern is declined, never pruned
here (`BuildConfig.sparsity` "force" prunes the model before it is optimized, and says so). Half the weight's
bytes and up to twice the dense rate; whether that beats the dense kernels at a layer's shape is the autotuner's to
measure.

The convolution reads its input as NHWC rows (a view of a channels_last tensor; another layout costs a copy,
timed with it) and writes channels_last. The epilogue beyond the bias (and CUTLASS's ReLU or SiLU) runs after the
product, as torch's in-place ops or, a configuration of its own, as one Triton pass over the output
(`conv_epilogue_nhwc`, which takes a product's [M, N] as a channels_last [M, N, 1, 1]).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..ir import Node
from ..kernels.activations import activation_args
from ..kernels.sparse_gemm import (
    BACKENDS,
    CUSPARSELT_ALGORITHMS,
    CUTLASS_ACTIVATIONS,
    backend_problem,
    compress,
    shape_problem,
    sparse_linear,
)
from ..kernels.triton.conv import conv_epilogue_nhwc
from ..ops.fused import DOMAIN, apply_activation
from ..ops.structured_sparsity import is_2to4, weight_matrix
from .base import Kernel, PerWeight, Tactic, register_tactic
from .vendor import CublasInt8GemmTactic, _linear_operands_problem

SPARSE_FAMILY = "sparse"
_GEMM, _CONV = f"{DOMAIN}::FusedGemm", f"{DOMAIN}::FusedConv"


@register_tactic
class SemiStructuredTactic(Tactic):
    """FusedGemm and 1×1 FusedConv with a 2:4 weight as a sparse product and its epilogue (module docstring)."""

    family = SPARSE_FAMILY
    name = "semi-structured"
    op_types = (_GEMM, _CONV)
    precisions = ("fp16", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA (sparse tensor cores)"
        matrix = weight_matrix(node)
        if matrix is None:
            return "a FusedGemm with a constant weight, or a 1×1 convolution without groups or dilation"
        a = node.attributes
        if node.op_type == "FusedGemm":
            if float(a.get("alpha", 1.0)) != 1.0 or float(a.get("beta", 1.0)) != 1.0:
                return "alpha and beta of 1 only"
            problem = _linear_operands_problem(node, matrix.shape[0])
            if problem:
                return problem
        else:
            if any(a.get("pads") or ()) or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
                return "a 1×1 convolution without padding"
            bias = node.inputs[2] if len(node.inputs) > 2 else None
            if bias is not None and not bias.is_const:
                return "the bias must be a constant"
        return _sparse_problem(matrix, device)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        """Per backend, the epilogue after the product in torch's in-place ops, and, where the layer has more than a
        bias to apply, in one Triton pass (`conv_epilogue_nhwc`) instead."""
        epilogues = ["torch"]
        a = node.attributes
        if a.get("pre") or a.get("post") or (len(node.inputs) > 3 and node.inputs[3] is not None):
            try:
                activation_args(a.get("pre", ""), a.get("pre_params", ()))
                activation_args(a.get("post", ""), a.get("post_params", ()))
                epilogues.append("triton")
            except ValueError:
                pass  # (an activation the Triton epilogue lacks: torch's ops only)
        return [{**c, "epilogue": e} for c in _backends(weight_matrix(node), effort) for e in epilogues]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        backend, one_pass = config["backend"], config["epilogue"] == "triton"
        algorithm = config.get("algorithm", 0)
        a = node.attributes
        conv = node.op_type == "FusedConv"
        strides = tuple(a.get("strides") or (1, 1)) if conv else (1, 1)
        transposed = bool(a.get("transB", 0))
        pre, pre_params = a.get("pre", ""), list(a.get("pre_params", ()))
        post, post_params = a.get("post", ""), list(a.get("post_params", ()))
        activations = (activation_args(pre, pre_params), activation_args(post, post_params)) if one_pass else None

        def matrix_of(w: torch.Tensor) -> torch.Tensor:
            if conv:
                return w.reshape(w.shape[0], w.shape[1])
            return w if transposed else w.t()

        packs = PerWeight(lambda w: compress(matrix_of(w), backend))

        def kernel(inputs):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            if conv:
                if strides != (1, 1):
                    x = x[:, :, :: strides[0], :: strides[1]]
                batch, channels, height, width = x.shape
                rows = x.permute(0, 2, 3, 1).reshape(-1, channels)
                shaped = (batch, height, width)
            else:
                rows = x.reshape(-1, x.shape[-1])
                shaped = (rows.shape[0], 1, 1)  # [M, N] as a channels_last [M, N, 1, 1]
            bias = None if b is None else b.reshape(-1)  # (the variant converted it to the layer's type)
            if one_pass:  # the product alone, then bias, activations and residual in one Triton pass, in place
                acc = sparse_linear(rows, packs(w), algorithm=algorithm).view(*shaped, -1).permute(0, 3, 1, 2)
                residual = z if conv or z is None else z.reshape(acc.shape)
                y = conv_epilogue_nhwc(acc, bias, residual, pre=activations[0], post=activations[1], out=acc)
                return (y if conv else y.view(*x.shape[:-1], y.shape[1]),)
            inside = CUTLASS_ACTIVATIONS.get(pre) if backend == "cutlass" and z is None else None
            y = sparse_linear(rows, packs(w), bias, inside, algorithm=algorithm)
            y = y.view(*shaped, -1).permute(0, 3, 1, 2) if conv else y.view(*x.shape[:-1], y.shape[-1])
            if inside is None:
                y = apply_activation(y, pre, pre_params)
            if z is not None:
                y = y.add_(z)
            return (apply_activation(y, post, post_params),)

        return kernel


@register_tactic
class SemiStructuredInt8Tactic(CublasInt8GemmTactic):
    """int8 QuantizedGemm whose weight Bq has the 2:4 pattern along K: `vendor.cublas-int8` with the product on the
    sparse tensor cores instead (cuSPARSELt or CUTLASS, exact int32 sums; the same epilogue after it)."""

    family = SPARSE_FAMILY
    name = "semi-structured-int8"

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA (sparse tensor cores)"
        if node.attributes.get("quant", "int8") != "int8":
            return "int8 only"
        return _sparse_problem(weight_matrix(node), device)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        return _backends(weight_matrix(node), effort)

    def product(self, config: dict[str, Any]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        packs = PerWeight(lambda w: compress(w.t(), config["backend"]))

        def sparse(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return sparse_linear(q.contiguous(), packs(w), out_dtype=torch.int32, algorithm=config.get("algorithm", 0))

        return sparse


def _backends(matrix: torch.Tensor | None, effort: int = 0) -> list[dict[str, Any]]:
    """The configurations of each backend that can take `matrix` (W [N, K]): CUTLASS's one, cuSPARSELt's algorithms
    at `effort`."""
    if matrix is None:
        return []
    int8 = matrix.dtype == torch.int8
    configs = []
    for backend in BACKENDS:
        if backend_problem(backend) is None and shape_problem(*matrix.shape, backend, int8) is None:
            if backend == "cusparselt":
                algorithms = CUSPARSELT_ALGORITHMS[min(effort, max(CUSPARSELT_ALGORITHMS))]
                configs += [{"backend": backend, "algorithm": a} for a in algorithms]
            else:
                configs.append({"backend": backend})
    return configs


def _sparse_problem(matrix: torch.Tensor | None, device: torch.device) -> str | None:
    """Why the sparse kernels cannot take the weight matrix `matrix` on CUDA `device`, or None."""
    if matrix is None:
        return "the weight is not a constant matrix"
    if not is_2to4(matrix):
        return "the weight is not 2:4 sparse (at most two nonzeros in every four along K); --sparsity force prunes"
    if torch.cuda.get_device_capability(device) < (8, 0):
        return "sparse tensor cores need compute capability 8.0 or later"
    if not _backends(matrix):
        int8 = matrix.dtype == torch.int8
        problems = [backend_problem(b) or shape_problem(*matrix.shape, b, int8) for b in BACKENDS]
        return "; ".join(p for p in problems if p)
    return None
