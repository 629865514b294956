"""The Triton family's depthwise convolution and pooling tactics: `kernels/triton/` depthwise and pool, CUDA only.

- `triton.depthwise`: FusedConv with one input channel per group (group == Cin, Cout = M·Cin) on NHWC, the
  whole epilogue inside, its weight packed once.
- `triton.maxpool`, `triton.avgpool`: 2-D MaxPool / AveragePool over tiles of pixels × channels.
- `triton.global-avgpool`: GlobalAveragePool, and ReduceMean over axes [2, 3] keeping them (the same mean).
- `triton.upsample-nearest`: Resize in nearest mode by integer factors on H and W, written through the strides
  it is given (so into its concatenation's storage, `build.concat_views`).
- `triton.concat`: Concat of float tensors of any rank along any axis, one tiled strided copy per input (inputs
  whose strides disagree with the output's, such as a detector's channels_last head maps reshaped to
  [N, C, H·W] and concatenated along the pixels, are read and written in whole lines).

Each kernel writes into the buffer the execution context gives (`writes_into`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir import DType, Node
from ..kernels.triton.copy import concat, copy_configs
from ..kernels.triton.depthwise import depthwise_configs, depthwise_conv2d, pack_depthwise_weight
from ..kernels.triton.epilogue import activation_args
from ..kernels.triton.pool import (
    avg_pool2d,
    global_avg_pool,
    global_pool_configs,
    max_pool2d,
    pool_configs,
)
from ..kernels.triton.resize import upsample_configs, upsample_nearest
from ..ops.fused import DOMAIN, QUANTIZED_DTYPES
from ..ops.pool import ConvWindows, PoolWindows
from .base import Kernel, PerWeight, Tactic, allocate, register_tactic
from .upsample import upsample_factors

_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.BFLOAT16)
_NEEDS_CUDA = "needs CUDA (Triton runs CPU tensors only under its interpreter)"


def _float_rank4_reason(node: Node) -> str | None:
    """Why the first input is not a rank-4 float tensor, or None."""
    x = node.inputs[0]
    if x.rank != 4:
        return f"2-D (rank-4 NCHW) inputs only; the input has rank {x.rank}"
    if x.dtype not in _FLOATS:
        return f"float32, float16 and bfloat16 inputs only; the input is {x.dtype.name}"
    return None


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    """channels_last for a 4-D tensor whose channels are innermost (channels_last, or a channel slice of such a
    tensor: an output written inside its concatenation), else contiguous."""
    channels_last = x.dim() == 4 and x.stride(1) == 1 and not x.is_contiguous()
    return torch.channels_last if channels_last else torch.contiguous_format


def _activations(node: Node) -> tuple[tuple[int, float, float], tuple[int, float, float]]:
    """The node's pre and post activations as the kernel's (code, p0, p1); ValueError when Triton has none."""
    a = node.attributes
    pre = activation_args(a.get("pre", ""), a.get("pre_params", ()))
    return pre, activation_args(a.get("post", ""), a.get("post_params", ()))


@register_tactic
class TritonDepthwiseConvTactic(Tactic):
    """2-D depthwise FusedConv (one input channel per group, any channel multiplier, kernel size, stride,
    padding, dilation; bias, residual, pre/post activation) as one Triton kernel over channels_last tensors;
    its tile is tuned (`depthwise_configs`). The weight is packed once per weight tensor; the output size and
    padding follow each input's shape (auto_pad included)."""

    family = "triton"
    name = "depthwise"
    op_types = (f"{DOMAIN}::FusedConv",)
    precisions = ("fp16", "bf16", "fp32")
    layouts = ("NHWC",)
    writes_into = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return _NEEDS_CUDA
        x, weight = node.inputs[0], node.inputs[1]
        if weight.rank != 4:
            return f"2-D convolutions only; the weight has rank {weight.rank}"
        if not weight.is_const:
            return "the weight is computed at run time; this kernel packs a constant weight once"
        group = node.attributes.get("group", 1)
        cout, per_group = weight.shape[0], weight.shape[1]
        if per_group != 1:
            return f"depthwise only (one input channel per group); this layer has {per_group} per group"
        channels = x.shape[1] if x.shape is not None and len(x.shape) > 1 else None
        if isinstance(channels, int) and channels != group:
            return f"depthwise only (group == input channels); group is {group}, the input has {channels} channels"
        if cout % group:
            return f"{cout} output channels are not a multiple of the {group} groups"
        reason = _float_rank4_reason(node)
        if reason is not None:
            return reason
        try:
            _activations(node)
        except ValueError as err:
            return str(err)
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return depthwise_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = ConvWindows.of(node.attributes)
        pre, post = _activations(node)
        packed = PerWeight(lambda w, dtype: pack_depthwise_weight(w.to(dtype)))

        def kernel(inputs, alloc=None):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            begin, _, out_hw = windows.at(x.shape[2:], w.shape[2:])
            out = allocate(alloc, 0, (x.shape[0], w.shape[0], *out_hw), x.dtype, x.device, torch.channels_last)
            y = depthwise_conv2d(
                x, packed(w, x.dtype), b, z,
                out_hw=out_hw, strides=windows.strides, pads_begin=begin, dilations=windows.dilations, pre=pre,
                post=post, out=out, config=config,
            )  # fmt: skip
            return (y,)

        return kernel


def _window_pool_reason(node: Node, device: torch.device, quantized: bool = False) -> str | None:
    """Why a 2-D pooling node does not run here (`quantized`: an int8 or fp8 input allowed, as a max pool passes
    one)."""
    if device.type != "cuda":
        return _NEEDS_CUDA
    x = node.inputs[0]
    reason = None if quantized and x.dtype in QUANTIZED_DTYPES and x.rank == 4 else _float_rank4_reason(node)
    if reason is not None:
        return reason
    if len(node.attributes.get("kernel_shape", ())) != 2:
        return f"2-D windows only; kernel_shape is {list(node.attributes.get('kernel_shape', ()))}"
    return None


@register_tactic
class TritonMaxPoolTactic(Tactic):
    """2-D MaxPool over tiles of pixels × channels (coalesced on NHWC); the tile is tuned (`pool_configs`). It
    reads and writes through strides, so an SPPF block's pooled maps land in their concatenation. An int8 or fp8
    input (a quantized activation passed through the pool, `passes.quant_chain`) pools exactly."""

    family = "triton"
    name = "maxpool"
    op_types = ("MaxPool",)
    writes_into = True
    strided_inputs = True
    strided_outputs = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if len(node.outputs) > 1 and node.outputs[1].name:
            return "the indices output is computed only by the reference"
        return _window_pool_reason(node, device, quantized=True)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return pool_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = PoolWindows.of(node.attributes)

        def kernel(inputs, alloc=None):
            x = inputs[0]
            begin, _, out_hw = windows.at(x.shape[2:])
            out = allocate(alloc, 0, (*x.shape[:2], *out_hw), x.dtype, x.device, _memory_format(x))
            y = max_pool2d(x, windows.kernel, windows.strides, begin, windows.dilations, out_hw, out=out, **config)
            return (y,)

        return kernel


@register_tactic
class TritonAvgPoolTactic(Tactic):
    """2-D AveragePool (count_include_pad either way, ceil mode, asymmetric pads) over tiles of pixels ×
    channels, float32 sums; the tile is tuned (`pool_configs`)."""

    family = "triton"
    name = "avgpool"
    op_types = ("AveragePool",)
    writes_into = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        return _window_pool_reason(node, device)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return pool_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = PoolWindows.of(node.attributes)
        include_pad = bool(node.attributes.get("count_include_pad", 0))

        def kernel(inputs, alloc=None):
            x = inputs[0]
            begin, end, out_hw = windows.at(x.shape[2:])
            out = allocate(alloc, 0, (*x.shape[:2], *out_hw), x.dtype, x.device, _memory_format(x))
            y = avg_pool2d(
                x, windows.kernel, windows.strides, begin, end, windows.dilations, out_hw, include_pad, out,
                **config,
            )  # fmt: skip
            return (y,)

        return kernel


def _reduce_mean_reason(node: Node, opset: int) -> str | None:
    """Why a ReduceMean is not the global average pool (axes 2 and 3 of a rank-4 input, kept), or None."""
    a = node.attributes
    if opset >= 18:
        axes_value = node.inputs[1] if len(node.inputs) > 1 else None
        if axes_value is None:
            return "ReduceMean without axes reduces every axis, not only H and W"
        if not axes_value.is_const:
            return "the axes are computed at run time"
        axes = [int(v) for v in torch.as_tensor(axes_value.const).reshape(-1).tolist()]
    else:
        axes = list(a.get("axes") or [])
    if sorted(axis % 4 for axis in axes) != [2, 3]:
        return f"only the mean over axes [2, 3] (H and W); the axes are {axes}"
    if not a.get("keepdims", 1):
        return "only keepdims=1 (a (N, C, 1, 1) output)"
    return None


@register_tactic
class TritonGlobalAvgPoolTactic(Tactic):
    """GlobalAveragePool (and ReduceMean over axes [2, 3] with keepdims=1) of rank-4 NHWC or NCHW inputs: a
    program reduces a block of channels over a range of pixels in float32; ranges split so that batch 1 fills
    the device. The tile is tuned (`global_pool_configs`)."""

    family = "triton"
    name = "global-avgpool"
    op_types = ("GlobalAveragePool", "ReduceMean")
    writes_into = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return _NEEDS_CUDA
        reason = _float_rank4_reason(node)
        if reason is None and node.op_type == "ReduceMean":
            reason = _reduce_mean_reason(node, opset)
        return reason

    def space(self, effort: int) -> list[dict[str, Any]]:
        return global_pool_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        def kernel(inputs, alloc=None):
            x = inputs[0]
            out = allocate(alloc, 0, (*x.shape[:2], 1, 1), x.dtype, x.device)
            return (global_avg_pool(x, out, **config),)

        return kernel


@register_tactic
class TritonUpsampleNearestTactic(Tactic):
    """Resize, nearest, by integer factors on H and W (YOLO's neck): one load and store per output element,
    written through the strides of the buffer given, so straight into a concatenation's channel slice."""

    family = "triton"
    name = "upsample-nearest"
    op_types = ("Resize",)
    precisions = ("fp32", "fp16", "bf16")
    layouts = ("NHWC",)
    writes_into = True
    strided_inputs = True
    strided_outputs = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return _NEEDS_CUDA
        factors = upsample_factors(node, opset)
        if isinstance(factors, str):
            return factors
        return _float_rank4_reason(node)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return upsample_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        factors = upsample_factors(node, opset)
        if isinstance(factors, str):
            raise ValueError(f"{node.label}: {factors}")

        def kernel(inputs, alloc=None):
            x = inputs[0]
            shape = (*x.shape[:2], x.shape[2] * factors[0], x.shape[3] * factors[1])
            out = allocate(alloc, 0, shape, x.dtype, x.device, torch.channels_last)
            return (upsample_nearest(x, factors, out=out, **config),)

        return kernel


@register_tactic
class TritonConcatTactic(Tactic):
    """Concat of float tensors along any axis: `kernels/triton/copy.concat`, into a buffer laid out like the first
    input's for 4-D tensors (channels_last stays channels_last), else contiguous."""

    family = "triton"
    name = "concat"
    op_types = ("Concat",)
    precisions = ("fp32", "fp16", "bf16")
    writes_into = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return _NEEDS_CUDA
        kinds = sorted({v.dtype.name for v in node.inputs if v.dtype not in _FLOATS})
        if kinds:
            return f"float32, float16 and bfloat16 inputs only; this one has {', '.join(kinds)}"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return copy_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        axis = node.attributes["axis"]

        def kernel(inputs, alloc=None):
            first = inputs[0]
            shape = list(first.shape)
            shape[axis] = sum(t.shape[axis] for t in inputs)
            layout = _memory_format(first) if first.dim() == 4 else torch.contiguous_format
            out = allocate(alloc, 0, shape, first.dtype, first.device, layout)
            return (concat(inputs, axis, out=out, **config),)

        return kernel
