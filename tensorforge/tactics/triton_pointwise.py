"""Triton tactics for memory-bound layers: generated FusedPointwise kernels, softmax and layer norm (CUDA)."""

from __future__ import annotations

from typing import Any

import torch

from ..ir import DType, Node
from ..kernels.triton.norm import layer_norm, row_configs, softmax
from ..kernels.triton.pointwise import PointwiseKernel, UnsupportedPointwise, pointwise_configs
from ..ops.fused import DOMAIN, QUANT_TYPES
from .base import Kernel, Tactic, allocate, register_tactic, statistics_reason

_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.BFLOAT16)


def _scalar_constants(node: Node) -> dict[int, float]:
    """Inputs known at build time that hold one number (a Pow exponent is baked into the kernel)."""
    found = {}
    for index, value in enumerate(node.inputs):
        const = value.const if value is not None and value.is_const else None
        if isinstance(const, torch.Tensor) and const.numel() == 1 and not const.dtype.is_complex:
            found[index] = float(const.item())
    return found


def _pointwise(node: Node) -> PointwiseKernel:
    return PointwiseKernel(
        node.attributes["program"], len(node.inputs), node.attributes.get("outputs"), _scalar_constants(node)
    )


@register_tactic
class TritonPointwiseTactic(Tactic):
    """A FusedPointwise program as one generated kernel: every input read once, every output written once."""

    family = "triton"
    name = "pointwise"
    op_types = (f"{DOMAIN}::FusedPointwise",)
    precisions = ("fp32", "fp16", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA"
        if any(v is None or not v.dtype.has_torch for v in node.inputs):
            return "an input is missing or has no torch type"
        try:
            _pointwise(node).check([v.dtype.torch for v in node.inputs])
        except (UnsupportedPointwise, ValueError) as err:
            return str(err)
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return pointwise_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        program = _pointwise(node)
        launch = dict(config) if config else pointwise_configs(0)[0]
        return lambda inputs: program(*inputs, config=launch)


def _last_axis_float(node: Node, axis: int) -> str | None:
    x = node.inputs[0]
    if x.rank is None or x.rank == 0:
        return "the input rank is unknown or 0"
    if x.dtype not in _FLOATS:
        return f"float16/bfloat16/float32 only, got {x.dtype}"
    if axis % x.rank != x.rank - 1:
        return f"the last axis only; this layer normalizes over axis {axis} of a rank-{x.rank} input"
    return None


@register_tactic
class TritonSoftmaxTactic(Tactic):
    """Softmax along the last axis, one tile of rows per program."""

    family = "triton"
    name = "softmax"
    writes_into = True
    op_types = ("Softmax", f"{DOMAIN}::Softmax")
    precisions = ("fp32", "fp16", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA"
        legacy = node.domain in ("", "ai.onnx") and opset < 13
        return _last_axis_float(node, node.attributes.get("axis", 1 if legacy else -1))

    def space(self, effort: int) -> list[dict[str, Any]]:
        return row_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        launch = dict(config) if config else row_configs(0)[0]

        def kernel(inputs, alloc=None):
            x = inputs[0]
            return (softmax(x, config=launch, out=allocate(alloc, 0, x.shape, x.dtype, x.device)),)

        return kernel


@register_tactic
class TritonLayerNormTactic(Tactic):
    """LayerNormalization over axes [axis, rank) in float32, scale and bias in the same pass; with a `y_scale`, Y
    quantized onto its int8 or E4M3 grid there too, and Y itself beside it for the domain norm's second output."""

    family = "triton"
    name = "layernorm"
    writes_into = True
    op_types = ("LayerNormalization", f"{DOMAIN}::LayerNormalization")
    precisions = ("fp32", "fp16", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA"
        reason = statistics_reason(node, quantizes=True)
        if reason:
            return reason
        x = node.inputs[0]
        if x.rank is None or x.rank == 0 or x.dtype not in _FLOATS:
            return f"a float16/bfloat16/float32 input of known rank only, got {x.dtype} rank {x.rank}"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return row_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        a = node.attributes
        axis, epsilon, y_scale = a.get("axis", -1), float(a.get("epsilon", 1e-5)), float(a.get("y_scale", 0.0))
        quantized = QUANT_TYPES[a.get("quant", "int8")].torch if y_scale else None
        launch = dict(config) if config else row_configs(0)[0]
        both = len(node.outputs) > 1

        def kernel(inputs, alloc=None):
            x, scale, bias = (list(inputs) + [None] * 3)[:3]
            out = allocate(alloc, 0, x.shape, quantized or x.dtype, x.device)
            copy = allocate(alloc, 1, x.shape, x.dtype, x.device) if both else None
            y = layer_norm(
                x, scale, bias, axis=axis, epsilon=epsilon, config=launch, out=out, y_scale=y_scale, copy=copy
            )
            return (y, copy) if both else (y,)

        return kernel
