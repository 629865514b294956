"""Tactics of our own CPU kernels (`kernels/cpu/`, C++ built once per machine):

- `cpu.squeeze-excite`: a SqueezeExcite block in one call (`kernels.cpu.squeeze_excite`), float32, where torch
  runs it as seven ops.

They decline off the CPU, where no C++ compiler or ninja is found, and for activations the kernel lacks.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir import Node
from ..kernels.activations import activation_args
from ..kernels.cpu import squeeze_excite as se
from ..kernels.cpu.extension import compiler_problem
from ..ops.fused import DOMAIN
from .base import Kernel, PerWeight, Tactic, register_tactic


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
        if device.type != "cpu":
            return "a CPU kernel"
        if node.inputs[0].rank != 4:
            return f"a 4-D input only, not rank {node.inputs[0].rank}"
        for key in ("act1", "act2"):
            name = node.attributes.get(key, "")
            if name not in se.ACTIVATIONS:
                return f"the kernel has no {key} {name!r}"
        return compiler_problem()

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        a = node.attributes
        act1, act2 = a.get("act1", ""), a.get("act2", "")
        params1 = activation_args(act1, a.get("act1_params", ()))[1:]
        params2 = activation_args(act2, a.get("act2_params", ()))[1:]
        matrix = PerWeight(lambda w: w.reshape(w.shape[0], w.shape[1]).float().contiguous())
        vector = PerWeight(lambda b: b.float().contiguous())

        def kernel(inputs):
            x, w1, b1, w2, b2 = (list(inputs) + [None] * 5)[:5]
            y = se.squeeze_excite(
                x.float(), matrix(w1), None if b1 is None else vector(b1), matrix(w2),
                None if b2 is None else vector(b2), act1, params1, act2, params2,
            )  # fmt: skip
            return (y.to(x.dtype),)

        return kernel
