"""The nearest-upsampling tactic: which Resize attribute sets it takes (those whose nearest index is
output // factor, checked here against the reference Resize), its kernel through `build` under the interpreter,
and its place among the candidates on CUDA."""

import math

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.tactics.autotune import autotune, build_layer_kernel
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, tensor_info

UPSAMPLE = "triton.upsample-nearest"
CPU = torch.device("cpu")
TINY = {"block_p": 16, "block_c": 16, "num_warps": 1}


def _resize(scales=(1, 1, 2, 2), sizes=None, opset=17, shape=(2, 8, 5, 4), **attributes):
    """A model of one Resize; returns its node and opset."""
    inputs = ["x", "", "scales"] if sizes is None else ["x", "", "", "sizes"]
    if opset <= 10:
        inputs = ["x", "scales"]
    inits = [numpy_helper.from_array(np.array(scales, np.float32), "scales")]
    if sizes is not None:
        inits = [numpy_helper.from_array(np.array(sizes, np.int64), "sizes")]
    node = helper.make_node("Resize", inputs, ["y"], **attributes)
    model = import_model(make_model([node], [tensor_info("x", list(shape))], [tensor_info("y", None)], opset, inits))
    return model.graph.nodes[0], opset


CASES = {
    "torch-upsample": (
        {},
        {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor", "mode": "nearest"},
    ),
    "onnx-defaults-x3": ({"scales": (1, 1, 3, 3)}, {}),
    "pytorch-half-pixel-x2x1": (
        {"scales": (1, 1, 2, 1)},
        {"coordinate_transformation_mode": "pytorch_half_pixel", "nearest_mode": "round_prefer_ceil"},
    ),
    "sizes": ({"sizes": (2, 8, 10, 12)}, {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    "opset10": ({"opset": 10}, {"mode": "nearest"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_taken_attribute_sets_match_the_reference_under_the_interpreter(case):
    torch.manual_seed(0)
    kwargs, attributes = CASES[case]
    node, opset = _resize(**kwargs, **attributes)
    assert tactic_by_key(UPSAMPLE).supports(node, opset, torch.device("cuda")) is None
    kernel = build_layer_kernel(
        tactic_by_key(UPSAMPLE), node, opset, CPU, {"precision": "fp32", "layout": "NHWC", **TINY}, {}
    )
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, opset, CPU, {}, {})
    x = torch.randn(2, 8, 5, 4)
    got, want = kernel([x])[0], reference([x])[0]
    assert torch.equal(got, want)


def test_declines_with_reasons():
    tactic, cuda = tactic_by_key(UPSAMPLE), torch.device("cuda")
    assert "needs CUDA" in tactic.supports(_resize()[0], 17, CPU)
    node, _ = _resize(mode="linear")
    assert "nearest mode only" in tactic.supports(node, 17, cuda)
    node, _ = _resize(scales=(1, 1, 1.5, 2))
    assert "integer upscaling" in tactic.supports(node, 17, cuda)
    node, _ = _resize(scales=(1, 1, 0.5, 0.5))
    assert "integer upscaling" in tactic.supports(node, 17, cuda)
    # asymmetric coordinates rounded to nearest: output 2 of a ×3 upscale reads input 1, not 2 // 3 = 0
    node, opset = _resize(scales=(1, 1, 3, 3), coordinate_transformation_mode="asymmetric")
    assert "do not map" in tactic.supports(node, opset, cuda)
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, opset, CPU, {}, {})
    x = torch.arange(2 * 8 * 5 * 4, dtype=torch.float32).reshape(2, 8, 5, 4)
    assert reference([x])[0][0, 0, 2, 0] == x[0, 0, 1, 0]


@pytest.mark.gpu
def test_the_upsample_is_a_correct_candidate_on_cuda():
    node, opset = _resize(shape=(4, 64, 20, 20))
    x = torch.randn(4, 64, 20, 20, device="cuda")
    choice = autotune(node, opset, [x, None, None], "cuda", effort=0, precisions=("fp32", "fp16"), exhaustive=True)
    ours = [c for c in choice.candidates if c.tactic == UPSAMPLE]
    assert len(ours) == 2 * len(tactic_by_key(UPSAMPLE).space(0))
    assert all(math.isfinite(c.median_ms) for c in ours), [c.note for c in ours]
