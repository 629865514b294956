"""Tactics of our own CPU kernels (`kernels/cpu/`, C++ built once per machine):

- `cpu.squeeze-excite`: a SqueezeExcite block in one call (`kernels.cpu.squeeze_excite`), where torch runs it
  as seven ops.
- `cpu.depthwise`: a depthwise FusedConv with its bias and activation (`kernels.cpu.depthwise`, AVX-512 or AVX2),
  where a oneDNN call through torch costs more to set up than the layer computes.
- `cpu.pointwise`: a 1×1 FusedConv (stride 1, unpadded, one group) with its whole epilogue, residual included
  (`kernels.cpu.pointwise`, AVX-512 or AVX2).
- `cpu.gemm`: a FusedGemm with a constant weight, its whole epilogue inside, as the 1×1 kernel over the rows of A
  (`kernels.cpu.pointwise`: a classifier's matrix-vector product at batch 1 spread over the threads).
- `cpu.pooled-gemm`: a PooledGemm (a classifier's head: global average pool, flatten, product; made by
  `passes.cpu_blocks`) as one call of the 1×1 kernel, the pool into a buffer first.
- `cpu.depthwise-pointwise`: a DepthwisePointwise block (a depthwise convolution and the 1×1 after it, made by
  `passes.cpu_blocks` for CPU builds) in one pass that keeps the depthwise output in cache
  (`kernels.cpu.depthwise_pointwise`, AVX-512 or AVX2).
- `cpu.expand-depthwise`: an ExpandDepthwise block (a 1×1 expansion, the depthwise convolution after it and
  optionally the 1×1 projection after that, made by `passes.cpu_blocks`) in one pass that keeps the expanded tensor
  in cache (`kernels.cpu.expand_depthwise`, AVX-512 or AVX2).
- `cpu.squeeze-excite-pointwise`: a SqueezeExcitePointwise block (squeeze-excite and the 1×1 after it, made by
  `passes.cpu_blocks`) as the gate alone (`kernels.cpu.squeeze_excite.gate`) and the 1×1 kernel with each image's
  weight rows scaled by it.
- `cpu.stem-conv`: a one-group FusedConv of at most four input channels (a network's stem) with its bias and
  activation, reading the network's input as it comes (`kernels.cpu.stem_conv`, AVX-512 or AVX2).
- `cpu.conv`: a one-group FusedConv of any window, stride, dilation and padding with its whole epilogue, residual
  included (`kernels.cpu.conv`, AVX-512 or AVX2: the 1×1 kernel's tile over the window's taps).
- `cpu.patchify`: a FusedConv whose windows tile its input (kernel = stride, unpadded: a vision transformer's patch
  embedding) with its whole epilogue, as the patches copied into rows and the 1×1 kernel over them
  (`kernels.cpu.patchify`).
- `cpu.winograd`: a one-group 3×3 FusedConv at stride 1 with its whole epilogue by Winograd's F(2×2, 3×3) or
  F(4×4, 3×3) (`kernels.cpu.winograd`, AVX-512 or AVX2: 2.25× or 4× fewer multiplications).
- `cpu.layernorm`: LayerNormalization over the last axes, several rows in step (`kernels.cpu.layer_norm`, AVX-512
  or AVX2).
- `cpu.maxpool`: a 2-D MaxPool of channels_last float32, bf16, int8 or uint8 (a quantized activation's codes) with
  any window, stride, dilation and padding (`kernels.cpu.max_pool`).
- `cpu.attention`: Attention (`softmax(Q·Kᵀ·scale + B)·V`) in one pass over each block of query rows, reading Q,
  K and V where the graph left them (`kernels.cpu.attention`, AVX-512 or AVX2).

In float32, and in bf16 where the CPU has bf16 dot products (AVX512-BF16: bf16 activations and 1×1 weights, float32
sums and epilogues) for all but `cpu.squeeze-excite` and `cpu.stem-conv` (and `cpu.winograd` with F(2×2, 3×3)
only).

The convolutions write fresh tensors, not the memory plan's arena: on the CPU a freshly allocated buffer is one the
allocator just freed, still in cache, and engines whose depthwise layers wrote into the arena ran 2-4% slower
(MobileNetV3, EfficientNet-B0; docs/design.md). The exception: `cpu.pointwise`, `cpu.conv` and `cpu.winograd`
write an output that the plan places inside the concatenation reading it (`build.concat_views`) there, at its
channel range, so that the concatenation copies nothing (the detector 1.04-1.07× faster).

They decline off the CPU, where no C++ compiler or ninja is found, and for activations the kernel lacks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..ir import DType, Node
from ..kernels.activations import activation_args
from ..kernels.cpu import attention as at
from ..kernels.cpu import conv as cv
from ..kernels.cpu import depthwise as dw
from ..kernels.cpu import depthwise_pointwise as dp
from ..kernels.cpu import expand_depthwise as ed
from ..kernels.cpu import layer_norm as ln
from ..kernels.cpu import max_pool as mp
from ..kernels.cpu import patchify as pf
from ..kernels.cpu import pointwise as pw
from ..kernels.cpu import squeeze_excite as se
from ..kernels.cpu import stem_conv as st
from ..kernels.cpu import winograd as wg
from ..kernels.cpu.extension import compiler_problem
from ..ops.fused import DOMAIN
from ..ops.pool import PoolWindows, window_geometry
from .base import Kernel, PerWeight, Tactic, register_tactic, statistics_reason
from .vendor import _linear_operands_problem


def _activation(node: Node, slot: str) -> tuple[str, tuple[float, float]]:
    """The activation named by attribute `slot` and its two kernel parameters (`activation_args`)."""
    name = node.attributes.get(slot, "")
    return name, activation_args(name, node.attributes.get(f"{slot}_params", ()))[1:]


def _activations_reason(node: Node, slots: tuple[str, ...], names: tuple[str, ...]) -> str | None:
    """The first activation attribute of `slots` whose activation the kernel (`names`) lacks, as a reason, or None."""
    for slot in slots:
        if node.attributes.get(slot, "") not in names:
            return f"the kernel has no activation {node.attributes.get(slot)!r}"
    return None


def _squeeze_excite_reason(node: Node, device: torch.device, activations: dict[str, tuple[str, ...]]) -> str | None:
    """Why our CPU kernels cannot run a squeeze-excite node: the device, the input's rank, an activation attribute
    (`activations`: the kernel's names by attribute) they lack; or None."""
    if device.type != "cpu":
        return "a CPU kernel"
    if node.inputs[0].rank != 4:
        return f"a 4-D input only, not rank {node.inputs[0].rank}"
    for key, names in activations.items():
        name = node.attributes.get(key, "")
        if name not in names:
            return f"the kernel has no {key} {name!r}"
    return None


def _gate_operands(node: Node) -> Callable[..., tuple]:
    """For a squeeze-excite node: `operands(w1, b1, w2, b2)`, the gate's weights as float32 matrices and vectors
    (prepared once per weight) and its activations, as `kernels.cpu.squeeze_excite` takes them after x."""
    matrix = PerWeight(lambda w: w.reshape(w.shape[0], w.shape[1]).float().contiguous())
    vector = PerWeight(lambda b: b.float().contiguous())
    acts = (*_activation(node, "act1"), *_activation(node, "act2"))

    def operands(w1, b1, w2, b2) -> tuple:
        return (matrix(w1), None if b1 is None else vector(b1), matrix(w2), None if b2 is None else vector(b2), *acts)

    return operands


@register_tactic
class CpuSqueezeExciteTactic(Tactic):
    """The block's two 1×1 weights as [R, C] and [C, R] float32 matrices (kept once), the rest in the kernel; the
    output channels_last."""

    family = "cpu"
    name = "squeeze-excite"
    op_types = (f"{DOMAIN}::SqueezeExcite",)
    precisions = ("fp32",)
    layouts = ("NHWC",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        activations = {"act1": se.ACTIVATIONS, "act2": se.ACTIVATIONS}
        return _squeeze_excite_reason(node, device, activations) or compiler_problem()

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        operands = _gate_operands(node)

        def kernel(inputs):
            x, w1, b1, w2, b2 = (list(inputs) + [None] * 5)[:5]
            return (se.squeeze_excite(x.float(), *operands(w1, b1, w2, b2)).to(x.dtype),)

        return kernel


class _CpuConv(Tactic):
    """What our CPU convolution tactics share: FusedConv, float32, NHWC, a channel slice read as it is."""

    family = "cpu"
    op_types = (f"{DOMAIN}::FusedConv",)
    precisions = ("fp32",)
    layouts = ("NHWC",)
    strided_inputs = True


def _conv_reason(node: Node, device: torch.device) -> str | None:
    """Why none of our CPU convolution kernels runs `node` on `device` (the device, the weight), or None."""
    if device.type != "cpu":
        return "a CPU kernel"
    weight = node.inputs[1]
    if weight.rank != 4:
        return f"2-D convolutions only; the weight has rank {weight.rank}"
    if not weight.is_const:
        return "the weight must be a constant (it is packed once)"
    return None


def _pre_only_reason(node: Node, activations: tuple[str, ...]) -> str | None:
    """Why a kernel with a bias and one activation (`activations`) cannot run `node`'s epilogue, or None."""
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        return "no residual input"
    if node.attributes.get("post", ""):
        return f"no activation after a residual (post={node.attributes['post']!r})"
    pre = node.attributes.get("pre", "")
    if pre not in activations:
        return f"the kernel has no activation {pre!r}"
    return None


def _window(node: Node) -> Callable[[tuple[int, ...], tuple[int, ...]], tuple[list[int], list[int]]]:
    """For a convolution node: `at(input size, kernel size)`, its leading padding and output size
    (`ops.pool.window_geometry`, SAME padding too), worked out once per input size."""
    a = node.attributes
    strides = list(a.get("strides") or [1, 1])
    dilations = list(a.get("dilations") or [1, 1])
    known: dict[tuple[int, ...], tuple[list[int], list[int]]] = {}

    def at(spatial: tuple[int, ...], kernel: tuple[int, ...]) -> tuple[list[int], list[int]]:
        if spatial not in known:
            begin, _, out_hw = window_geometry(
                spatial, kernel, strides, dilations, a.get("pads"), a.get("auto_pad", "NOTSET")
            )
            known[spatial] = (begin, out_hw)
        return known[spatial]

    return at


def _windowed(node: Node, prepare: Callable[..., Any]) -> Kernel:
    """A kernel for a FusedConv: `prepare(weight, bias, strides, dilations)` makes the convolution once per weight
    (its epilogue bound by the caller), and each input size's padding and output size (`_window`) are passed to it
    with the input, then the residual where the node has one."""
    a = node.attributes
    strides = list(a.get("strides") or [1, 1])
    dilations = list(a.get("dilations") or [1, 1])
    convs = PerWeight(lambda w, b: prepare(w, b, strides, dilations))
    window = _window(node)

    def kernel(inputs, alloc=None):
        x = inputs[0]
        conv = convs(inputs[1], inputs[2] if len(inputs) > 2 else None)
        pads, out_hw = window(tuple(x.shape[2:]), conv.kernel)
        if alloc is None:
            return (conv(x, pads, out_hw, *inputs[3:4]),)
        out = alloc(0, (x.shape[0], conv.channels, *out_hw), x.dtype, torch.channels_last)  # (as the input's)
        return (conv(x, pads, out_hw, inputs[3] if len(inputs) > 3 else None, out),)

    return kernel


@register_tactic
class CpuDepthwiseTactic(_CpuConv):
    """The weight packed once as [KH·KW, C rounded up to 16] with its bias; the padding worked out once per input
    size. Reads a channel slice of a channels_last tensor as it is. In bf16 too (a CPU with bf16 dot products: bf16
    loads and stores, float32 arithmetic)."""

    name = "depthwise"
    precisions = ("fp32", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _conv_reason(node, device)
        if reason:
            return reason
        weight = node.inputs[1]
        group = node.attributes.get("group", 1)
        if not (group > 1 and weight.shape[1] == 1 and weight.shape[0] == group):
            return f"not depthwise: group {group}, weight {list(weight.shape)} (needs C output channels, 1 input each)"
        return _pre_only_reason(node, dw.ACTIVATIONS) or dw.problem() or compiler_problem()

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"tile": tile} for tile in dw.TILES]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        pre = _activation(node, "pre")
        return _windowed(node, lambda w, b, strides, dilations: dw.DepthwiseConv(
            w, b, strides, dilations, *pre, config["tile"]))  # fmt: skip


@register_tactic
class CpuPointwiseTactic(_CpuConv):
    """The weight packed once in column blocks of the tile's width (`kernels.cpu.pointwise.pack_weight`) with its
    bias. Reads a channel slice of a channels_last tensor as it is. In bf16 too (a CPU with bf16 dot products)."""

    writes_into = strided_outputs = arena_for_concatenations = True  # a concatenation's channel slice
    name = "pointwise"
    precisions = ("fp32", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _conv_reason(node, device)
        if reason:
            return reason
        weight = node.inputs[1]
        if list(weight.shape[2:]) != [1, 1]:
            return f"1×1 convolutions only; the weight has shape {list(weight.shape)}"
        a = node.attributes
        if a.get("group", 1) != 1:
            return f"one group only, not {a['group']}"
        if list(a.get("strides") or [1, 1]) != [1, 1]:
            return f"stride 1 only, not {list(a['strides'])}"
        if any(a.get("pads") or ()):  # (auto padding pads nothing around a 1×1 window at stride 1)
            return f"no padding, not {list(a['pads'])}"
        return _activations_reason(node, ("pre", "post"), dw.ACTIVATIONS) or pw.problem() or compiler_problem()

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"tile": list(tile)} for tile in pw.TILES]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        epilogue = (*_activation(node, "pre"), *_activation(node, "post"))
        tile = tuple(config["tile"])
        convs = PerWeight(lambda w, b: pw.PointwiseConv(w, b, *epilogue, tile))

        def kernel(inputs, alloc=None):
            x = inputs[0]
            conv = convs(inputs[1], inputs[2] if len(inputs) > 2 else None)
            residual = inputs[3] if len(inputs) > 3 else None
            if alloc is None:
                return (conv(x, residual),)
            out = alloc(0, (x.shape[0], conv.channels, *x.shape[2:]), conv.dtype, torch.channels_last)
            return (conv(x, residual, out=out),)

        return kernel


def _products(node: Node, config: dict[str, Any]) -> PerWeight:
    """A FusedGemm-like node's constant weight B (and bias) packed once as the 1×1 kernel's, with its epilogue."""
    epilogue = (*_activation(node, "pre"), *_activation(node, "post"))
    tile = tuple(config["tile"])
    transposed = bool(node.attributes.get("transB", 0))

    def derive(w, b):
        rows = w if transposed else w.t()  # [K, C]: a 1×1 convolution's weight
        return pw.PointwiseConv(rows[:, :, None, None], None if b is None else b.reshape(-1), *epilogue, tile)

    return PerWeight(derive)


@register_tactic
class CpuGemmTactic(Tactic):
    """FusedGemm `post(pre(A @ op(B) + C) + Z)` with B a constant matrix: the 1×1 kernel over A's rows, each a pixel
    of a 1×1 image, B packed once as that kernel's weight and C as its bias. The residual Z must be the output's
    shape. In bf16 too (a CPU with bf16 dot products)."""

    family = "cpu"
    name = "gemm"
    op_types = (f"{DOMAIN}::FusedGemm",)
    precisions = ("fp32", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cpu":
            return "a CPU kernel"
        a = node.attributes
        weight = node.inputs[1]
        if not weight.is_const or weight.rank != 2:
            return "the weight must be a constant matrix (it is packed once)"
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
            return "no transA, alpha or beta"
        n = weight.shape[0 if a.get("transB", 0) else 1]
        residual = node.inputs[3] if len(node.inputs) > 3 else None
        if residual is not None and residual.shape != node.outputs[0].shape:
            return "a residual of the output's shape only"
        reason = _linear_operands_problem(node, n) or _activations_reason(node, ("pre", "post"), pw.ACTIVATIONS)
        if reason:
            return reason
        return pw.problem() or compiler_problem()

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"tile": list(tile)} for tile in pw.TILES]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        products = _products(node, config)

        def kernel(inputs):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            product = products(w, b)
            rows = x.reshape(-1, x.shape[-1])[:, :, None, None]
            residual = None if z is None else z.reshape(-1, product.channels)[:, :, None, None]
            return (product(rows, residual).reshape(*x.shape[:-1], product.channels),)

        return kernel


@register_tactic
class CpuPooledGemmTactic(Tactic):
    """PooledGemm (a global average pool, flattened, then a product: `passes.cpu_blocks`) as one call of the 1×1
    kernel: each image's mean pixel into a buffer, then the product with B packed once as in `cpu.gemm`. In bf16 too
    (a CPU with bf16 dot products)."""

    family = "cpu"
    name = "pooled-gemm"
    op_types = (f"{DOMAIN}::PooledGemm",)
    precisions = ("fp32", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cpu":
            return "a CPU kernel"
        return _activations_reason(node, ("pre", "post"), pw.ACTIVATIONS) or pw.problem() or compiler_problem()

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"tile": list(tile)} for tile in pw.TILES]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        products = _products(node, config)

        def kernel(inputs):
            x, w, b = (list(inputs) + [None] * 3)[:3]
            return (products(w, b).pooled(x),)

        return kernel


@register_tactic
class CpuDepthwisePointwiseTactic(_CpuConv):
    """Both weights and biases packed once; the depthwise padding worked out once per input size. Reads a channel
    slice of a channels_last tensor as it is. In bf16 too (a CPU with bf16 dot products)."""

    name = "depthwise-pointwise"
    op_types = (f"{DOMAIN}::DepthwisePointwise",)
    precisions = ("fp32", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _conv_reason(node, device)
        if reason:
            return reason
        return _activations_reason(node, ("act", "pre", "post"), dp.ACTIVATIONS) or dp.problem() or compiler_problem()

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"tile": list(tile)} for tile in dp.TILES]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        a = node.attributes
        strides = list(a.get("strides") or [1, 1])
        dilations = list(a.get("dilations") or [1, 1])
        act, pre, post = (_activation(node, slot) for slot in ("act", "pre", "post"))
        tile = tuple(config["tile"])
        blocks = PerWeight(lambda wd, bd, wp, bp: dp.DepthwisePointwise(
            wd, bd, strides, dilations, *act, wp, bp, *pre, *post, tile))  # fmt: skip
        window = _window(node)

        def kernel(inputs):
            x, wd, bd, wp, bp, z = (list(inputs) + [None] * 6)[:6]
            block = blocks(wd, bd, wp, bp)
            return (block(x, *window(tuple(x.shape[2:]), block.kernel), z),)

        return kernel


@register_tactic
class CpuExpandDepthwiseTactic(_CpuConv):
    """ExpandDepthwise (an expansion, a depthwise convolution and optionally the projection, made by
    `passes.cpu_blocks` for CPU builds), the weights and biases packed once, the depthwise padding worked out once
    per input size, in one of two schedules: "one pass", which never writes the expanded tensor
    (`kernels.cpu.expand_depthwise`), or "apart": the 1×1 kernel, then the depthwise (+ 1×1) kernel, as the
    unfused layers would run, minus a layer's call. The autotuner's isolated timings cannot tell them apart (within
    0-4% on most layers: which won changed from build to build), while in the network the one pass pays only where
    the expanded tensor outgrows a core's L2 (MobileNetV3's 112² block, EfficientNet-B0's 112² and 56² ones), so
    `space_for` picks the schedule by that size (docs/design.md). Reads a channel slice of a channels_last tensor as
    it is. In bf16 too (a CPU with bf16 dot products)."""

    name = "expand-depthwise"
    op_types = (f"{DOMAIN}::ExpandDepthwise",)
    precisions = ("fp32", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _conv_reason(node, device)
        if reason:
            return reason
        slots = ("expand_act", "act", "pre", "post")
        return _activations_reason(node, slots, ed.ACTIVATIONS) or ed.problem() or compiler_problem()

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"tile": list(tile), "schedule": schedule} for tile in ed.TILES for schedule in ("one pass", "apart")]

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        """The one pass where an image's expanded tensor is larger than a core's level-2 cache (apart, it would go
        through the level-3 cache and back), else the kernels apart (it stays in L2 between them); the tiles timed."""
        shape, expanded = node.inputs[0].shape or (), node.inputs[1].shape[0]
        known = len(shape) == 4 and all(isinstance(d, int) for d in shape[2:])
        schedule = "one pass" if not known or shape[2] * shape[3] * expanded * 4 > ed.l2_bytes() else "apart"
        return [config for config in self.space(effort) if config["schedule"] == schedule]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        a = node.attributes
        strides = list(a.get("strides") or [1, 1])
        dilations = list(a.get("dilations") or [1, 1])
        expand, act, pre, post = (_activation(node, slot) for slot in ("expand_act", "act", "pre", "post"))
        tile = tuple(config["tile"])
        window = _window(node)

        def one_pass(we, be, wd, bd, wp, bp):
            block = ed.ExpandDepthwise(we, be, *expand, wd, bd, strides, dilations, *act, wp, bp, *pre, *post, tile)
            return lambda x, pads, out_hw, z: block(x, pads, out_hw, z)

        def apart(we, be, wd, bd, wp, bp):
            first = pw.PointwiseConv(we, be, *expand, tile=tile)
            if wp is None:
                second = dw.DepthwiseConv(wd, bd, strides, dilations, *act)
                return lambda x, pads, out_hw, z: second(first(x), pads, out_hw)
            second = dp.DepthwisePointwise(wd, bd, strides, dilations, *act, wp, bp, *pre, *post, tile)
            return lambda x, pads, out_hw, z: second(first(x), pads, out_hw, z)

        blocks = PerWeight(one_pass if config.get("schedule", "one pass") == "one pass" else apart)
        kernel_size = tuple(node.inputs[3].shape[2:])

        def kernel(inputs):
            x, we, be, wd, bd, wp, bp, z = (list(inputs) + [None] * 8)[:8]
            return (blocks(we, be, wd, bd, wp, bp)(x, *window(tuple(x.shape[2:]), kernel_size), z),)

        return kernel


@register_tactic
class CpuSqueezeExcitePointwiseTactic(Tactic):
    """The gate's two matrices and the 1×1 weight packed once; the gate computed per call, then the 1×1 product
    of the gated input without writing it. In bf16 too (a CPU with bf16 dot products: the gate float32)."""

    family = "cpu"
    name = "squeeze-excite-pointwise"
    op_types = (f"{DOMAIN}::SqueezeExcitePointwise",)
    precisions = ("fp32", "bf16")
    layouts = ("NHWC",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        activations = {"act1": se.ACTIVATIONS, "act2": se.ACTIVATIONS, "pre": pw.ACTIVATIONS, "post": pw.ACTIVATIONS}
        return _squeeze_excite_reason(node, device, activations) or pw.problem() or compiler_problem()

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"tile": list(tile)} for tile in pw.TILES]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        operands = _gate_operands(node)
        epilogue = (*_activation(node, "pre"), *_activation(node, "post"))
        tile = tuple(config["tile"])
        convs = PerWeight(lambda w, b: pw.PointwiseConv(w, b, *epilogue, tile))

        def kernel(inputs):
            x, w1, b1, w2, b2, wp, bp, z = (list(inputs) + [None] * 8)[:8]
            x = x.contiguous(memory_format=torch.channels_last)
            return (convs(wp, bp)(x, z, None, se.gate(x, *operands(w1, b1, w2, b2))),)

        return kernel


@register_tactic
class CpuConvTactic(_CpuConv):
    """The weight packed once in column blocks of the tile's width (`kernels.cpu.conv.pack_weight`) with its bias;
    the padding worked out once per input size. Reads a channel slice of a channels_last tensor as it is. Leaves
    1×1 layers at stride 1 without padding to `cpu.pointwise` and stems to `cpu.stem-conv`. In bf16 too (a CPU with
    bf16 dot products)."""

    writes_into = strided_outputs = arena_for_concatenations = True  # a concatenation's channel slice
    name = "conv"
    precisions = ("fp32", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _conv_reason(node, device)
        if reason:
            return reason
        weight, a = node.inputs[1], node.attributes
        if a.get("group", 1) != 1:
            return f"one group only, not {a['group']}"
        if weight.shape[1] <= st.MAX_CHANNELS:
            return f"{weight.shape[1]} input channels: a stem, for cpu.stem-conv"
        unit = list(a.get("strides") or [1, 1]) == [1, 1] and not any(a.get("pads") or ())
        if list(weight.shape[2:]) == [1, 1] and unit and a.get("auto_pad", "NOTSET") in ("NOTSET", "VALID"):
            return "a 1×1 convolution at stride 1 without padding: cpu.pointwise runs it"
        return _activations_reason(node, ("pre", "post"), cv.ACTIVATIONS) or cv.problem() or compiler_problem()

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"tile": list(tile)} for tile in cv.TILES]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        epilogue = (*_activation(node, "pre"), *_activation(node, "post"))
        tile = tuple(config["tile"])
        return _windowed(node, lambda w, b, strides, dilations: cv.DirectConv(
            w, b, strides, dilations, *epilogue, tile))  # fmt: skip


@register_tactic
class CpuPatchifyTactic(_CpuConv):
    """The weight packed once as the 1×1 kernel's, its C·KH·KW terms in the order the input's layout puts the
    patches' values in; reads its input (an NCHW network input too) and residual as they come."""

    name = "patchify"
    converts_on_load = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _conv_reason(node, device)
        if reason:
            return reason
        weight, a = node.inputs[1], node.attributes
        kernel = list(weight.shape[2:])
        if a.get("group", 1) != 1:
            return f"one group only, not {a['group']}"
        if kernel == [1, 1]:
            return "a 1×1 window: cpu.pointwise runs it"
        strides = list(a.get("strides") or [1, 1])
        if strides != kernel:
            return f"windows that tile the input only: strides {strides}, window {kernel}"
        if any(d != 1 for d in a.get("dilations") or ()):
            return f"no dilation, not {list(a['dilations'])}"
        if any(a.get("pads") or ()) or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return "no padding"
        return _activations_reason(node, ("pre", "post"), pw.ACTIVATIONS) or pw.problem() or compiler_problem()

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"tile": list(tile)} for tile in pw.ROW_TILES]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        epilogue = (*_activation(node, "pre"), *_activation(node, "post"))
        tile = tuple(config["tile"])
        convs = PerWeight(lambda w, b: pf.PatchConv(w, b, *epilogue, tile))

        def kernel(inputs):
            conv = convs(inputs[1], inputs[2] if len(inputs) > 2 else None)
            residual = inputs[3] if len(inputs) > 3 else None
            return (conv(inputs[0], None if residual is None else residual.float()),)

        return kernel


@register_tactic
class CpuWinogradTactic(_CpuConv):
    """The weight transformed and packed once for each output tile size (`kernels.cpu.winograd.pack_weight`) with
    its bias; the padding worked out once per input size. Reads a channel slice of a channels_last tensor as it
    is. In bf16 too (a CPU with bf16 dot products), with F(2×2, 3×3) only (the kernel refuses m = 4 there)."""

    writes_into = strided_outputs = arena_for_concatenations = True  # a concatenation's channel slice
    name = "winograd"
    precisions = ("fp32", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _conv_reason(node, device)
        if reason:
            return reason
        weight, a = node.inputs[1], node.attributes
        if a.get("group", 1) != 1:
            return f"one group only, not {a['group']}"
        if list(weight.shape[2:]) != [3, 3]:
            return f"3×3 windows only, not {'×'.join(map(str, weight.shape[2:]))}"
        for name in ("strides", "dilations"):
            if list(a.get(name) or [1, 1]) != [1, 1]:
                return f"{name} of 1 only, not {list(a[name])}"
        return _activations_reason(node, ("pre", "post"), wg.ACTIVATIONS) or wg.problem() or compiler_problem()

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"m": m, "tile": list(tile)} for m in sorted(wg.TRANSFORMS, reverse=True) for tile in wg.TILES]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        epilogue = (*_activation(node, "pre"), *_activation(node, "post"))
        m, tile = config["m"], tuple(config["tile"])
        return _windowed(node, lambda w, b, strides, dilations: wg.WinogradConv(w, b, m, *epilogue, tile))


@register_tactic
class CpuStemConvTactic(_CpuConv):
    """The weight packed once as [C·KH·KW, K rounded up to 16] with its bias; the padding worked out once per input
    size. Reads its input in whatever layout it comes (an NCHW network input is not copied to channels_last
    first)."""

    name = "stem-conv"
    converts_on_load = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _conv_reason(node, device)
        if reason:
            return reason
        a = node.attributes
        if a.get("group", 1) != 1:
            return f"one group only, not {a['group']}"
        channels = node.inputs[1].shape[1]
        if channels > st.MAX_CHANNELS:
            return f"at most {st.MAX_CHANNELS} input channels (a stem), not {channels}"
        return _pre_only_reason(node, st.ACTIVATIONS) or st.problem() or compiler_problem()

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        pre = _activation(node, "pre")
        return _windowed(node, lambda w, b, strides, dilations: st.StemConv(w, b, strides, dilations, *pre))


@register_tactic
class CpuAttentionTactic(Tactic):
    """Attention(Q, Kᵀ, V, B?) in one call of the kernel; Kᵀ, V and the bias broadcast over Q's leading axes; a
    transposed result ([B, Sq, H, Dv]) written by the kernel through the transposed view."""

    family = "cpu"
    name = "attention"
    op_types = (f"{DOMAIN}::Attention",)
    precisions = ("fp32", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cpu":
            return "a CPU kernel"
        q, kt, v = node.inputs[:3]
        if q.rank not in (3, 4) or kt.rank != q.rank or v.rank != q.rank:
            return "3-D or 4-D Q, Kᵀ and V of one rank"
        if node.attributes.get("transposed", 0) and q.rank != 4:
            return "a transposed result of 4-D operands"
        size = v.shape[-1]
        if not isinstance(size, int) or size > at.MAX_VALUE_SIZE:
            return f"V's head size a known number up to {at.MAX_VALUE_SIZE}, not {size!r}"
        bias = node.inputs[3] if len(node.inputs) > 3 else None
        for operand in (kt, v, bias):
            if operand is None:
                continue
            if operand.rank is None or operand.rank > q.rank:
                return "a bias of at most Q's rank"
            extra, lead = tuple(operand.shape[:-2]), tuple(q.shape[:-2])
            pairs = zip(lead[len(lead) - len(extra) :], extra, strict=True)
            if any(isinstance(b, int) and b not in (1, a) for a, b in pairs):
                return f"{operand.name}'s leading axes broadcast to Q's"
        return at.problem() or compiler_problem()

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        scale = float(node.attributes.get("scale", 1.0))
        transposed = bool(node.attributes.get("transposed", 0))

        def kernel(inputs):
            q, kt, v, bias = (list(inputs) + [None] * 4)[:4]
            if not transposed:
                return (at.attention(q, kt, v, bias, scale),)
            batch, heads, rows, _ = q.shape
            out = torch.empty(batch, rows, heads, v.shape[-1], dtype=q.dtype)
            at.attention(q, kt, v, bias, scale, out=out.transpose(1, 2))  # each head's rows written in place
            return (out,)

        return kernel


@register_tactic
class CpuLayerNormTactic(Tactic):
    """LayerNormalization from `axis` on, its scale and bias as float32 vectors (kept once); Y, or Q(Y) and (the
    domain norm's second output) Y beside it."""

    family = "cpu"
    name = "layernorm"
    op_types = ("LayerNormalization", f"{DOMAIN}::LayerNormalization")
    precisions = ("fp32", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cpu":
            return "a CPU kernel"
        reason = statistics_reason(node, quantizes=True)
        if reason:
            return reason
        if node.attributes.get("y_scale", 0.0) and node.attributes.get("quant", "int8") != "int8":
            return "a quantized output in int8 only"
        x = node.inputs[0]
        if x.rank is None or x.rank == 0:
            return "an input of known rank, at least 1"
        return ln.problem() or compiler_problem()

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        axis = node.attributes.get("axis", -1)
        epsilon = float(node.attributes.get("epsilon", 1e-5))
        y_scale = float(node.attributes.get("y_scale", 0.0))
        both = len(node.outputs) > 1

        vector = PerWeight(lambda t, shape: t.broadcast_to(shape).reshape(-1).float().contiguous())

        def kernel(inputs):
            x, scale, bias = (list(inputs) + [None] * 3)[:3]
            shape = tuple(x.shape[axis % x.dim() :])
            bias = None if bias is None else vector(bias, shape)
            y = ln.layer_norm(x, vector(scale, shape), bias, epsilon, axis, y_scale, copy=both)
            return y if both else (y,)

        return kernel


_POOLED = (DType.FLOAT, DType.BFLOAT16, DType.INT8, DType.UINT8)


@register_tactic
class CpuMaxPoolTactic(Tactic):
    """Reads a channel slice of a channels_last tensor as it is. A quantized activation's codes are pooled as they
    are (a positive scale keeps their order)."""

    family = "cpu"
    name = "maxpool"
    op_types = ("MaxPool",)
    precisions = ("fp32", "bf16")
    layouts = ("NHWC",)
    strided_inputs = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cpu":
            return "a CPU kernel"
        if len(node.outputs) > 1 and node.outputs[1].name:
            return "the indices output is computed only by the reference"
        if node.inputs[0].rank != 4:
            return f"2-D windows only; the input has rank {node.inputs[0].rank}"
        dtype = node.inputs[0].dtype
        if dtype not in _POOLED:
            return f"float32, bf16, int8 or uint8 only, not {dtype.name}"
        return compiler_problem()

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = PoolWindows.of(node.attributes)

        def kernel(inputs):
            x = inputs[0]
            begin, _, out = windows.at(x.shape[2:])
            return (mp.max_pool2d(x, windows.kernel, windows.strides, windows.dilations, begin, out),)

        return kernel
