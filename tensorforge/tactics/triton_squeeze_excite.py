"""The Triton family's squeeze-and-excitation tactic (CUDA only): `tensorforge::SqueezeExcite` in two launches.

`triton.squeeze-excite` runs `kernels/triton/squeeze_excite.py`: the pooled sums multiplied by W1 inside the
reduction, then the gate recomputed per tile and applied, all in float32, on NCHW or channels_last inputs as they
come. It competes with `vendor.torch-squeeze-excite` (a mean, two `F.linear`, the activations and the product:
six or more launches) and with the reference. The kernel writes into the buffer the execution context gives.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir import Node
from ..kernels.triton.epilogue import activation_args
from ..kernels.triton.squeeze_excite import squeeze_excite, squeeze_excite_configs
from ..ops.fused import DOMAIN
from .base import Kernel, Tactic, allocate, register_tactic
from .triton_family import _NEEDS_CUDA, _float_rank4_reason, _memory_format

Activation = tuple[int, float, float]


def _activations(node: Node) -> tuple[Activation, Activation]:
    """The node's act1 and act2 as the kernel's (code, p0, p1); ValueError when Triton has no code for one."""
    a = node.attributes
    act1 = activation_args(a.get("act1", ""), a.get("act1_params", ()))
    return act1, activation_args(a.get("act2", ""), a.get("act2_params", ()))


def _weights_reason(node: Node) -> str | None:
    """Why W1 and W2 are not [R, C, 1, 1] and [C, R, 1, 1] for the input's C channels, or None."""
    x, w1 = node.inputs[0], node.inputs[1]
    w2 = node.inputs[3] if len(node.inputs) > 3 else None
    if w2 is None:
        return "the expanding weight W2 is missing"
    if w1.rank != 4 or w2.rank != 4 or tuple(w1.shape[2:]) != (1, 1) or tuple(w2.shape[2:]) != (1, 1):
        return f"1×1 weights only; W1 is {w1.shape}, W2 {w2.shape}"
    channels = x.shape[1] if x.shape is not None else None
    hidden = w1.shape[0]
    if w1.shape[1] != channels or tuple(w2.shape[:2]) != (channels, hidden):
        return f"W1 {list(w1.shape)} and W2 {list(w2.shape)} do not map the input's {channels} channels back"
    return None


@register_tactic
class TritonSqueezeExciteTactic(Tactic):
    """SqueezeExcite (`ops/squeeze_excite.py`, any activations of `ops.fused.ACTIVATIONS`) as two Triton launches,
    float32 throughout; the tile is tuned (`squeeze_excite_configs`)."""

    family = "triton"
    name = "squeeze-excite"
    op_types = (f"{DOMAIN}::SqueezeExcite",)
    precisions = ("fp16", "bf16", "fp32")
    writes_into = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return _NEEDS_CUDA
        reason = _float_rank4_reason(node) or _weights_reason(node)
        if reason is not None:
            return reason
        try:
            _activations(node)
        except ValueError as err:
            return str(err)
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return squeeze_excite_configs(effort)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        act1, act2 = _activations(node)

        def kernel(inputs, alloc=None):
            x, w1, b1, w2, b2 = (list(inputs) + [None] * 5)[:5]
            out = allocate(alloc, 0, x.shape, x.dtype, x.device, _memory_format(x))
            return (squeeze_excite(x, w1, b1, w2, b2, act1=act1, act2=act2, out=out, config=config),)

        return kernel
