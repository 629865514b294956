"""The Triton concatenation tactic: its kernel through `build` under the interpreter against the reference Concat
(a detector's output concatenation of reshaped channels_last head maps), what it declines, and its place among
the candidates on CUDA."""

import math

import pytest
import torch
from onnx import TensorProto, helper

from tensorforge.frontend import import_model
from tensorforge.tactics.autotune import autotune, build_layer_kernel
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, tensor_info

CONCAT = "triton.concat"
CPU = torch.device("cpu")
TINY = {"precision": "fp32", "layout": "any", "block_a": 16, "block_b": 16, "num_warps": 1}


def _concat(shapes, axis, elem_type=TensorProto.FLOAT):
    """A model of one Concat of inputs of `shapes`; returns its node."""
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Concat", names, ["y"], axis=axis)
    infos = [tensor_info(n, list(s), elem_type) for n, s in zip(names, shapes, strict=True)]
    return import_model(make_model([node], infos, [tensor_info("y", None, elem_type)], 17)).graph.nodes[0]


def _heads(device, sides, channels=6, batch=2):
    maps = [torch.randn(batch, channels, s, s, device=device) for s in sides]
    return [m.contiguous(memory_format=torch.channels_last).reshape(batch, channels, -1) for m in maps]


@pytest.mark.parametrize("axis", [2, -1])
def test_matches_the_reference_concat_under_the_interpreter(axis):
    torch.manual_seed(0)
    heads = _heads(CPU, (4, 2))
    node = _concat([h.shape for h in heads], axis)
    assert tactic_by_key(CONCAT).supports(node, 17, torch.device("cuda")) is None
    kernel = build_layer_kernel(tactic_by_key(CONCAT), node, 17, CPU, TINY, {})
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 17, CPU, {}, {})
    assert torch.equal(kernel(heads)[0], reference(heads)[0])


def test_keeps_channels_last_maps_channels_last():
    torch.manual_seed(1)
    maps = [torch.randn(2, c, 3, 3).contiguous(memory_format=torch.channels_last) for c in (4, 5)]
    node = _concat([m.shape for m in maps], 1)
    kernel = build_layer_kernel(tactic_by_key(CONCAT), node, 17, CPU, TINY, {})
    (got,) = kernel(maps)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, torch.cat(maps, dim=1))


def test_declines_with_reasons():
    tactic = tactic_by_key(CONCAT)
    assert "needs CUDA" in tactic.supports(_concat([(2, 3), (2, 3)], 0), 17, CPU)
    shapes = _concat([(2,), (3,)], 0, TensorProto.INT64)
    assert "INT64" in tactic.supports(shapes, 17, torch.device("cuda"))


@pytest.mark.gpu
def test_the_concat_is_a_correct_candidate_on_cuda():
    heads = _heads("cuda", (80, 40, 20), channels=144, batch=4)
    node = _concat([h.shape for h in heads], 2)
    choice = autotune(node, 17, heads, "cuda", effort=0, precisions=("fp32", "fp16"), exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == CONCAT]
    assert len(ours) == 2 * len(tactic_by_key(CONCAT).space(0))
    assert all(math.isfinite(c.median_ms) for c in ours), [c.note for c in ours]
