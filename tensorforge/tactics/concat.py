"""`vendor.concat-into`: a channel concatenation of 4-D tensors into one channels_last buffer that the execution
context can place, one strided copy per input (on CUDA our tiled `strided_copy`, else torch's), skipping each input
that its producer already wrote in place (the memory plan's views, `build.concat_views`)."""

from __future__ import annotations

from typing import Any

import torch

from ..ir import Node
from ..kernels.triton.copy import strided_copy, tiled
from .base import Kernel, Tactic, allocate, register_tactic


@register_tactic
class ConcatIntoTactic(Tactic):
    """Concat along the channels of 4-D tensors, written into a channels_last output (from the arena when the
    plan placed it); an input that already is the output's channel slice at its place is not copied."""

    family = "vendor"
    name = "concat-into"
    op_types = ("Concat",)
    precisions = ("fp32", "fp16", "bf16")
    layouts = ("NHWC",)
    writes_into = True
    strided_inputs = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        rank = node.outputs[0].rank
        if rank != 4:
            return f"4-D concatenations only; this one has rank {rank}"
        axis = node.attributes.get("axis", 1)
        if axis not in (1, -3):
            return f"along the channels only (axis 1); this one is along axis {axis}"
        return None

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        label = node.label

        def kernel(inputs, alloc=None):
            first = inputs[0]
            n, _, h, w = first.shape
            for tensor in inputs:
                if tensor.dim() != 4 or (tensor.shape[0], *tensor.shape[2:]) != (n, h, w):
                    shapes = [list(t.shape) for t in inputs]
                    raise ValueError(f"{label}: Concat along channels needs equal N, H, W; got inputs {shapes}")
            total = sum(tensor.shape[1] for tensor in inputs)
            out = allocate(alloc, 0, (n, total, h, w), first.dtype, first.device, torch.channels_last)
            channel = 0
            for tensor in inputs:
                part = out[:, channel : channel + tensor.shape[1]]
                if tensor.numel() and (tensor.data_ptr() != part.data_ptr() or tensor.stride() != part.stride()):
                    if tiled(tensor, part.dtype):
                        strided_copy(tensor, part)  # tiled: 1.34x torch's cat on a C2f concatenation (H200)
                    else:
                        part.copy_(tensor)
                channel += tensor.shape[1]
            return (out,)

        return kernel
