"""The Triton family: our own kernels (`kernels/triton/`) as tactics, CUDA only."""

from __future__ import annotations

from typing import Any

import torch

from ..ir import Node
from ..kernels.triton.pool import max_pool2d
from ..ops.pool import PoolWindows
from .base import Kernel, Tactic, register_tactic


@register_tactic
class TritonMaxPoolTactic(Tactic):
    """2-D MaxPool, channels innermost (coalesced on NHWC); the block of channels per program is tuned."""

    family = "triton"
    name = "maxpool"
    op_types = ("MaxPool",)

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs CUDA"
        if len(node.outputs) > 1 and node.outputs[1].name:
            return "the indices output is computed only by the reference"
        if node.inputs[0].rank != 4:
            return f"2-D windows only; the input has rank {node.inputs[0].rank}"
        if not node.inputs[0].dtype.is_float:
            return "float inputs only"
        return None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return [{"block_c": 64}] if effort == 0 else [{"block_c": b} for b in (32, 64, 128)]

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = PoolWindows.of(node.attributes)
        block_c = config.get("block_c", 64)

        def kernel(inputs):
            x = inputs[0]
            begin, _, out = windows.at(x.shape[2:])
            return (max_pool2d(x, windows.kernel, windows.strides, begin, windows.dilations, out, block_c),)

        return kernel
