"""Float fallback for quantized layers: a QuantizedConv (QuantizedGemm) run as the float FusedConv (FusedGemm) it
was made from.

An int8 layer is not always faster than its float version: small or depthwise convolutions on the CPU spend more on
quantizing their input than they save. `fallback.float-conv` lets the autotuner time the layer in float too, as
TensorRT does with precisions that are allowed rather than required: the weight dequantized once (`Wq · Ws`), the
activation left unquantized, then a float FusedConv kernel (oneDNN's or cuDNN's fused convolution, our CPU 1×1,
depthwise, stem, direct and Winograd kernels, our CUDA and Triton depthwise kernels, our Triton implicit GEMM or
torch's convolution: the configurations of this tactic), or a float FusedGemm one (oneDNN's linear, our CPU GEMM,
cuBLAS, our warp-specialized Gluon or Triton GEMM, torch's product). Its results are those of the float layer,
not of the int8 one, so the autotuner checks it against that layer (`Tactic.semantics`): it is at least as
accurate as the quantized layer it replaces.

Between chained quantized layers (`passes.quant_chain`) it stays a per-layer fallback: a quantized input is
dequantized (`X · x_scale`, rounded once to the variant's float type; a quantized residual likewise,
`Z · z_scale`, unless the float kernel adds it quantized itself: `Tactic.adds_quantized_residual`) and a quantized
output (`y_scale`) quantized as the reference does.
With a quantized input the float layer on DQ(X) is the quantized layer itself up to float rounding (Q(X) = X
there), so such a layer is checked against its own reference; a float input with a quantized residual against the
float layer adding the residual's real values.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir import DType, Node, Value
from ..ops.fused import (
    DOMAIN,
    FLOAT_LAYERS,
    QUANT_ATTRIBUTES,
    QUANTIZED_DTYPES,
    dequantized_weight,
    is_quantized_tensor,
    requantize,
)
from .base import Kernel, Tactic, register_tactic, tactic_by_key
from .variant import float_type

# The float tactics tried for each quantized op, each in its first configuration fitted to the layer; those that do
# not run the layer on the device fail at build and score inf.
_INNER = {
    "QuantizedConv": (
        "vendor.onednn-fused",
        "cpu.pointwise",
        "cpu.depthwise",
        "cpu.stem-conv",
        "cpu.patchify",
        "cpu.conv",
        "cpu.winograd",
        "vendor.cudnn-fused",
        "cuda.depthwise",
        "triton.depthwise",
        "triton.conv-igemm",
        "triton.conv-s2d",
        "vendor.torch-direct",
    ),
    "QuantizedGemm": (
        "vendor.onednn-linear",
        "cpu.gemm",
        "vendor.cublas-gemm",
        "gluon.gemm-ws",
        "triton.gemm",
        "reference.registry",
    ),
}


def float_twin(node: Node) -> Node:
    """The float layer that quantized `node` quantizes: the same activation and residual (in float, dequantized
    when `node` reads them quantized), bias, the dequantized weight, the conv (or none) and epilogue
    attributes, a float output (a detached node, not in any graph). QuantizedConv weights are [Cout, ...] with
    scales over axis 0; QuantizedGemm weights [K, N] over axis 1."""
    weight = dequantized_weight(node.op_type, node.inputs[1].const, node.inputs[4].const)
    w = Value(f"{node.inputs[1].name}.dequantized", DType.FLOAT, tuple(weight.shape), const=weight)
    bias = _detached(node.inputs[2]) if len(node.inputs) > 2 else None
    residual = _detached(node.inputs[3], as_float=True) if len(node.inputs) > 3 else None
    inputs = [_detached(node.inputs[0], as_float=True), w, bias, residual]
    while inputs[-1] is None:
        inputs.pop()
    attributes = {k: v for k, v in node.attributes.items() if k not in QUANT_ATTRIBUTES}
    outputs = [Value(v.name, _float(v.dtype), v.shape) for v in node.outputs]
    return Node(FLOAT_LAYERS[node.op_type], inputs, outputs, attributes, domain=DOMAIN, name=node.name)


_QUANTIZING = (*FLOAT_LAYERS, "LayerNormalization")  # the domain's ops whose `y_scale` quantizes their output


def output_quantization(node: Node) -> dict[int, tuple[float, str]]:
    """The outputs `node` writes quantized (a quantized layer, or a layer norm, with `y_scale`): output index ->
    (scale, quantized type); empty for float outputs and for other ops."""
    quantizing = node.domain == DOMAIN and node.op_type in _QUANTIZING
    scale = float(node.attributes.get("y_scale", 0.0)) if quantizing else 0.0
    return {0: (scale, node.attributes.get("quant", "int8"))} if scale else {}


def with_float_output(node: Node) -> Node:
    """A detached copy of `node` (a quantized layer or layer norm with `y_scale`) that writes Y in float
    (`y_scale` 0): the values its quantized output rounds, which a kernel's quantized output is checked against."""
    inputs = [_detached(v) for v in node.inputs]
    attributes = {k: v for k, v in node.attributes.items() if k != "y_scale"}
    outputs = [Value(v.name, _float(v.dtype), v.shape) for v in node.outputs]
    return Node(node.op_type, inputs, outputs, attributes, domain=node.domain, name=node.name)


def reads_quantized(node: Node) -> bool:
    """Whether quantized `node` reads an activation that is already quantized (from a chained producer)."""
    return node.inputs[0] is not None and node.inputs[0].dtype in QUANTIZED_DTYPES


def _float(dtype: DType) -> DType:
    return DType.FLOAT if dtype in QUANTIZED_DTYPES else dtype


def _detached(value: Value | None, as_float: bool = False) -> Value | None:
    """A copy of `value` outside any graph, so the twin adds no use to the real graph's values (`as_float`: a
    quantized activation declared float, as its dequantized values)."""
    if value is None:
        return None
    return Value(value.name, _float(value.dtype) if as_float else value.dtype, value.shape, const=value.const)


def _cpu_kernel_declines(key: str, twin: Node) -> bool:
    """Whether `key` is one of our CPU kernels' tactics and declines `twin` on the CPU."""
    tactic = tactic_by_key(key)
    return tactic is not None and tactic.family == "cpu" and tactic.supports(twin, 1, torch.device("cpu")) is not None


class _FloatFallback(Tactic):
    family = "fallback"  # its own family: `--families` without it keeps every quantized layer quantized
    op: str
    precisions = ("fp32", "fp16", "bf16")
    sees_precision = True  # dequantizes quantized activations into the variant's float type
    precision_from_constants = True  # and computes in it

    def semantics(self, node: Node) -> Node | None:
        return None if reads_quantized(node) else float_twin(node)

    def semantic_inputs(self, node: Node, inputs: list[Any]) -> list[Any]:
        z_scale = float(node.attributes.get("z_scale", 0.0))
        if not z_scale or len(inputs) <= 3 or inputs[3] is None:
            return inputs
        return [*inputs[:3], inputs[3].float() * z_scale, *inputs[4:]]  # DQ(Z), as the twin adds it

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if node.attributes.get("explicit", 0):
            return "the model's own Q/DQ prescribe this layer's int8 arithmetic"
        if not node.inputs[1].is_const or len(node.inputs) < 5 or node.inputs[4] is None:
            return "needs the constant quantized weight and its scales"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"inner": key} for key in _INNER[self.op]]

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        """`space`, less our CPU kernels that cannot run the layer's float twin (the 1×1 kernel on a 3×3 layer),
        which would score inf in every build."""
        twin = float_twin(node)
        return [config for config in self.space(effort) if not _cpu_kernel_declines(config["inner"], twin)]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        twin = float_twin(node)
        inner = tactic_by_key(config.get("inner", _INNER[self.op][-1]))
        reason = "not registered" if inner is None else inner.supports(twin, opset, device)
        if reason is not None:
            raise ValueError(f"{config.get('inner')} does not run this layer here: {reason}")
        x_scale, quant = float(node.attributes["x_scale"]), node.attributes.get("quant", "int8")
        y_scale, z_scale = float(node.attributes.get("y_scale", 0.0)), float(node.attributes.get("z_scale", 0.0))
        dequantize_z = z_scale and not inner.adds_quantized_residual
        if z_scale and not dequantize_z:
            twin.attributes["z_scale"] = z_scale  # the inner kernel adds Z · z_scale itself
        kernel = inner.build(twin, opset, device, inner.space_for(twin, 0)[0])
        dequantized = twin.inputs[1].const
        weights: dict[tuple[torch.dtype, bool], torch.Tensor] = {}
        dtype = float_type(config)

        def run(inputs):
            x, _, b, z, _ = (list(inputs) + [None] * 5)[:5]
            if is_quantized_tensor(x):  # DQ(X), the quantized activation's real values, in the variant's type
                x = x.to(dtype) * x_scale
            if dequantize_z:
                z = z.to(dtype) * z_scale
            channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            key = (x.dtype, channels_last)
            if key not in weights:
                fmt = torch.channels_last if channels_last and dequantized.dim() == 4 else torch.contiguous_format
                weights[key] = dequantized.to(x.device, x.dtype).contiguous(memory_format=fmt)
            outputs = kernel([x, weights[key], b, z][: len(twin.inputs)])
            if not y_scale:
                return outputs
            return (requantize(outputs[0], y_scale, quant, outputs[0].dtype), *outputs[1:])

        return run


@register_tactic
class FloatConvFallbackTactic(_FloatFallback):
    name = "float-conv"
    op = "QuantizedConv"
    op_types = (f"{DOMAIN}::QuantizedConv",)
    layouts = ("NHWC", "NCHW")


@register_tactic
class FloatGemmFallbackTactic(_FloatFallback):
    name = "float-gemm"
    op = "QuantizedGemm"
    op_types = (f"{DOMAIN}::QuantizedGemm",)
