"""The Gluon stems (Hopper): a stride-2 convolution of few input channels over the input's 2×2 blocks, as
`triton.conv-s2d` runs it (`kernels.space_to_depth`: one pass blocks the input as it comes, in the variant's type
or quantized; the layer is then a KH' × 1 convolution over the view whose pixels hold a whole row of taps), but
on `kernels.gluon.gemm.conv_ws`: the warp-specialized persistent kernel whose producer warp keeps the next tiles'
TMA loads in flight while the consumers multiply, and whose TMA stores of the output are not waited for. A stem
writes far more than it reads (ResNet-50's: 64 output channels a pixel from 12 input ones), which is what the
persistent walk with stores in flight is for.

- `gluon.conv-s2d`: a FusedConv stem in fp16 / bf16.
- `gluon.conv-s2d-quantized`: a QuantizedConv stem whose float input is quantized per tensor by the blocking
  pass; the int8 (E4M3) products, the per-channel scales, the epilogue and the output requantized (or written in
  the variant's float type).

Measured slower than `triton.conv-s2d-quantized` on an H100, so offered from effort 1 only (`EFFORT`; why neither
reaches the stem's bounds is open: docs/design.md, "Stems"). Both take static, even input maps only (an
odd map has no 2×2 blocks: `triton.conv-s2d` takes it through its plain strided kernel, which has no Gluon
counterpart here).
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir import Node
from ..kernels.space_to_depth import blocked_taps, blocked_weight, column_tap_weight
from ..kernels.triton.conv import fit_configs
from ..ops.fused import DOMAIN
from ..ops.pool import ConvWindows
from .base import Kernel, PerWeight, Tactic, allocate, register_tactic
from .gluon_gemm import (
    QuantizedEpilogue,
    conv_problem,
    conv_ws,
    device_problem,
    epilogue_args,
    gemm_config,
    gemm_ws_configs,
    pack_conv_weight,
)
from .triton_conv import FLOAT_INPUTS, accumulations, s2d_channels, s2d_input, s2d_problem
from .variant import float_type

# Offered from this effort on: on an H100, ResNet-50's int8 stem at batch 256 ran 0.416 ms here against 0.395 on
# `triton.conv-s2d-quantized` (the kernels alone, `bench/stem.py`; 0.421 against 0.397 with the blocking pass, in
# the engine's build), and every compiled Gluon kernel lengthens a default build.
EFFORT = 1


def _stem_problem(node: Node) -> str | None:
    """Why `node` is not a stem these tactics take: `s2d_problem`'s, and an input map of static even size."""
    problem = conv_problem(node) or s2d_problem(node)
    if problem:
        return problem
    hw = node.inputs[0].shape[2:] if node.inputs[0].shape is not None else ()
    if len(hw) != 2 or not all(isinstance(d, int) and d % 2 == 0 for d in hw):
        return f"a static input map of even height and width only (2×2 blocks), not {list(hw)}"
    return None


def _packed(weight: torch.Tensor, begin: tuple[int, ...]) -> torch.Tensor:
    """The weight regrouped over the blocks and a row of taps, packed as `conv_ws` takes it."""
    return pack_conv_weight(column_tap_weight(blocked_weight(weight, begin)))


def _space(node: Node, effort: int, quantized: bool) -> list[dict[str, Any]]:
    """From effort 1 (`EFFORT`), the Gluon GEMM space with its tiles fitted to the stem: K tiles no wider than the
    view's channels (a row of taps), N tiles no wider than the output channels."""
    if effort < EFFORT:
        return []
    fitted = fit_configs(
        gemm_ws_configs(effort, quantized), s2d_channels(node), node.inputs[1].shape[0], 32 if quantized else 16
    )
    return accumulations(node, fitted)


@register_tactic
class GluonSpaceToDepthConvTactic(Tactic):
    """A FusedConv stem: the float input blocked as it comes into the variant's type, then `conv_ws` over the
    column-tap view with the weight regrouped the same way."""

    family = "gluon"
    name = "conv-s2d"
    op_types = (f"{DOMAIN}::FusedConv",)
    precisions = ("fp16", "bf16")
    layouts = ("NHWC",)
    writes_into = True
    strided_inputs = True  # the blocking pass reads the input through its strides
    converts_on_load = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        return device_problem(device) or _stem_problem(node)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return gemm_ws_configs(effort)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        return _space(node, effort, quantized=False)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = ConvWindows.of(node.attributes)
        epilogue = epilogue_args(node)
        tiles = gemm_config(config)
        packed = PerWeight(_packed)

        def kernel(inputs, alloc=None):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            begin, _, out_hw = windows.at(x.shape[2:], w.shape[2:])
            out = allocate(alloc, 0, (x.shape[0], w.shape[0], *out_hw), w.dtype, x.device, torch.channels_last)
            z = z.contiguous(memory_format=torch.channels_last) if z is not None else None
            view, pads = s2d_input(x, begin, w.shape[2:], out_hw[1], w.dtype)
            rows = blocked_taps(w.shape[2:], begin)[0]
            weight = packed(w, tuple(begin))
            conv_ws(view, weight, out, tiles, kernel=(rows, 1), pads=tuple(pads), bias=b, z=z, **epilogue)
            return (out,)

        return kernel


@register_tactic
class GluonSpaceToDepthQuantizedConvTactic(Tactic):
    """A QuantizedConv stem whose float input is quantized per tensor: the blocking pass quantizes it (after
    rounding to the variant's 16-bit type, as the reference does), then `conv_ws`'s int8 (E4M3) products times
    x_scale · w_scale[c], the epilogue, the output requantized with y_scale or written in float."""

    family = "gluon"
    name = "conv-s2d-quantized"
    op_types = (f"{DOMAIN}::QuantizedConv",)
    precisions = ("fp16", "bf16", "fp32")
    layouts = ("NHWC",)
    writes_into = True
    strided_inputs = True
    converts_on_load = True
    sees_precision = True  # a float output in the variant's type

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        problem = device_problem(device) or _stem_problem(node)
        if problem is None and (node.inputs[0].dtype not in FLOAT_INPUTS or len(node.inputs) > 5):
            return "a float input quantized per tensor only (the blocking copies float values)"
        return problem

    def space(self, effort: int) -> list[dict[str, Any]]:
        return gemm_ws_configs(effort, quantized=True)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        return _space(node, effort, quantized=True)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = ConvWindows.of(node.attributes)
        epilogue = epilogue_args(node)
        tiles = gemm_config(config)
        packed = PerWeight(_packed)
        x_scale = float(node.attributes["x_scale"])
        terms = QuantizedEpilogue.of(node, config, node.inputs[1].shape[0])
        dtype = float_type(config)
        through = dtype if dtype in (torch.float16, torch.bfloat16) else None  # the variant's rounded input

        def kernel(inputs, alloc=None):
            x, w, b, z, w_scale = (list(inputs) + [None] * 5)[:5]
            begin, _, out_hw = windows.at(x.shape[2:], w.shape[2:])
            out = allocate(alloc, 0, (x.shape[0], w.shape[0], *out_hw), terms.out_type, x.device, torch.channels_last)
            z = z.contiguous(memory_format=torch.channels_last) if z is not None else None
            view, pads = s2d_input(x, begin, w.shape[2:], out_hw[1], w.dtype, x_scale, through)
            rows = blocked_taps(w.shape[2:], begin)[0]
            conv_ws(
                view, packed(w, tuple(begin)), out, tiles, kernel=(rows, 1), pads=tuple(pads), bias=b, z=z,
                **terms.conv_args(w, w_scale, z), **epilogue,
            )  # fmt: skip
            return (out,)

        return kernel
