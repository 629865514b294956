"""The reference and vendor tactic families.

- `reference.registry`: any op, through the op registry's torch reference implementation (the fallback every
  layer has, and the ground truth the autotuner checks other candidates against).
- `vendor.torch-direct`: FusedConv through torch's own convolution (oneDNN on the CPU, cuDNN on CUDA) with the
  epilogue applied after it; faster than the reference's im2col + GEMM on the CPU, less accurate there.
- `vendor.torch-quantized`: QuantizedConv through torch's float convolution (oneDNN / cuDNN, full float32) on
  the quantized values, which float32 holds exactly: the reference's numbers, faster (no int8 tensor cores).
  Every quantized tactic here also reads an already quantized input and writes a quantized output (`y_scale`,
  `passes.quant_chain`), or says why not.
- `vendor.cudnn-fused`: FusedConv as one cuDNN call with bias, residual and ReLU inside
  (`torch.cudnn_convolution_relu` / `cudnn_convolution_add_relu`).
- `vendor.onednn-fused`: FusedConv on the CPU as one oneDNN call with its post-ops and a pre-reordered weight.
- `vendor.onednn-linear`: FusedGemm with a constant weight on the CPU as one oneDNN linear with its bias,
  activation or residual add as post-ops and the weight packed once.
- `vendor.onednn-qconv`: int8 QuantizedConv on the CPU as oneDNN's int8 convolution (VNNI), float32 or int8 out.
- `vendor.onednn-qlinear`: int8 QuantizedGemm on the CPU as oneDNN's int8 linear (VNNI), float32 or int8 out.
- `vendor.cublas-int8`: int8 QuantizedGemm on CUDA as cuBLAS's int8 product (`torch._int_mm`), exact int32 sums;
  the weight read as it is or as the transposed view cuBLASLt's int8 tensor cores take.
- `vendor.cublas-gemm`: FusedGemm with a constant weight on CUDA as one cuBLASLt product with its bias (and ReLU)
  inside (`torch.addmm` / `_addmm_activation`), the rest of the epilogue in place on the output after it.
- `vendor.torch-maxpool`: MaxPool through torch's pooling kernels.
- `vendor.torch-avgpool`: AveragePool through torch's, where its padding and count rules are ONNX's.
- `vendor.torch-upsample-nearest`: Resize, nearest, by integer factors on H and W as torch's `interpolate`
  (exact there: output pixel o reads input pixel o // s); 8× the reference on the CPU for YOLO's neck.
- `vendor.torch-sdpa`: Attention through torch's `scaled_dot_product_attention` (flash / memory-efficient /
  fused CPU kernels: the score matrix is not written out).
- `vendor.torch-layernorm`: LayerNormalization as torch's one-pass `layer_norm` (statistics in float32).
- `vendor.torch-squeeze-excite`: SqueezeExcite as a mean, two `F.linear` products (MKL's matrix-vector kernels,
  with the weights reshaped once) and the gating product: five or six torch calls instead of four layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..ir import DType, Node
from ..kernels.cpu.avx512 import vnni
from ..ops import load_all
from ..ops.conv import convolution
from ..ops.fused import (
    DOMAIN,
    apply_activation,
    dequantize_scales,
    epilogue,
    input_scale,
    is_quantized_tensor,
    output_dtype,
    quantize_activation,
    quantized_input,
    requantize,
    residual_values,
)
from ..ops.pool import PoolWindows, window_geometry
from ..ops.registry import REGISTRY, OpContext
from ..passes.utils import is_depthwise
from .base import Kernel, PerWeight, Tactic, register_tactic, statistics_reason
from .channel_scales import ChannelScales
from .upsample import upsample_factors

_FUSED_CONV = f"{DOMAIN}::FusedConv"
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _context(node: Node, opset: int, device: torch.device) -> OpContext:
    return OpContext(node=node, opset=opset, device=device, output_dtypes=tuple(v.dtype for v in node.outputs))


@register_tactic
class ReferenceTactic(Tactic):
    family = "reference"
    name = "registry"

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        load_all()
        if REGISTRY.lookup(node.op_type, node.domain, opset) is None:
            return "the registry has no implementation"
        if any(True for _ in node.subgraphs()):
            return "control flow runs on the executor, not as a kernel"
        return None

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        load_all()
        impl = REGISTRY.lookup(node.op_type, node.domain, opset).impl
        ctx = _context(node, opset, device)
        attributes = dict(node.attributes)

        def kernel(inputs):
            result = impl(ctx, *inputs, **attributes)
            return result if isinstance(result, tuple) else (result,)

        return kernel


def _conv_attributes(node: Node) -> dict[str, Any]:
    return {k: node.attributes.get(k) for k in _CONV_ATTRS if k in node.attributes}


def _epilogue_attributes(node: Node) -> tuple[str, list[float], str, list[float]]:
    a = node.attributes
    return a.get("pre", ""), list(a.get("pre_params", ())), a.get("post", ""), list(a.get("post_params", ()))


@register_tactic
class TorchDirectConvTactic(Tactic):
    family = "vendor"
    name = "torch-direct"
    op_types = (_FUSED_CONV,)
    layouts = ("NCHW", "NHWC")

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        conv = _conv_attributes(node)
        pre, pre_params, post, post_params = _epilogue_attributes(node)

        def kernel(inputs):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            y = convolution(
                x,
                w,
                None,
                conv.get("auto_pad", "NOTSET"),
                conv.get("dilations"),
                conv.get("group", 1),
                conv.get("pads"),
                conv.get("strides"),
                algorithm="direct",
            )
            spatial = y.dim() - 2
            return (epilogue(y, b, z, pre, pre_params, post, post_params, lambda t: (-1, *[1] * spatial)),)

        return kernel


@register_tactic
class TorchQuantizedConvTactic(Tactic):
    family = "vendor"
    name = "torch-quantized"
    op_types = (f"{DOMAIN}::QuantizedConv",)
    layouts = ("NCHW", "NHWC")

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        conv = _conv_attributes(node)
        pre, pre_params, post, post_params = _epilogue_attributes(node)
        x_scale, quant = float(node.attributes["x_scale"]), node.attributes.get("quant", "int8")
        y_scale, z_scale = float(node.attributes.get("y_scale", 0.0)), float(node.attributes.get("z_scale", 0.0))
        weights: dict[tuple[int, bool], tuple[torch.Tensor, torch.Tensor]] = {}  # (ptr, NHWC) -> (kept, float)

        def float_weight(w: torch.Tensor, channels_last: bool) -> torch.Tensor:
            key = (w.data_ptr(), channels_last)
            if key not in weights:
                fmt = torch.channels_last if channels_last and w.dim() == 4 else torch.contiguous_format
                weights[key] = (w, w.float().contiguous(memory_format=fmt))
            return weights[key][1]

        def kernel(inputs):
            x, w, b, z, w_scale, x_channels = (list(inputs) + [None] * 6)[:6]
            channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            acc = convolution(
                quantized_input(x, input_scale(x_scale, x_channels), quant), float_weight(w, channels_last), None,
                conv.get("auto_pad", "NOTSET"), conv.get("dilations"), conv.get("group", 1), conv.get("pads"),
                conv.get("strides"), algorithm="direct",
            )  # fmt: skip
            spatial = acc.dim() - 2
            scales = dequantize_scales(w_scale, x_scale, x_channels).reshape(-1, *[1] * spatial)
            z = residual_values(z, z_scale)
            y = epilogue(acc * scales, b, z, pre, pre_params, post, post_params, lambda t: (-1, *[1] * spatial))
            return (requantize(y, y_scale, quant, output_dtype(x)),)

        return kernel


@register_tactic
class CudnnFusedConvTactic(Tactic):
    family = "vendor"
    name = "cudnn-fused"
    op_types = (_FUSED_CONV,)
    layouts = ("NCHW", "NHWC")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA"
        pre, _, post, _ = _epilogue_attributes(node)
        residual = len(node.inputs) > 3 and node.inputs[3] is not None
        if residual and not (pre == "" and post == "Relu"):
            return f"cuDNN fuses a residual only as relu(conv + bias + z); this layer has pre={pre!r}, post={post!r}"
        if not residual and not (post == "" and pre in ("", "Relu")):
            return f"cuDNN fuses only ReLU; this layer has pre={pre!r}, post={post!r}"
        if len(node.inputs[1].shape or ()) != 4:
            return "cuDNN's fused call here is 2-D only"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        """cuDNN's own heuristic algorithm choice, and from effort 1 also its benchmark mode (it times its
        algorithms on the first call of each shape and keeps the fastest)."""
        return [{}] if effort == 0 else [{}, {"benchmark": True}]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        kernel = self._build(node)
        if not config.get("benchmark"):
            return kernel

        def benchmarked(inputs):
            previous = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = True
            try:
                return kernel(inputs)
            finally:
                torch.backends.cudnn.benchmark = previous

        return benchmarked

    def _build(self, node: Node) -> Kernel:
        conv = _conv_attributes(node)
        pre, _, _, _ = _epilogue_attributes(node)
        strides = list(conv.get("strides") or [1, 1])
        dilations = list(conv.get("dilations") or [1, 1])
        group = conv.get("group", 1)

        def kernel(inputs):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            begin, end, _ = window_geometry(
                x.shape[2:], w.shape[2:], strides, dilations, conv.get("pads"), conv.get("auto_pad", "NOTSET")
            )
            if begin != end:
                x = F.pad(x, [p for i in (1, 0) for p in (begin[i], end[i])])
                begin = [0, 0]
            bias = b if b is not None else torch.zeros(w.shape[0], dtype=x.dtype, device=x.device)
            if z is not None:
                y = torch.cudnn_convolution_add_relu(x, w, z, 1.0, bias, strides, begin, dilations, group)
            elif pre == "Relu":
                y = torch.cudnn_convolution_relu(x, w, bias, strides, begin, dilations, group)
            else:
                y = F.conv2d(x, w, bias, strides, begin, dilations, group)
            return (y,)

        return kernel


# FusedConv activations as oneDNN post-ops: (name, its scalars from the activation's parameters).
_ONEDNN_UNARY = {
    "": lambda p: ("none", []),
    "Relu": lambda p: ("relu", []),
    "Sigmoid": lambda p: ("sigmoid", []),
    "Tanh": lambda p: ("tanh", []),
    "HardSwish": lambda p: ("hardswish", []),
    "SiLU": lambda p: ("swish", []),
    "LeakyRelu": lambda p: ("leaky_relu", [p[0] if p else 0.01]),
    "Clip": lambda p: ("hardtanh", [p[0], p[1]]),
}


# Float convolutions and linear layers also take GELU (erf or tanh, oneDNN's "algorithm").
_ONEDNN_FLOAT_UNARY = {
    **_ONEDNN_UNARY,
    "Gelu": lambda p: ("gelu", ["none"]),
    "GeluTanh": lambda p: ("gelu", ["tanh"]),
}


def _onednn_float_post_op(name: str, params) -> tuple[str, list[float], str]:
    """(oneDNN's post-op, its scalars, its algorithm) for the fused activation `name` of a float layer."""
    unary, scalars = _ONEDNN_FLOAT_UNARY[name](params)
    return (unary, [], scalars[0]) if unary == "gelu" else (unary, scalars, "")


def _onednn_padding_problem(node: Node) -> str | None:
    """Why oneDNN's convolution call cannot take `node`'s padding (it takes explicit, symmetric pads), or None."""
    if node.attributes.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return "SAME auto-padding is computed per shape; explicit pads only"
    pads = list(node.attributes.get("pads") or [0, 0, 0, 0])
    if pads[:2] != pads[2:]:
        return f"oneDNN's call takes symmetric padding; pads are {pads}"
    return None


@register_tactic
class OneDnnFusedConvTactic(Tactic):
    """FusedConv on the CPU as one oneDNN call: convolution, bias, residual add and activation as post-ops,
    with the weight reordered once per input shape into oneDNN's blocked layout (`F.conv2d` reorders it on
    every call). Float32 or bf16 (on a CPU with bf16 dot products; float32 sums), 2-D. Its padding is worked
    out per input shape (SAME auto-padding too); oneDNN's call takes symmetric padding, so an asymmetric one
    (SAME with an odd total) is applied to the input first."""

    family = "vendor"
    name = "onednn-fused"
    op_types = (_FUSED_CONV,)
    precisions = ("fp32", "bf16")
    layouts = ("NHWC", "NCHW")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cpu":
            return "oneDNN runs on the CPU"
        if not torch.backends.mkldnn.is_available():
            return "this torch build has no oneDNN"
        if len(node.inputs[1].shape or ()) != 4:
            return "the fused oneDNN call here is 2-D only"
        pre, _, post, _ = _epilogue_attributes(node)
        residual = len(node.inputs) > 3 and node.inputs[3] is not None
        if residual and pre:
            return f"oneDNN applies one activation after the residual add; this layer has pre={pre!r} too"
        if not residual and post:
            return f"without a residual the activation is pre; this layer has post={post!r}"
        activation = post if residual else pre
        if activation not in _ONEDNN_FLOAT_UNARY:
            return f"oneDNN has no post-op for {activation!r} here"
        if residual and activation not in ("", "Relu"):
            return f"oneDNN follows a residual add only with ReLU; this layer has post={post!r}"
        return None

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        conv = _conv_attributes(node)
        pre, pre_params, post, post_params = _epilogue_attributes(node)
        residual = len(node.inputs) > 3 and node.inputs[3] is not None
        unary, scalars, algorithm = _onednn_float_post_op(*((post, post_params) if residual else (pre, pre_params)))
        strides = list(conv.get("strides") or [1, 1])
        dilations = list(conv.get("dilations") or [1, 1])
        group = conv.get("group", 1)
        mkldnn = torch.ops.mkldnn
        packed: dict[tuple[int, ...], torch.Tensor] = {}

        paddings: dict[tuple[int, ...], tuple[list[int], list[int] | None]] = {}

        def padding_for(spatial, kernel_hw) -> tuple[list[int], list[int] | None]:
            """(oneDNN's symmetric padding, the rest for F.pad first or None) for an input's spatial size, once."""
            if spatial not in paddings:
                begin, end, _ = window_geometry(
                    spatial, kernel_hw, strides, dilations, conv.get("pads"), conv.get("auto_pad", "NOTSET")
                )
                low = [min(first, last) for first, last in zip(begin, end, strict=True)]
                rest = [p for i in (1, 0) for p in (begin[i] - low[i], end[i] - low[i])] if begin != end else None
                paddings[spatial] = (low, rest)
            return paddings[spatial]

        def kernel(inputs):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            padding, rest = padding_for(tuple(x.shape[2:]), w.shape[2:])
            if rest is not None:  # oneDNN's call pads symmetrically: the rest goes on first
                x = F.pad(x, rest)
            key = (*x.shape, *padding)
            weight = packed.get(key)
            if weight is None:
                weight = mkldnn._reorder_convolution_weight(w, padding, strides, dilations, group, list(x.shape))
                packed[key] = weight
            if z is None:
                y = mkldnn._convolution_pointwise(
                    x, weight, b, padding, strides, dilations, group, unary, scalars, algorithm
                )
            else:
                after = None if unary == "none" else unary
                y = mkldnn._convolution_pointwise.binary(
                    x, z, weight, b, padding, strides, dilations, group, "add", 1.0, after, scalars, None
                )
            return (y,)

        return kernel


def _linear_operands_problem(node: Node, n: int) -> str | None:
    """Why a oneDNN linear cannot take `node`'s bias (a constant over its `n` output columns) or input (a
    matrix or a batch of them), or None."""
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None and (not bias.is_const or tuple(bias.shape or ()) not in ((n,), (1, n))):
        return f"the bias must be a constant over the {n} output columns"
    if node.inputs[0].rank is None or node.inputs[0].rank < 2:
        return "the input must be a matrix or a batch of them"
    return None


def onednn_int8_problem() -> str | None:
    """Why oneDNN's int8 kernels give wrong sums on this CPU, or None: without VNNI (`vpdpbusd`, AVX-512 or AVX)
    they multiply with `vpmaddubsw`, which adds each pair of uint8 × int8 products in int16 and saturates
    (2 · 255 · 127 > 32767), as our uint8 activations with their 128 offset reach (seen on an AVX2 CPU: errors of 8-15%
    of the output's range)."""
    if not vnni():
        return "oneDNN's int8 kernels saturate their pairs of products on a CPU without VNNI (vpdpbusd)"
    return None


def _uint8_activation(x: torch.Tensor, x_scale: float) -> torch.Tensor:
    """`x` quantized to int8 as the reference QuantizedConv / QuantizedGemm does (or `x` itself when it is int8
    already), offset to oneDNN's uint8 with zero point 128 (oneDNN's int8 products take unsigned activations):
    flipping the sign bit adds 128 to an int8's two's complement, one byte-wise pass."""
    q = x if x.dtype == torch.int8 else quantize_activation(x, x_scale, "int8")
    return torch.bitwise_xor(q.view(torch.uint8), 128)


def _onednn_output(y_scale: float, tail: bool) -> tuple[float, torch.dtype]:
    """oneDNN's output scale and type: int8 with `y_scale` when it writes the quantized output itself (nothing
    of the epilogue left for torch, the `tail`), else float32 (scale 1)."""
    return (y_scale, torch.int8) if y_scale and not tail else (1.0, torch.float32)


def _after_onednn(y, inside: bool, z, pre: str, pre_params, post: str, post_params, y_scale: float) -> torch.Tensor:
    """The part of the epilogue oneDNN did not run: the pre activation (unless it ran `inside`), then the
    residual add and the post activation, then the output quantization when oneDNN wrote float32."""
    if y.dtype == torch.int8:
        return y  # oneDNN ran all of it
    if not inside:
        y = apply_activation(y, pre, pre_params)
    if z is not None:
        y = apply_activation(y + z, post, post_params)
    return requantize(y, y_scale, "int8", torch.float32)


@register_tactic
class OneDnnLinearTactic(Tactic):
    """FusedGemm `post(pre(A @ op(B) + C) + Z)` on the CPU as one oneDNN linear: B a constant matrix (packed
    once per batch size), C a bias over the output columns, then one activation or the residual add. Float32 or
    bf16 (on a CPU with bf16 dot products; float32 sums)."""

    family = "vendor"
    name = "onednn-linear"
    op_types = (f"{DOMAIN}::FusedGemm",)
    precisions = ("fp32", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cpu":
            return "oneDNN runs on the CPU"
        if not torch.backends.mkldnn.is_available():
            return "this torch build has no oneDNN"
        a = node.attributes
        weight = node.inputs[1]
        if not weight.is_const or weight.rank != 2:
            return "the weight must be a constant matrix (it is packed once)"
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
            return "transA, alpha and beta are not oneDNN linear's"
        problem = _linear_operands_problem(node, weight.shape[0 if a.get("transB", 0) else 1])
        if problem:
            return problem
        pre, _, post, _ = _epilogue_attributes(node)
        residual = len(node.inputs) > 3 and node.inputs[3] is not None
        if residual and (pre or post):
            return "oneDNN linear adds a residual without an activation around it"
        if post and not residual:
            return f"without a residual the activation is pre; this layer has post={post!r}"
        if pre not in _ONEDNN_FLOAT_UNARY:
            return f"oneDNN has no linear post-op for {pre!r} here"
        return None

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        pre, pre_params, _, _ = _epilogue_attributes(node)
        unary, scalars, algorithm = _onednn_float_post_op(pre, pre_params)
        transposed = bool(node.attributes.get("transB", 0))
        mkldnn = torch.ops.mkldnn
        packed: dict[int, torch.Tensor] = {}

        def kernel(inputs):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            rows = x.reshape(-1, x.shape[-1])
            weight = packed.get(rows.shape[0])
            if weight is None:
                linear_weight = (w if transposed else w.t()).contiguous()
                weight = packed[rows.shape[0]] = mkldnn._reorder_linear_weight(linear_weight, rows.shape[0])
            bias = b.reshape(-1) if b is not None else None
            if z is None:
                y = mkldnn._linear_pointwise(rows, weight, bias, unary, scalars, algorithm)
            else:
                other = z.expand(*x.shape[:-1], weight.shape[0]).reshape(rows.shape[0], -1).contiguous()
                y = mkldnn._linear_pointwise.binary(rows, other, weight, bias, "add")
            return (y.reshape(*x.shape[:-1], y.shape[-1]),)

        return kernel


@register_tactic
class CublasGemmTactic(Tactic):
    """FusedGemm `post(pre(α·A @ op(B) + β·C) + Z)` on CUDA: cuBLASLt's product with the bias C (and a `pre` ReLU
    without a residual) in its epilogue, one call; any other activation, the residual and `post` then run in
    place on the output, one pass each. The product `reference.registry` runs too, but its epilogue widens to
    float32 and allocates at every step; this one is what cuBLAS gives with the fewest passes, for the autotuner
    to weigh against our fused Triton GEMMs layer by layer."""

    family = "vendor"
    name = "cublas-gemm"
    op_types = (f"{DOMAIN}::FusedGemm",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA (cuBLAS)"
        a = node.attributes
        weight = node.inputs[1]
        if not weight.is_const or weight.rank != 2:
            return "the weight must be a constant matrix"
        if a.get("transA", 0):
            return "transA is not supported"
        return _linear_operands_problem(node, weight.shape[0 if a.get("transB", 0) else 1])

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        pre, pre_params, post, post_params = _epilogue_attributes(node)
        alpha, beta = float(node.attributes.get("alpha", 1.0)), float(node.attributes.get("beta", 1.0))
        transposed = bool(node.attributes.get("transB", 0))
        fused_relu = pre == "Relu"

        def kernel(inputs):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            rows = x.reshape(-1, x.shape[-1])
            matrix = w.t() if transposed else w
            if b is None:
                y = torch.mm(rows, matrix) if alpha == 1.0 else torch.mm(rows, matrix).mul_(alpha)
                y = apply_activation(y, pre, pre_params)
            elif fused_relu and z is None and alpha == 1.0 and beta == 1.0:
                y = torch._addmm_activation(b.reshape(-1), rows, matrix, use_gelu=False)
            else:
                y = torch.addmm(b.reshape(-1), rows, matrix, beta=beta, alpha=alpha)
                y = apply_activation(y, pre, pre_params)
            if z is not None:
                y.add_(z.reshape(y.shape))
            y = apply_activation(y, post, post_params)
            return (y.reshape(*x.shape[:-1], y.shape[-1]),)

        return kernel


@register_tactic
class OneDnnQuantizedConvTactic(Tactic):
    """int8 QuantizedConv on the CPU through oneDNN: the activation quantized (as the reference does; an int8
    input as it is) and offset to uint8 with zero point 128, the weight packed once per input shape, int32 sums
    dequantized by x_scale × the weight scales and the bias added in float32 by oneDNN; an activation it has as
    a post-op runs inside. A residual of the output's shape followed by nothing or a ReLU is oneDNN's sum
    post-op (the residual, copied, is the buffer oneDNN accumulates into): in int8 with its z_scale when both
    the residual and the output are quantized, else in float32; another residual runs in torch. A quantized
    output (`y_scale`) oneDNN writes as int8 itself when nothing is left for torch, else torch quantizes the
    float result."""

    family = "vendor"
    name = "onednn-qconv"
    op_types = (f"{DOMAIN}::QuantizedConv",)
    precisions = ("fp32",)
    layouts = ("NHWC",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cpu":
            return "oneDNN runs on the CPU"
        if not hasattr(torch.ops.onednn, "qconv2d_pointwise") or not torch.backends.mkldnn.is_available():
            return "this torch build has no oneDNN int8 convolution"
        if node.attributes.get("quant", "int8") != "int8":
            return "int8 only"
        if not is_depthwise(node) and (problem := onednn_int8_problem()):  # (a depthwise layer sums no pairs)
            return problem
        if len(node.inputs[1].shape or ()) != 4:
            return "2-D convolutions only"
        return _onednn_padding_problem(node)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        conv = _conv_attributes(node)
        pre, pre_params, post, post_params = _epilogue_attributes(node)
        x_scale = float(node.attributes["x_scale"])
        # Per-channel input scales (Xs): the input is quantized here, and oneDNN sees scale 1 with Xs folded into
        # the weight scales (exact for the depthwise layers that have them).
        per_channel = len(node.inputs) > 5 and node.inputs[5] is not None
        onednn_scale = 1.0 if per_channel else x_scale
        channel_scales = ChannelScales(x_scale)
        padding = list(conv.get("pads") or [0, 0, 0, 0])[:2]
        strides = list(conv.get("strides") or [1, 1])
        dilations = list(conv.get("dilations") or [1, 1])
        group = conv.get("group", 1)
        residual = len(node.inputs) > 3 and node.inputs[3] is not None
        summed = residual and not pre and post in ("", "Relu")  # oneDNN's sum post-op, then its ReLU
        inside = not residual and pre in _ONEDNN_UNARY
        unary, scalars = _ONEDNN_UNARY[pre](pre_params) if inside else ("none", [])
        y_scale, z_scale = float(node.attributes.get("y_scale", 0.0)), float(node.attributes.get("z_scale", 0.0))
        out_scale, out_dtype = _onednn_output(y_scale, tail=residual or not inside)
        onednn = torch.ops.onednn
        packed: dict[tuple[int, ...], tuple[torch.Tensor, tuple[int, ...]]] = {}  # x shape -> (weight, y shape)
        zero = torch.zeros(node.inputs[1].shape[0], dtype=torch.int64)  # the weight's zero points
        weight_shape = tuple(node.inputs[1].shape)

        def weight_for(x, w, w_scale):
            """The weight packed for x's shape, and the output shape, both worked out once per input shape."""
            key = tuple(x.shape)
            entry = packed.get(key)
            if entry is None:
                weight = onednn.qconv_prepack(
                    w, w_scale, onednn_scale, 128, strides, padding, dilations, group, list(key)
                )
                _, _, out_hw = window_geometry(
                    key[2:], weight_shape[2:], strides, dilations, conv.get("pads"), conv.get("auto_pad", "NOTSET")
                )
                entry = packed[key] = (weight, (key[0], weight_shape[0], *out_hw))
            return entry

        def sum_post_op(q, weight, out_shape, w_scale, b, z):
            """The convolution + bias + residual (+ ReLU) in one oneDNN call, or None when z does not fit."""
            if tuple(z.shape) != out_shape:
                return None  # a broadcast residual: added in torch
            in_int8 = y_scale > 0 and z.dtype == torch.int8
            if in_int8:
                accum = z.clone(memory_format=torch.channels_last)
                accum_scale, dtype, scale = z_scale, torch.int8, y_scale
            else:
                accum = residual_values(z, z_scale).to(torch.float32).contiguous(memory_format=torch.channels_last)
                accum = accum.clone() if accum.data_ptr() == z.data_ptr() else accum
                accum_scale, dtype, scale = 1.0, torch.float32, 1.0
            y = onednn.qconv2d_pointwise.binary(
                q, onednn_scale, 128, weight, w_scale, zero, accum, b, strides, padding, dilations, group, scale, 0,
                dtype, accum_scale, 0, "sum", 1.0, "relu" if post else "none", [], "",
            )  # fmt: skip
            return y if in_int8 else requantize(y, y_scale, "int8", torch.float32)

        def kernel(inputs):
            x, w, b, z, w_scale, x_channels = (list(inputs) + [None] * 6)[:6]
            if per_channel:
                scale, _, w_scale = channel_scales(w_scale, x_channels)
                x = quantize_activation(x, scale, "int8")
            weight, out_shape = weight_for(x, w, w_scale)
            q = _uint8_activation(x, onednn_scale).contiguous(memory_format=torch.channels_last)
            if summed:
                y = sum_post_op(q, weight, out_shape, w_scale, b, z)
                if y is not None:
                    return (y,)
            y = onednn.qconv2d_pointwise(
                q, onednn_scale, 128, weight, w_scale, zero, b, strides, padding, dilations, group, out_scale, 0,
                out_dtype, unary, scalars, "",
            )  # fmt: skip
            z = residual_values(z, z_scale)
            return (_after_onednn(y, inside, z, pre, pre_params, post, post_params, y_scale),)

        return kernel


_QLINEAR_UNARY = {"": ("none", ""), "Relu": ("relu", ""), "Gelu": ("gelu", "none"), "GeluTanh": ("gelu", "tanh")}


@register_tactic
class OneDnnQuantizedLinearTactic(Tactic):
    """int8 QuantizedGemm on the CPU through oneDNN: the activation quantized as the reference does (an int8
    input as it is) and offset to uint8 (zero point 128), the [K, N] weight packed once per row count, int32
    sums dequantized by x_scale × the column scales with the bias in float32; ReLU or GELU inside, other
    epilogues in torch; a quantized output written by oneDNN as int8 when nothing is left for torch."""

    family = "vendor"
    name = "onednn-qlinear"
    op_types = (f"{DOMAIN}::QuantizedGemm",)
    precisions = ("fp32",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cpu":
            return "oneDNN runs on the CPU"
        if not hasattr(torch.ops.onednn, "qlinear_pointwise") or not torch.backends.mkldnn.is_available():
            return "this torch build has no oneDNN int8 linear"
        if node.attributes.get("quant", "int8") != "int8":
            return "int8 only"
        if problem := onednn_int8_problem():
            return problem
        return _linear_operands_problem(node, node.inputs[1].shape[1])

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        pre, pre_params, post, post_params = _epilogue_attributes(node)
        x_scale = float(node.attributes["x_scale"])
        residual = len(node.inputs) > 3 and node.inputs[3] is not None
        inside = not residual and pre in _QLINEAR_UNARY
        unary, algorithm = _QLINEAR_UNARY[pre] if inside else ("none", "")
        y_scale, z_scale = float(node.attributes.get("y_scale", 0.0)), float(node.attributes.get("z_scale", 0.0))
        out_scale, out_dtype = _onednn_output(y_scale, tail=residual or not inside)
        onednn = torch.ops.onednn
        packed: dict[int, torch.Tensor] = {}
        zero = torch.zeros(node.inputs[1].shape[1], dtype=torch.int64)  # the weight's zero points

        def kernel(inputs):
            a, w, b, z, w_scale = (list(inputs) + [None] * 5)[:5]
            rows = a.reshape(-1, a.shape[-1])
            weight = packed.get(rows.shape[0])
            if weight is None:
                weight = packed[rows.shape[0]] = onednn.qlinear_prepack(w.t().contiguous(), list(rows.shape))
            bias = b.reshape(-1) if b is not None else None
            y = onednn.qlinear_pointwise(
                _uint8_activation(rows, x_scale), x_scale, 128, weight, w_scale, zero, bias, out_scale, 0,
                out_dtype, unary, [], algorithm,
            )  # fmt: skip
            y = y.reshape(*a.shape[:-1], y.shape[-1])
            z = residual_values(z, z_scale)
            return (_after_onednn(y, inside, z, pre, pre_params, post, post_params, y_scale),)

        return kernel


@register_tactic
class CublasInt8GemmTactic(Tactic):
    """int8 QuantizedGemm on CUDA: the activation quantized as the reference does (an int8 input as it is),
    `torch._int_mm` (cuBLAS int8 tensor cores, int32 sums), then the dequantizing epilogue and the output
    quantization (`y_scale`) in torch. cuBLAS takes more than 16 rows and K and N in
    multiples of 8. A subclass may replace the product (`product`) and keep the rest."""

    family = "vendor"
    name = "cublas-int8"
    op_types = (f"{DOMAIN}::QuantizedGemm",)
    precisions = ("fp16", "bf16", "fp32")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA"
        if node.attributes.get("quant", "int8") != "int8":
            return "int8 only"
        k, n = node.inputs[1].shape
        if k % 8 or n % 8:
            return f"cuBLAS's int8 product takes K and N in multiples of 8, not {k} and {n}"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        """The weight as cuBLAS reads it: "nk", [K, N] as the view of a row-major [N, K] copy (the "TN" form, the
        one cuBLASLt's int8 tensor-core kernels take), or "kn", the weight [K, N] as it is (on an H100 this product
        ran at 117 TOP/s, bench/sparse_gemm.py)."""
        return [{"weight": "nk"}, {"weight": "kn"}]

    def product(self, config: dict[str, Any]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """`(q, w) -> q @ w`: int8 rows [M, K] times the int8 weight [K, N], exact int32 sums."""
        transposed = PerWeight(lambda w: w.t().contiguous().t()) if config.get("weight") == "nk" else None

        def cublas(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            if q.shape[0] <= 16:
                raise ValueError(f"cuBLAS's int8 product takes more than 16 rows, not {q.shape[0]}")
            return torch._int_mm(q, w if transposed is None else transposed(w))

        return cublas

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        pre, pre_params, post, post_params = _epilogue_attributes(node)
        x_scale = float(node.attributes["x_scale"])
        y_scale, z_scale = float(node.attributes.get("y_scale", 0.0)), float(node.attributes.get("z_scale", 0.0))
        product = self.product(config)

        def kernel(inputs):
            a, w, b, z, w_scale = (list(inputs) + [None] * 5)[:5]
            z = residual_values(z, z_scale)
            rows = a.reshape(-1, a.shape[-1])
            q = rows if rows.dtype == torch.int8 else quantize_activation(rows, x_scale, "int8")
            y = product(q, w).float() * (w_scale.float() * x_scale)
            y = epilogue(y.reshape(*a.shape[:-1], -1), b, z, pre, pre_params, post, post_params, lambda t: t.shape)
            return (requantize(y, y_scale, "int8", output_dtype(a)),)

        return kernel


_POOLED_IN_FLOAT = (DType.INT8, DType.UINT8, DType.INT16, DType.UINT16)


def _onnx_windows(y: torch.Tensor, out) -> torch.Tensor:
    """`y`, a torch pooling's result, once its window count is ONNX's `out` (else the candidate fails)."""
    if list(y.shape[2:]) != list(out):
        raise ValueError(f"torch made {list(y.shape[2:])} windows, ONNX {list(out)}")
    return y


@register_tactic
class TorchMaxPoolTactic(Tactic):
    """MaxPool through torch's pooling kernels (cuDNN / oneDNN). Symmetric padding up to half the window is
    torch's own; any other ONNX padding is applied as -inf first (a copy). The window count must come out as
    ONNX's (ceil mode), else the kernel raises and the gate refuses it. Integers of up to 16 bits and fp8 (a quantized
    activation a max pool passes on) are pooled in float32, exactly: torch's own int8 pooling fails on
    channels_last tensors on the CPU, and the reference's takes 27 times as long."""

    family = "vendor"
    name = "torch-maxpool"
    op_types = ("MaxPool",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if len(node.outputs) > 1 and node.outputs[1].name:
            return "the indices output is computed only by the reference"
        rank = node.inputs[0].rank
        if rank not in (3, 4, 5):
            return f"torch pools 1-D to 3-D windows; the input has rank {rank}"
        dtype = node.inputs[0].dtype
        if dtype.is_integer and dtype not in _POOLED_IN_FLOAT:
            return f"torch pools floats; {dtype.name} is pooled in float32 only up to 16 bits"
        return None

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = PoolWindows.of(node.attributes)
        pool = {3: F.max_pool1d, 4: F.max_pool2d, 5: F.max_pool3d}[node.inputs[0].rank]

        def kernel(inputs):
            x = inputs[0]
            if is_quantized_tensor(x):  # (int8 or fp8) its values are exact in float32, and torch pools no fp8
                return (kernel([x.float()])[0].to(x.dtype),)
            begin, end, out = windows.at(x.shape[2:])
            padding = 0
            if begin == end and all(2 * b <= k for b, k in zip(begin, windows.kernel, strict=True)):
                padding = begin  # torch pads with -inf itself, in any memory format
            elif any(begin) or any(end):
                x = F.pad(x, [p for i in reversed(range(len(begin))) for p in (begin[i], end[i])], value=-math.inf)
            y = pool(x, windows.kernel, windows.strides, padding, windows.dilations, ceil_mode=bool(windows.ceil_mode))
            return (_onnx_windows(y, out),)

        return kernel


@register_tactic
class TorchAveragePoolTactic(Tactic):
    """AveragePool through torch's pooling kernels (oneDNN / cuDNN), 1-D to 3-D, where torch's rules are ONNX's:
    symmetric padding up to half the window (torch pads itself; zeros added first would change the count
    without `count_include_pad`), no dilation; `count_include_pad` and ceil mode as ONNX counts them (a ceil-mode
    window is clipped to the padded input in both). A window count that differs from ONNX's raises, and the
    autotuner's gate refuses it."""

    family = "vendor"
    name = "torch-avgpool"
    op_types = ("AveragePool",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        rank = node.inputs[0].rank
        if rank not in (3, 4, 5):
            return f"torch pools 1-D to 3-D windows; the input has rank {rank}"
        if not node.inputs[0].dtype.is_float:
            return "float inputs only"
        if any(d != 1 for d in node.attributes.get("dilations") or []):
            return "torch's average pooling has no dilation"
        return None

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = PoolWindows.of(node.attributes)
        pool = {3: F.avg_pool1d, 4: F.avg_pool2d, 5: F.avg_pool3d}[node.inputs[0].rank]
        count_padding = bool(node.attributes.get("count_include_pad", 0))

        def kernel(inputs):
            x = inputs[0]
            begin, end, out = windows.at(x.shape[2:])
            if begin != end or any(2 * b > k for b, k in zip(begin, windows.kernel, strict=True)):
                raise ValueError(f"padding {begin} / {end} is not torch's (symmetric, up to half the window)")
            y = pool(
                x, windows.kernel, windows.strides, begin, ceil_mode=bool(windows.ceil_mode),
                count_include_pad=count_padding,
            )  # fmt: skip
            return (_onnx_windows(y, out),)

        return kernel


@register_tactic
class TorchUpsampleNearestTactic(Tactic):
    """Resize, nearest, by integer factors on H and W (`tactics.upsample`) as one `F.interpolate`, in the input's
    memory format: for an integer factor s torch's nearest index floor(o · (1/s)) is o // s, exactly (a test
    pins it against the reference)."""

    family = "vendor"
    name = "torch-upsample-nearest"
    op_types = ("Resize",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        factors = upsample_factors(node, opset)
        if isinstance(factors, str):
            return factors
        if not node.inputs[0].dtype.is_float:
            return "float inputs only"
        return None

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        factors = upsample_factors(node, opset)
        if isinstance(factors, str):
            raise ValueError(f"{node.label}: {factors}")

        def kernel(inputs):
            x = inputs[0]
            size = (x.shape[2] * factors[0], x.shape[3] * factors[1])
            return (F.interpolate(x, size=size, mode="nearest"),)

        return kernel


@register_tactic
class TorchLayerNormTactic(Tactic):
    family = "vendor"
    name = "torch-layernorm"
    op_types = ("LayerNormalization", f"{DOMAIN}::LayerNormalization")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = statistics_reason(node)
        if reason:
            return reason
        if node.inputs[0].rank is None:
            return "the input's rank is unknown"
        return None

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        axis = node.attributes.get("axis", -1)
        epsilon = float(node.attributes.get("epsilon", 1e-5))

        def kernel(inputs):
            x, scale, bias = (list(inputs) + [None] * 3)[:3]
            begin = axis % x.dim()
            shape = tuple(x.shape[begin:])
            weight = scale.expand(shape) if tuple(scale.shape) != shape else scale
            bias = bias.expand(shape) if bias is not None and tuple(bias.shape) != shape else bias
            return (F.layer_norm(x, shape, weight, bias, epsilon),)

        return kernel


@register_tactic
class TorchAttentionTactic(Tactic):
    family = "vendor"
    name = "torch-sdpa"
    op_types = (f"{DOMAIN}::Attention",)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        scale = float(node.attributes.get("scale", 1.0))
        transposed = bool(node.attributes.get("transposed", 0))

        def kernel(inputs):
            q, kt, v, bias = (list(inputs) + [None] * 4)[:4]
            mask = bias.to(q.dtype) if bias is not None else None
            y = F.scaled_dot_product_attention(q, kt.transpose(-1, -2), v, attn_mask=mask, scale=scale)
            # (CUDA's flash and memory-efficient kernels write [B, Sq, H, Dv] and return its transposed view: then
            # the transposed result is that tensor as it is)
            return (y.transpose(1, 2).contiguous() if transposed else y,)

        return kernel


@register_tactic
class TorchSqueezeExciteTactic(Tactic):
    """SqueezeExcite (`ops/squeeze_excite.py`) in torch: `x.mean((2, 3))`, two `F.linear` with the bias and
    the 1×1 weights viewed as [R, C] and [C, R] matrices, the activations, then `x · g` broadcast over H×W
    (in x's memory format). The reference runs each 1×1 convolution on a [N, C, 1, 1] tensor through the
    convolution path (a batched product and a separate epilogue); this is the same arithmetic on the vector.
    On CUDA it also runs in fp16 and bf16 (torch's mean accumulates in float32, cuBLAS products), the vendor
    baseline of `triton.squeeze-excite`; on the CPU, fp32 and (with bf16 dot products) bf16."""

    family = "vendor"
    name = "torch-squeeze-excite"
    op_types = (f"{DOMAIN}::SqueezeExcite",)
    precisions = ("fp32", "fp16", "bf16")

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        a = node.attributes
        act1, params1 = a.get("act1", ""), list(a.get("act1_params", ()))
        act2, params2 = a.get("act2", ""), list(a.get("act2_params", ()))
        matrices: dict[int, torch.Tensor] = {}  # by the weight's data pointer: it is a prepared constant

        def matrix(w: torch.Tensor) -> torch.Tensor:
            key = w.data_ptr()
            if key not in matrices:
                matrices[key] = w.reshape(w.shape[0], w.shape[1]).contiguous()
            return matrices[key]

        def kernel(inputs):
            x, w1, b1, w2, b2 = (list(inputs) + [None] * 5)[:5]
            pooled = x.mean((2, 3))
            hidden = apply_activation(F.linear(pooled, matrix(w1), b1), act1, params1)
            gate = apply_activation(F.linear(hidden, matrix(w2), b2), act2, params2)
            return (x * gate.reshape(*gate.shape, 1, 1),)

        return kernel
