"""The Triton convolution tactics: `kernels.triton.conv`'s implicit GEMM with the whole epilogue inside, on NHWC:
`triton.conv-igemm` for FusedConv, `triton.conv-igemm-quantized` for QuantizedConv (int8 / fp8 tensor cores,
the activation quantized as it is loaded), `triton.conv-tma` and `triton.conv-tma-quantized` for their stride-1
layers on Hopper (`kernels.triton.conv_tma`, TMA-fed); `triton.conv-direct` (`kernels.triton.conv_direct`) for
layers with few input channels, reading the input as it comes; `triton.conv-s2d` for stride-2 stems, over the
input's 2×2 blocks (`kernels.space_to_depth`); and `triton.cudnn-epilogue`, cuDNN's convolution followed by the
whole epilogue in one Triton pass."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..ir import DType, Node
from ..kernels.space_to_depth import (
    blocked_channels,
    blocked_input,
    blocked_pads,
    blocked_taps,
    blocked_weight,
    column_tap_weight,
    column_taps,
)
from ..kernels.triton.conv import (
    conv2d_nhwc,
    conv2d_nhwc_quantized,
    conv_configs,
    conv_epilogue_nhwc,
    fit_configs,
    pack_weight,
    quantized_conv_configs,
    tma_configs,
)
from ..kernels.triton.conv_direct import MAX_TAPS_X_CHANNELS, conv2d_direct, direct_configs
from ..kernels.triton.conv_tma import hopper_problem
from ..kernels.triton.epilogue import activation_args
from ..ops.fused import DOMAIN, QUANT_TYPES, is_quantized_tensor
from ..ops.pool import ConvWindows
from .base import Kernel, PerWeight, Tactic, allocate, register_tactic
from .channel_scales import ChannelScales
from .variant import float_type

FLOAT_INPUTS = (DType.FLOAT, DType.FLOAT16, DType.BFLOAT16)


def _activations(node: Node) -> tuple[tuple[int, float, float], tuple[int, float, float]]:
    """The node's pre and post activations as the kernel's (code, p0, p1); ValueError when Triton has none."""
    a = node.attributes
    return activation_args(a.get("pre", ""), a.get("pre_params", ())), activation_args(
        a.get("post", ""), a.get("post_params", ())
    )


def _conv_problem(node: Node, inputs: tuple[DType, ...] = FLOAT_INPUTS) -> str | None:
    """Why the Triton implicit GEMM cannot run `node` (2-D, constant weight, an input of `inputs`, a Triton
    epilogue)."""
    x, weight = node.inputs[0], node.inputs[1]
    if weight.rank != 4:
        return f"2-D convolutions only; the weight has rank {weight.rank}"
    if not weight.is_const:
        return "the weight is computed at run time; this kernel packs a constant weight once"
    if x.dtype not in inputs:
        return f"{', '.join(t.name for t in inputs)} inputs only; the input is {x.dtype.name}"
    try:
        _activations(node)
    except ValueError as err:
        return str(err)
    return None


def _fitted(node: Node, configs: list[dict[str, Any]], min_block_k: int = 16) -> list[dict[str, Any]]:
    """`configs` fitted to the node's channels per group (`fit_configs`)."""
    shape = node.inputs[1].shape
    if len(shape) != 4 or not all(isinstance(d, int) for d in shape[:2]):
        return configs
    groups = node.attributes.get("group", 1)
    return fit_configs(configs, shape[1], shape[0] // groups, min_block_k)


def _tma_problem(node: Node, device: torch.device) -> str | None:
    """Why `kernels.triton.conv_tma` cannot run the (CUDA) node: it takes convolutions of one group with stride 1
    and dilation 1 (a box of output pixels reads a box of input pixels, shifted by each tap), and unpadded 1×1
    ones of any stride (over a view of every s-th input pixel), on Hopper or newer."""
    a = node.attributes
    steps = (*a.get("strides", (1, 1)), *a.get("dilations", (1, 1)))
    unpadded_1x1 = (
        tuple(node.inputs[1].shape[2:]) == (1, 1)
        and not any(a.get("pads", ()))
        and a.get("auto_pad", "NOTSET") in ("NOTSET", "VALID")
    )
    if a.get("group", 1) != 1 or (any(step != 1 for step in steps) and not unpadded_1x1):
        return "stride 1, dilation 1 and one group only, or an unpadded 1×1 (output boxes read shifted input boxes)"
    return hopper_problem(device)


@register_tactic
class TritonConvTactic(Tactic):
    """2-D FusedConv (any stride, padding, dilation, groups; bias, residual, pre/post activation) as one Triton
    kernel over channels_last tensors; its tile configuration is tuned (`conv_configs`). The weight is packed
    once per weight tensor; the output size and padding follow each input's shape (auto_pad included)."""

    family = "triton"
    name = "conv-igemm"
    op_types = (f"{DOMAIN}::FusedConv",)
    precisions = ("fp16", "bf16", "tf32", "fp32")
    layouts = ("NHWC",)
    writes_into = True
    strided_inputs = True  # x and the residual are read through their strides
    strided_outputs = True  # and the output written through its own

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA (Triton runs CPU tensors only under its interpreter)"
        return _conv_problem(node)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return conv_configs(effort)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        return _fitted(node, self.space(effort))

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = ConvWindows.of(node.attributes)
        pre, post = _activations(node)
        packed = PerWeight(lambda w, dtype: pack_weight(w.to(dtype), windows.groups))

        def kernel(inputs, alloc=None):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            begin, _, out_hw = windows.at(x.shape[2:], w.shape[2:])
            out = allocate(alloc, 0, (x.shape[0], w.shape[0], *out_hw), x.dtype, x.device, torch.channels_last)
            y = conv2d_nhwc(
                x, packed(w, x.dtype), b, z,
                out_hw=out_hw, strides=windows.strides, pads_begin=begin, dilations=windows.dilations, pre=pre,
                post=post, tf32=torch.backends.cuda.matmul.allow_tf32, config=config, out=out,
            )  # fmt: skip
            return (y,)

        return kernel


@register_tactic
class TritonQuantizedConvTactic(Tactic):
    """2-D QuantizedConv as one Triton kernel over channels_last tensors: int8 products summed exactly in int32
    (or float8 E4M3 ones in float32, compute capability 8.9+), dequantized by x_scale × the per-channel weight
    scales, then the FusedConv epilogue. The quantized weight is packed K-major once. A float input is quantized
    as it is loaded, an input of the layer's quantized type read as it is; with `y_scale` the output is
    requantized as it is stored, and a quantized residual (`z_scale`) dequantized as it is added. Per-channel input
    scales (`Xs`, depthwise layers) quantize on load by channel and fold into the weight scales. A float output
    is written in the variant's float type."""

    family = "triton"
    name = "conv-igemm-quantized"
    op_types = (f"{DOMAIN}::QuantizedConv",)
    precisions = ("fp16", "bf16", "fp32")
    layouts = ("NHWC",)
    writes_into = True
    sees_precision = True  # a float output in the variant's type
    strided_inputs = True  # x and the residual are read through their strides
    strided_outputs = True  # and the output written through its own

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA (Triton runs CPU tensors only under its interpreter)"
        quant = node.attributes.get("quant", "int8")
        if quant == "fp8e4m3" and torch.cuda.get_device_capability(device) < (8, 9):
            return "float8 tensor cores need compute capability 8.9 or newer"
        return _conv_problem(node, (*FLOAT_INPUTS, QUANT_TYPES[quant]))

    def space(self, effort: int) -> list[dict[str, Any]]:
        return quantized_conv_configs(effort)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        return _fitted(node, self.space(effort), min_block_k=32)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = ConvWindows.of(node.attributes)
        x_scale = float(node.attributes["x_scale"])
        y_scale, z_scale = float(node.attributes.get("y_scale", 0.0)), float(node.attributes.get("z_scale", 0.0))
        pre, post = _activations(node)
        packed = PerWeight(lambda w: pack_weight(w, windows.groups, k_major=True))
        channel_scales = ChannelScales(x_scale)
        tiles = {k: v for k, v in config.items() if k != "precision"}
        out_dtype = QUANT_TYPES[node.attributes.get("quant", "int8")].torch if y_scale else float_type(config)

        def kernel(inputs, alloc=None):
            x, w, b, z, w_scale, x_channels = (list(inputs) + [None] * 6)[:6]
            scale, w_scale, inverse = x_scale, w_scale.float(), None
            if x_channels is not None:
                _, inverse, w_scale = channel_scales(w_scale, x_channels)
                scale = 1.0
            begin, _, out_hw = windows.at(x.shape[2:], w.shape[2:])
            out = allocate(alloc, 0, (x.shape[0], w.shape[0], *out_hw), out_dtype, x.device, torch.channels_last)
            y = conv2d_nhwc_quantized(
                x, packed(w), w_scale, scale, b, z, out_hw=out_hw, strides=windows.strides, pads_begin=begin,
                dilations=windows.dilations, pre=pre, post=post, out=out, config=tiles, y_scale=y_scale,
                z_scale=z_scale, x_inv_channels=inverse,
            )  # fmt: skip
            return (y,)

        return kernel


@register_tactic
class TritonTmaConvTactic(TritonConvTactic):
    """`triton.conv-igemm` with `kernels.triton.conv_tma`'s TMA-fed kernel (`tma_configs`): stride-1 layers of one
    group on Hopper. A call whose operands TMA cannot take (unaligned strides) runs the gathering kernel with the
    same tiles. Its own tactic, so that the first tuning round times it beside the others and the build log
    shows where it wins."""

    name = "conv-tma"

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        return super().supports(node, opset, device) or _tma_problem(node, device)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return tma_configs(effort)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        return _fitted(node, _tma_space(node, effort))


@register_tactic
class TritonTmaQuantizedConvTactic(TritonQuantizedConvTactic):
    """`triton.conv-igemm-quantized` with the TMA-fed kernel (`tma_configs`, 8-bit tiles): stride-1 layers of
    one group on Hopper (per-channel input scales run the gathering kernel with the same tiles). An E4M3 layer's
    tiles are timed with their sums promoted and not (`accumulations`)."""

    name = "conv-tma-quantized"

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        return super().supports(node, opset, device) or _tma_problem(node, device)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return tma_configs(effort, quantized=True)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        return accumulations(node, _fitted(node, _tma_space(node, effort, quantized=True), min_block_k=32))


class _InputAsItComes(Tactic):
    """What the few-channel (stem) tactics share: a FusedConv on CUDA whose input reaches the kernel as it comes
    (the network's float32 NCHW input, say: no cast or layout pass first), written channels_last in the variant's
    type; `stem_problem` says which layers each takes."""

    family = "triton"
    op_types = (f"{DOMAIN}::FusedConv",)
    layouts = ("NHWC",)
    writes_into = True
    strided_inputs = True  # x and the residual are read through their strides
    strided_outputs = True  # and the output written through its own
    converts_on_load = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA (Triton runs CPU tensors only under its interpreter)"
        return _conv_problem(node) or self.stem_problem(node)

    def stem_problem(self, node: Node) -> str | None:
        raise NotImplementedError


@register_tactic
class TritonDirectConvTactic(_InputAsItComes):
    """2-D FusedConv of one group with few taps × input channels (a stem) as `conv2d_direct`: the K products
    unrolled on the CUDA cores, the input read in whatever float type and strides it comes, the epilogue
    inside."""

    name = "conv-direct"
    precisions = ("fp16", "bf16", "fp32")

    def stem_problem(self, node: Node) -> str | None:
        if node.attributes.get("group", 1) != 1:
            return "one group only"
        _, cin, kh, kw = node.inputs[1].shape
        if not all(isinstance(d, int) for d in (cin, kh, kw)) or cin * kh * kw > MAX_TAPS_X_CHANNELS:
            return f"at most {MAX_TAPS_X_CHANNELS} taps × input channels (unrolled); this layer has {cin}×{kh}×{kw}"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return direct_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = ConvWindows.of(node.attributes)
        pre, post = _activations(node)
        packed = PerWeight(lambda w: pack_weight(w, 1))

        def kernel(inputs, alloc=None):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            begin, _, out_hw = windows.at(x.shape[2:], w.shape[2:])
            out = allocate(alloc, 0, (x.shape[0], w.shape[0], *out_hw), w.dtype, x.device, torch.channels_last)
            return (
                conv2d_direct(
                    x, packed(w), b, z, out_hw=out_hw, strides=windows.strides, pads_begin=begin,
                    dilations=windows.dilations, pre=pre, post=post, out=out, config=config,
                ),
            )  # fmt: skip

        return kernel


def s2d_problem(node: Node) -> str | None:
    """Why `kernels.space_to_depth` does not pay for the convolution `node`: stride 2, dilation 1, one group and
    at most 4 input channels (16 blocked: a wider layer gathers well as it is)."""
    a = node.attributes
    if a.get("group", 1) != 1 or tuple(a.get("strides") or (1, 1)) != (2, 2):
        return "stride-2 convolutions of one group only"
    if tuple(a.get("dilations") or (1, 1)) != (1, 1):
        return "dilation 1 only"
    channels = node.inputs[1].shape[1]
    if not isinstance(channels, int) or blocked_channels(channels) > 16:
        return f"at most 4 input channels (16 blocked), not {channels}: a wider layer gathers well as it is"
    return None


def s2d_channels(node: Node) -> int:
    """The channels of the column-tap view a stem runs over (`s2d_input`): its blocked pixels × a row of taps."""
    pads = (node.attributes.get("pads") or [0, 0])[:2]
    return blocked_channels(node.inputs[1].shape[1]) * blocked_taps(node.inputs[1].shape[2:], pads)[1]


def s2d_input(
    x: torch.Tensor, begin, kernel, out_w: int, dtype: torch.dtype, scale: float | None = None, through=None
) -> tuple[torch.Tensor, list[int]]:
    """The float input of a stem padded by `begin` as `column_taps`' view of its blocks in `dtype` (quantized by
    `scale` for int8 / E4M3, after rounding to `through`; the zero columns written by the blocking pass) and the
    padding of the KH' × 1 convolution over it."""
    pads = blocked_pads(begin)
    taps = blocked_taps(kernel, begin)[1]
    after = max(0, out_w + taps - 1 - pads[1] - x.shape[3] // 2)
    blocked = blocked_input(x, dtype, columns=(pads[1], after), scale=scale, through=through)
    return column_taps(blocked, taps, out_w), [pads[0], 0]


def _s2d_weight(weight: torch.Tensor, begin: tuple[int, ...], k_major: bool = False) -> torch.Tensor:
    return pack_weight(column_tap_weight(blocked_weight(weight, begin)), 1, k_major=k_major)


@register_tactic
class TritonSpaceToDepthConvTactic(_InputAsItComes):
    """2-D stride-2 FusedConv of few input channels (a stem) as a stride-1 convolution over the input's 2×2 blocks
    (`kernels.space_to_depth`): one pass blocks the input as it comes into the variant's type, channels padded to
    16-byte pixels and columns to the padding, then `conv2d_nhwc` runs the blocked layer over the view whose
    pixels hold a whole row of taps (`column_taps`), on TMA (`conv_tma`) where it can: a 7×7 layer on 3 channels
    becomes a 4 × 1 one on 64 (4 taps of 12 channels and 4 zeros). An input of odd height or width runs the plain
    strided kernel."""

    name = "conv-s2d"
    precisions = ("fp16", "bf16", "tf32", "fp32")

    def stem_problem(self, node: Node) -> str | None:
        return s2d_problem(node)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return tiles_with_swap(effort) + conv_configs(effort)  # TMA's first: another GPU runs them gathering

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        return fit_configs(self.space(effort), s2d_channels(node), node.inputs[1].shape[0])

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = ConvWindows.of(node.attributes)
        pre, post = _activations(node)
        packed = PerWeight(lambda w: pack_weight(w, 1))
        blocked = PerWeight(_s2d_weight)

        def kernel(inputs, alloc=None):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            begin, _, out_hw = windows.at(x.shape[2:], w.shape[2:])
            out = allocate(alloc, 0, (x.shape[0], w.shape[0], *out_hw), w.dtype, x.device, torch.channels_last)
            geometry = dict(out_hw=out_hw, pre=pre, post=post, out=out, config=config)
            tf32 = torch.backends.cuda.matmul.allow_tf32
            if x.shape[2] % 2 or x.shape[3] % 2:
                x = x.to(w.dtype, memory_format=torch.channels_last)
                return (conv2d_nhwc(x, packed(w), b, z, strides=(2, 2), pads_begin=begin, tf32=tf32, **geometry),)
            view, pads = s2d_input(x, begin, w.shape[2:], out_hw[1], w.dtype)
            return (conv2d_nhwc(view, blocked(w, tuple(begin)), b, z, pads_begin=pads, tf32=tf32, **geometry),)

        return kernel


@register_tactic
class TritonSpaceToDepthQuantizedConvTactic(TritonQuantizedConvTactic):
    """`triton.conv-s2d` for a QuantizedConv stem: the float input blocked as it comes and quantized in the same
    pass (half the bytes of fp16 for int8, and the kernel's tensor cores read it straight from TMA, without a
    quantize between shared memory and the product), then `conv2d_nhwc_quantized` against the int8 (E4M3)
    weight regrouped the same way (zeros are exact in either type; the per-channel scales are the weight's). The
    variant's type is the output's, when it is float. E4M3 tiles are timed with their sums promoted and not
    (`accumulations`)."""

    name = "conv-s2d-quantized"
    converts_on_load = True
    sees_precision = True  # a float output in the variant's type

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        problem = super().supports(node, opset, device) or s2d_problem(node)
        if problem is None and (node.inputs[0].dtype not in FLOAT_INPUTS or len(node.inputs) > 5):
            return "a float input quantized per tensor only (the blocking copies float values)"
        return problem

    def space(self, effort: int) -> list[dict[str, Any]]:
        return tiles_with_swap(effort, quantized=True) + quantized_conv_configs(effort)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        return accumulations(node, fit_configs(self.space(effort), s2d_channels(node), node.inputs[1].shape[0], 32))

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = ConvWindows.of(node.attributes)
        x_scale = float(node.attributes["x_scale"])
        y_scale = float(node.attributes.get("y_scale", 0.0))
        pre, post = _activations(node)
        dtype = float_type(config)
        through = dtype if dtype in (torch.float16, torch.bfloat16) else None  # the variant's rounded input
        tiles = {k: v for k, v in config.items() if k not in ("precision", "layout")}
        packed = PerWeight(lambda w: pack_weight(w, 1, k_major=True))
        blocked = PerWeight(lambda w, begin: _s2d_weight(w, begin, k_major=True))

        def kernel(inputs, alloc=None):
            x, w, b, z, w_scale = (list(inputs) + [None] * 5)[:5]
            begin, _, out_hw = windows.at(x.shape[2:], w.shape[2:])
            out_dtype = w.dtype if y_scale else dtype
            out = allocate(alloc, 0, (x.shape[0], w.shape[0], *out_hw), out_dtype, x.device, torch.channels_last)
            common = dict(out_hw=out_hw, pre=pre, post=post, out=out, config=tiles, y_scale=y_scale)
            if x.shape[2] % 2 or x.shape[3] % 2:
                x = x.to(dtype, memory_format=torch.channels_last)
                y = conv2d_nhwc_quantized(
                    x, packed(w), w_scale.float(), x_scale, b, z, strides=(2, 2), pads_begin=begin, **common
                )
                return (y,)
            view, pads = s2d_input(x, begin, w.shape[2:], out_hw[1], w.dtype, x_scale, through)
            y = conv2d_nhwc_quantized(
                view, blocked(w, tuple(begin)), w_scale.float(), x_scale, b, z, pads_begin=pads, **common
            )
            return (y,)

        return kernel


def accumulations(node: Node, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`configs`, and for a layer of E4M3 products each again without the promotion of its sums (`promote` False:
    the tensor cores' own accumulation; held to the same check as the others), those first: the tuning's first
    round times a tactic's first configuration alone, and the faster form should speak for it (where it fails the
    check, the rest are tried). Promoted, the Gluon kernel's products are serialized by ptxas, and the TMA kernel's
    256-pixel transposed tile spills registers (255 and 116 bytes of spills against 154 registers unpromoted,
    compiled for sm_90)."""
    if node.attributes.get("quant") != "fp8e4m3":
        return configs
    return [{**config, "promote": False} for config in configs] + configs


def tiles_with_swap(effort: int, quantized: bool = False) -> list[dict[str, Any]]:
    """The TMA tiles of a stem or a stride-1 layer of at most 64 output channels: `tma_configs(effort)` and, at any
    effort, the 256-pixel tile computed transposed (the 64 output channels as the products' M, the pixels as their
    N). On an H100 at batch 256 ResNet-50's int8 stem ran it in 0.347 ms against 0.392 for the best effort-0 tile
    (`bench/stem.py`), and its int8 3×3 64 → 64 layers in 0.109 against 0.12-0.13 (`bench/int8_epilogue.py`)."""
    tiles = tma_configs(effort, quantized)
    return tiles + [c for c in tma_configs(1, quantized) if c["swap"] and c not in tiles]


def _tma_space(node: Node, effort: int, quantized: bool = False) -> list[dict[str, Any]]:
    """The TMA tactics' tiles for `node` at `effort`: `tiles_with_swap` for a layer of at most 64 output channels
    (the transposed tile's M), `tma_configs` for a wider one."""
    cout = node.inputs[1].shape[0] if node.inputs[1].rank else None
    narrow = isinstance(cout, int) and cout <= 64
    return tiles_with_swap(effort, quantized) if narrow else tma_configs(effort, quantized)


@register_tactic
class CudnnConvTritonEpilogueTactic(Tactic):
    """2-D FusedConv as cuDNN's convolution (torch's, channels_last, without the bias) and then the whole epilogue
    (bias, any activation, residual) in one Triton pass over its output: for the epilogues cuDNN's fused call
    lacks (SiLU, HardSwish, GELU, ...), one read and write of the output where torch's ops make several. The
    convolution's output is rounded to the layer's type before the epilogue (as torch's own path rounds it)."""

    family = "triton"
    name = "cudnn-epilogue"
    op_types = (f"{DOMAIN}::FusedConv",)
    precisions = ("fp16", "bf16")  # fp32 would be TF32 or not by cuDNN's global flag, not by the variant
    layouts = ("NHWC",)
    writes_into = True
    strided_inputs = True  # x and the residual are read through their strides
    strided_outputs = True  # and the output written through its own

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA (cuDNN)"
        if node.inputs[1].rank != 4:
            return f"2-D convolutions only; the weight has rank {node.inputs[1].rank}"
        a = node.attributes
        residual = len(node.inputs) > 3 and node.inputs[3] is not None
        pre, post = a.get("pre", ""), a.get("post", "")
        if (residual and pre == "" and post == "Relu") or (not residual and post == "" and pre in ("", "Relu")):
            return "cuDNN's fused call runs this epilogue inside the convolution (vendor.cudnn-fused)"
        try:
            _activations(node)
        except ValueError as err:
            return str(err)
        return None

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = ConvWindows.of(node.attributes)
        pre, post = _activations(node)
        nhwc_weight = PerWeight(lambda w: w.contiguous(memory_format=torch.channels_last))

        def kernel(inputs, alloc=None):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            begin, end, out_hw = windows.at(x.shape[2:], w.shape[2:])
            if begin != end:
                x = F.pad(x, [p for i in (1, 0) for p in (begin[i], end[i])])
                begin = [0, 0]
            acc = F.conv2d(x.contiguous(memory_format=torch.channels_last), nhwc_weight(w), None, windows.strides,
                           begin, windows.dilations, windows.groups)  # fmt: skip
            out = allocate(alloc, 0, (x.shape[0], w.shape[0], *out_hw), x.dtype, x.device, torch.channels_last)
            return (conv_epilogue_nhwc(acc.contiguous(memory_format=torch.channels_last), b, z, pre=pre, post=post,
                                       out=out),)  # fmt: skip

        return kernel


def _float_output(x: torch.Tensor, b: torch.Tensor | None, z: torch.Tensor | None) -> torch.dtype:
    """The float type a quantized layer writes when it writes float: x's, or for a quantized x the bias's or
    the residual's (the variant converted them), else float32."""
    if not is_quantized_tensor(x):
        return x.dtype
    floats = (t.dtype for t in (b, z) if t is not None and not is_quantized_tensor(t))
    return next(floats, torch.float32)
