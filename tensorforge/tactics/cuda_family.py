"""The CUDA C family: our NVRTC-compiled kernels (`kernels/cuda/`) as tactics, CUDA only.

- `cuda.depthwise`: depthwise convolutions (group == input channels == output channels);
- `cuda.direct-conv`: groups = 1, input tiles and filters staged in shared memory;
- `cuda.winograd`: 3×3 stride-1 groups = 1 as Winograd F(2×2, 3×3) (transforms in CUDA C, GEMMs in cuBLAS);
- `cuda.layernorm`: LayerNormalization, one warp a row held in registers.
The convolutions read channels_last activations, keep the whole epilogue in the kernel and pack the weight once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..ir import Node
from ..kernels.activations import ACTIVATION_CODES, activation_args
from ..kernels.cuda.depthwise import depthwise_configs, depthwise_conv2d, pack_depthwise_weight
from ..kernels.cuda.direct_conv import direct_configs, direct_conv2d, pack_direct_weight
from ..kernels.cuda.layer_norm import LONGEST_ROW, layer_norm_configs, layer_norm_rows
from ..kernels.cuda.nvrtc import unavailable
from ..kernels.cuda.winograd import pack_winograd_weight, winograd_configs, winograd_conv2d
from ..ops.fused import DOMAIN
from ..ops.pool import window_geometry
from .base import Kernel, PerWeight, Tactic, allocate, register_tactic, statistics_reason


def _common_reason(node: Node, device: torch.device) -> str | None:
    if device.type != "cuda":
        return "needs CUDA"
    missing = unavailable()
    if missing:
        return missing
    weight = node.inputs[1]
    if weight.rank != 4:
        return f"2-D convolutions only; the weight has rank {weight.rank}"
    if not weight.is_const:
        return "the weight must be a constant (it is packed once)"
    if not node.inputs[0].dtype.is_float:
        return "float inputs only"
    a = node.attributes
    for slot in ("pre", "post"):
        if a.get(slot, "") not in ACTIVATION_CODES:
            return f"no CUDA C epilogue for activation {a.get(slot)!r}"
    return None


class _CudaConv(Tactic):
    family = "cuda"
    op_types = (f"{DOMAIN}::FusedConv",)
    precisions = ("fp32", "fp16", "bf16")
    layouts = ("NHWC",)
    writes_into = True
    pack: Callable[[torch.Tensor], torch.Tensor]
    run: Callable[..., torch.Tensor]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        a = node.attributes
        strides = list(a.get("strides") or [1, 1])
        dilations = list(a.get("dilations") or [1, 1])
        pre = activation_args(a.get("pre", ""), a.get("pre_params", ()))
        post = activation_args(a.get("post", ""), a.get("post_params", ()))
        packed: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        pack, run = type(self).pack, type(self).run

        def kernel(inputs, alloc=None):
            x, w, b, z = (list(inputs) + [None] * 4)[:4]
            key = (w.data_ptr(), w.dtype)
            weight = packed.get(key)
            if weight is None:
                weight = packed[key] = pack(w)
            begin, _, out_hw = window_geometry(
                x.shape[2:], w.shape[2:], strides, dilations, a.get("pads"), a.get("auto_pad", "NOTSET")
            )
            x = x.contiguous(memory_format=torch.channels_last)
            shape = (x.shape[0], w.shape[0], *out_hw)
            out = allocate(alloc, 0, shape, x.dtype, x.device, torch.channels_last)
            y = run(
                x, weight, list(w.shape[2:]), b, z, strides=strides, pads_begin=begin, dilations=dilations,
                out_hw=out_hw, pre=pre, post=post, config=config, out=out,
            )  # fmt: skip
            return (y,)

        return kernel


@register_tactic
class CudaDepthwiseTactic(_CudaConv):
    name = "depthwise"
    pack = staticmethod(pack_depthwise_weight)
    run = staticmethod(depthwise_conv2d)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _common_reason(node, device)
        if reason:
            return reason
        weight_shape = node.inputs[1].shape
        group = node.attributes.get("group", 1)
        if not (group > 1 and weight_shape[1] == 1 and weight_shape[0] == group):
            return f"not depthwise: group {group}, weight {list(weight_shape)} (needs C output channels, 1 input each)"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return depthwise_configs(effort)


@register_tactic
class CudaDirectConvTactic(_CudaConv):
    name = "direct-conv"
    pack = staticmethod(pack_direct_weight)
    run = staticmethod(direct_conv2d)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _common_reason(node, device)
        if reason:
            return reason
        if node.attributes.get("group", 1) != 1:
            return f"groups = 1 only; this layer has group {node.attributes.get('group')}"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return direct_configs(effort)


@register_tactic
class CudaWinogradTactic(_CudaConv):
    name = "winograd"
    pack = staticmethod(pack_winograd_weight)
    run = staticmethod(winograd_conv2d)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        reason = _common_reason(node, device)
        if reason:
            return reason
        a = node.attributes
        kernel = list(node.inputs[1].shape[2:])
        strides, dilations = list(a.get("strides") or [1, 1]), list(a.get("dilations") or [1, 1])
        if kernel != [3, 3] or strides != [1, 1] or dilations != [1, 1] or a.get("group", 1) != 1:
            return f"F(2x2, 3x3) needs a 3x3 stride-1 undilated dense filter; this is {kernel} s{strides} d{dilations}"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return winograd_configs(effort)


@register_tactic
class CudaLayerNormTactic(Tactic):
    """LayerNormalization over axes [axis, rank) whose normalized size is static and fits a warp's registers."""

    family = "cuda"
    name = "layernorm"
    writes_into = True
    op_types = ("LayerNormalization", f"{DOMAIN}::LayerNormalization")
    precisions = ("fp32", "fp16", "bf16")

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA"
        missing = unavailable()
        if missing:
            return missing
        reason = statistics_reason(node)
        if reason:
            return reason
        x = node.inputs[0]
        if x.rank is None or x.rank == 0 or not x.dtype.is_float:
            return f"a float input of known rank only, got {x.dtype} rank {x.rank}"
        normalized = x.shape[node.attributes.get("axis", -1) % x.rank :]
        if not all(isinstance(d, int) for d in normalized):
            return f"the normalized axes must be static, got {list(normalized)}"
        if math.prod(normalized) > LONGEST_ROW:
            return f"rows of {math.prod(normalized)} elements do not fit a warp's registers (at most {LONGEST_ROW})"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return layer_norm_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        x_value = node.inputs[0]
        normalized = tuple(x_value.shape[node.attributes.get("axis", -1) % x_value.rank :])
        n = math.prod(normalized)
        epsilon = float(node.attributes.get("epsilon", 1e-5))
        as_float = PerWeight(lambda t: t.broadcast_to(normalized).reshape(n).float().contiguous())  # scale, bias

        def kernel(inputs, alloc=None):
            x, scale, bias = (list(inputs) + [None] * 3)[:3]
            out = allocate(alloc, 0, x.shape, x.dtype, x.device)
            bias = as_float(bias) if bias is not None else None
            y = layer_norm_rows(x.contiguous(), as_float(scale), bias, epsilon=epsilon, config=config, out=out)
            return (y,)

        return kernel
