"""Tactics of our int8 CPU kernel (`kernels.cpu.quantized_pointwise`, AVX-512 VNNI):

- `cpu.pointwise-int8`: an int8 QuantizedConv that is a 1×1 convolution of one group, unpadded, any stride (every
  s-th pixel, read through its strides), with its whole epilogue, the input quantized per tensor (a float32 input
  quantized by the kernel, an int8 one from the layer before as it is), a float or int8 residual, a float or int8
  output; float ones in the variant's type (float32, or bf16 on a CPU with AVX512-BF16).
- `cpu.gemm-int8`: an int8 QuantizedGemm, the same kernel over A's rows, a residual of the output's shape.
- `cpu.conv-int8`: an int8 QuantizedConv of one group and any other window, stride, dilation and padding (ResNet's
  3×3 layers, a stem) as a direct convolution (`kernels.cpu.quantized_conv`), the same epilogue.

Both decline off the CPU, on a CPU without AVX-512 VNNI, where no C++ compiler or ninja is found, for per-channel
input scales (the depthwise layers') and for activations the kernel lacks.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir import Node
from ..kernels.cpu import quantized_conv as qc
from ..kernels.cpu import quantized_pointwise as qp
from ..kernels.cpu.extension import compiler_problem
from ..ops.fused import DOMAIN
from .base import Kernel, PerWeight, Tactic, register_tactic
from .cpu_family import _activation, _activations_reason, _window
from .variant import float_type
from .vendor import _linear_operands_problem


def _quantized_reason(node: Node, device: torch.device) -> str | None:
    """Why the int8 kernel cannot run `node` on `device` whatever its shape, or None."""
    if device.type != "cpu":
        return "a CPU kernel"
    if node.attributes.get("quant", "int8") != "int8":
        return f"int8 only, not {node.attributes.get('quant')}"
    if len(node.inputs) > 5 and node.inputs[5] is not None:
        return "per-tensor input scales only (no per-channel Xs)"
    if not node.inputs[1].is_const:
        return "the weight must be a constant (it is packed once)"
    return _activations_reason(node, ("pre", "post"), qp.ACTIVATIONS)


def _scales(node: Node) -> tuple[float, float, float]:
    a = node.attributes
    return float(a["x_scale"]), float(a.get("z_scale", 0.0)), float(a.get("y_scale", 0.0))


class _CpuQuantized(Tactic):
    family = "cpu"
    precisions = ("fp32", "bf16")  # bf16: float inputs, residuals and outputs in bf16 (a CPU with AVX512-BF16)
    sees_precision = True  # a float output in the variant's type, also of an int8 input

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"tile": list(tile)} for tile in qp.TILES]


@register_tactic
class CpuQuantizedPointwiseTactic(_CpuQuantized):
    """The int8 weight [K, C, 1, 1] packed once with its dequantizing factors x_scale · Ws and bias; a strided
    layer reads every s-th pixel of its input as a view."""

    name = "pointwise-int8"
    op_types = (f"{DOMAIN}::QuantizedConv",)
    layouts = ("NHWC",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _quantized_reason(node, device)
        if reason:
            return reason
        weight, a = node.inputs[1], node.attributes
        if weight.rank != 4 or list(weight.shape[2:]) != [1, 1]:
            return f"1×1 convolutions only; the weight has shape {list(weight.shape)}"
        if a.get("group", 1) != 1:
            return f"one group only, not {a['group']}"
        if any(a.get("pads") or ()) or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return "no padding"
        if any(d != 1 for d in a.get("dilations") or ()):
            return "no dilation"
        return qp.problem() or compiler_problem()

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        epilogue = (*_activation(node, "pre"), *_activation(node, "post"))
        tile = tuple(config["tile"])
        x_scale, z_scale, y_scale = _scales(node)
        floats = float_type(config)
        strides = list(node.attributes.get("strides") or [1, 1])
        convs = PerWeight(lambda w, s, b: qp.QuantizedPointwise(w.flatten(1), s, x_scale, b, *epilogue, tile))

        def kernel(inputs):
            x, w, b, z, w_scale = (list(inputs) + [None] * 5)[:5]
            if strides != [1, 1]:
                x = x[:, :, :: strides[0], :: strides[1]]
            return (convs(w, w_scale, b)(x, z, z_scale, y_scale, float_type=floats),)

        return kernel


@register_tactic
class CpuQuantizedGemmTactic(_CpuQuantized):
    """QuantizedGemm `post(pre(Q(A) @ Bq · x_scale · Bs + C) + Z)`: the int8 kernel over A's rows (pixels of a 1×1
    image), Bq [K, N] packed once; the residual Z must be the output's shape."""

    name = "gemm-int8"
    op_types = (f"{DOMAIN}::QuantizedGemm",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _quantized_reason(node, device)
        if reason:
            return reason
        weight = node.inputs[1]
        if weight.rank != 2:
            return "the weight must be a constant matrix [K, N]"
        residual = node.inputs[3] if len(node.inputs) > 3 else None
        if residual is not None and residual.shape != node.outputs[0].shape:
            return "a residual of the output's shape only"
        return _linear_operands_problem(node, weight.shape[1]) or qp.problem() or compiler_problem()

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        epilogue = (*_activation(node, "pre"), *_activation(node, "post"))
        tile = tuple(config["tile"])
        x_scale, z_scale, y_scale = _scales(node)
        floats = float_type(config)

        def derive(w, s, b):
            return qp.QuantizedPointwise(w.t(), s, x_scale, None if b is None else b.reshape(-1), *epilogue, tile)

        products = PerWeight(derive)

        def kernel(inputs):
            a, w, b, z, w_scale = (list(inputs) + [None] * 5)[:5]
            product = products(w, w_scale, b)
            rows = a.reshape(-1, a.shape[-1])[:, :, None, None]
            residual = None if z is None else z.reshape(-1, product.channels)[:, :, None, None]
            y = product(rows, residual, z_scale, y_scale, float_type=floats)
            return (y.reshape(*a.shape[:-1], product.channels),)

        return kernel


@register_tactic
class CpuQuantizedConvTactic(_CpuQuantized):
    """The int8 weight [K, C, KH, KW] packed once with its dequantizing factors and bias; the padding and output
    size worked out once per input size. Not for an unpadded 1×1 layer (`cpu.pointwise-int8`'s)."""

    name = "conv-int8"
    op_types = (f"{DOMAIN}::QuantizedConv",)
    layouts = ("NHWC",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _quantized_reason(node, device)
        if reason:
            return reason
        weight, a = node.inputs[1], node.attributes
        if weight.rank != 4:
            return f"2-D convolutions only; the weight has rank {weight.rank}"
        if a.get("group", 1) != 1:
            return f"one group only, not {a['group']}"
        if list(weight.shape[2:]) == [1, 1] and not any(a.get("pads") or ()):
            return "an unpadded 1×1 layer is the int8 1×1 kernel's"
        return qp.problem() or compiler_problem()

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"tile": list(tile)} for tile in qc.TILES]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        epilogue = (*_activation(node, "pre"), *_activation(node, "post"))
        tile = tuple(config["tile"])
        x_scale, z_scale, y_scale = _scales(node)
        floats = float_type(config)
        a = node.attributes
        strides, dilations = list(a.get("strides") or [1, 1]), list(a.get("dilations") or [1, 1])
        convs = PerWeight(lambda w, s, b: qc.QuantizedConv(w, s, x_scale, b, strides, dilations, *epilogue, tile=tile))
        window = _window(node)

        def kernel(inputs):
            x, w, b, z, w_scale = (list(inputs) + [None] * 5)[:5]
            conv = convs(w, w_scale, b)
            pads, out_hw = window(tuple(x.shape[2:]), conv.kernel)
            return (conv(x, pads, out_hw, z, z_scale, y_scale, float_type=floats),)

        return kernel
