"""Per-channel weight scales and the output-channel axis of every layer kind."""

import pytest
import torch

from tensorforge.ir import Node, Value
from tensorforge.quant.scale import MIN_SCALE
from tensorforge.quant.weights import output_channel_axis, weight_scales


def node(op_type: str, **attributes) -> Node:
    return Node(op_type, [Value("a"), Value("b")], [Value("y")], attributes)


@pytest.mark.parametrize(
    ("op_type", "attributes", "index", "rank", "axis"),
    [
        ("Conv", {}, 1, 4, 0),
        ("FusedConv", {}, 1, 4, 0),
        ("ConvTranspose", {"group": 2}, 1, 4, 1),
        ("Gemm", {}, 1, 2, 1),
        ("Gemm", {"transB": 1}, 1, 2, 0),
        ("Gemm", {"transA": 1}, 0, 2, 1),
        ("Gemm", {}, 0, 2, 0),
        ("FusedGemm", {"transB": 1}, 1, 3, 1),
        ("MatMul", {}, 1, 2, 1),
        ("MatMul", {}, 1, 3, 2),
        ("MatMul", {}, 0, 2, 0),
        ("MatMul", {}, 1, 1, None),
        ("Conv", {}, 0, 4, None),
    ],
)
def test_output_channel_axis(op_type, attributes, index, rank, axis):
    assert output_channel_axis(node(op_type, **attributes), index, rank) == axis


def test_scales_are_max_magnitude_over_127_per_channel():
    w = torch.randn(6, 4, 3, 3, generator=torch.Generator().manual_seed(0))
    w[2, 1, 0, 0] = -9.0
    scales = weight_scales(w, 0)
    assert scales.dtype == torch.float32 and scales.shape == (6,)
    torch.testing.assert_close(scales, (w.abs().amax(dim=(1, 2, 3)) / 127).float())
    assert scales[2] == pytest.approx(9.0 / 127)


def test_scales_along_an_inner_axis_and_per_tensor():
    w = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(weight_scales(w, 1), w.abs().amax(dim=0) / 127)
    torch.testing.assert_close(weight_scales(w, None), (w.abs().max() / 127).reshape(1))


def test_an_all_zero_channel_gets_a_tiny_scale():
    w = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    w[1] = 0.0
    scales = weight_scales(w, 0)
    assert scales[1] == pytest.approx(MIN_SCALE) and scales[1] > 0
    quantized = torch.round(w / scales[:, None])
    assert torch.isfinite(quantized).all() and (quantized[1] == 0).all()


def test_unsupported_op_is_named():
    with pytest.raises(ValueError, match="Add has no quantizable weight"):
        output_channel_axis(Node("Add", [Value("a"), Value("b")], [Value("y")], {}), 1, 2)
