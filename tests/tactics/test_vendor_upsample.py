"""torch's nearest upsampling as a Resize tactic: exact against the reference over the attribute sets the
integer-factor rule takes, on the input's memory format, and the Resize nodes it declines."""

import math

import pytest
import torch

from tensorforge.tactics.autotune import autotune, build_layer_kernel
from tensorforge.tactics.base import tactic_by_key
from tests.tactics.test_triton_upsample_tactic import CASES, _resize

TACTIC = "vendor.torch-upsample-nearest"
CPU = torch.device("cpu")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_matches_the_reference_exactly(case, channels_last):
    kwargs, attributes = CASES[case]
    node, opset = _resize(**kwargs, **attributes)
    assert tactic_by_key(TACTIC).supports(node, opset, CPU) is None
    x = torch.randn(2, 8, 5, 4, generator=torch.Generator().manual_seed(0))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    got = build_layer_kernel(tactic_by_key(TACTIC), node, opset, CPU, {"precision": "fp32", "layout": "any"}, {})([x])
    want = build_layer_kernel(tactic_by_key("reference.registry"), node, opset, CPU, {}, {})([x])
    assert torch.equal(got[0], want[0])
    assert got[0].is_contiguous(memory_format=torch.channels_last) == channels_last


def test_the_autotuner_times_it_beside_the_reference():
    node, opset = _resize(scales=(1, 1, 2, 2), shape=(1, 16, 20, 20))
    choice = autotune(node, opset, [torch.randn(1, 16, 20, 20)], "cpu", effort=0)
    ours = [c for c in choice.candidates if c.tactic == TACTIC]
    assert ours and all(math.isfinite(c.median_ms) for c in ours), [(c.config, c.note) for c in ours]


@pytest.mark.parametrize(
    ("kwargs", "attributes", "reason"),
    [
        ({}, {"mode": "linear"}, "nearest mode only"),
        ({"scales": (1, 1, 0.5, 0.5)}, {"mode": "nearest"}, "integer upscaling"),
        ({}, {"coordinate_transformation_mode": "align_corners", "mode": "nearest"}, "do not map an output"),
    ],
)
def test_declines_what_is_not_integer_nearest_upsampling(kwargs, attributes, reason):
    node, opset = _resize(**kwargs, **attributes)
    assert reason in tactic_by_key(TACTIC).supports(node, opset, CPU)
