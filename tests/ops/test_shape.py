"""Shape ops against ONNX Runtime: older opsets and edge cases the ONNX node tests leave out."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.helpers import assert_matches_onnxruntime, make_model, tensor_info
from tests.ops.single_node import int64_tensor
from tests.ops.single_node import single_node_model as _single

F32 = TensorProto.FLOAT


def _x(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def test_reshape_opset5_zero_copies_dim(rng):
    model, feeds = _single("Reshape", {"x": _x(rng, 2, 3, 4), "s": np.array([0, -1], np.int64)}, opset=5)
    assert_matches_onnxruntime(model, feeds)


def test_reshape_allowzero_empty(rng):
    x = np.zeros((0, 3), np.float32)
    model, feeds = _single("Reshape", {"x": x, "s": np.array([3, 0], np.int64)}, {"allowzero": 1}, opset=14)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize("axis", [0, 2, 3, -1])
def test_flatten_axes(rng, axis):
    model, feeds = _single("Flatten", {"x": _x(rng, 2, 3, 4)}, {"axis": axis}, opset=13)
    assert_matches_onnxruntime(model, feeds)


def test_squeeze_unsqueeze_attribute_opsets(rng):
    model, feeds = _single("Squeeze", {"x": _x(rng, 1, 3, 1)}, {"axes": [-1]}, opset=11)
    assert_matches_onnxruntime(model, feeds)
    model, feeds = _single("Unsqueeze", {"x": _x(rng, 3, 4)}, {"axes": [0, -1]}, opset=11)
    assert_matches_onnxruntime(model, feeds)


def test_split_attribute_opset11(rng):
    model, feeds = _single("Split", {"x": _x(rng, 6, 2)}, {"split": [1, 5]}, opset=11, n_out=2)
    assert_matches_onnxruntime(model, feeds)
    model, feeds = _single("Split", {"x": _x(rng, 6, 2)}, {"axis": 0}, opset=11, n_out=3)
    assert_matches_onnxruntime(model, feeds)


def test_split_num_outputs_uneven(rng):
    model, feeds = _single("Split", {"x": _x(rng, 2, 7)}, {"axis": -1, "num_outputs": 3}, opset=18, n_out=3)
    assert_matches_onnxruntime(model, feeds)


def test_slice_attributes_opset9(rng):
    attrs = {"starts": [1, -3], "ends": [100, -1], "axes": [0, 1]}
    model, feeds = _single("Slice", {"x": _x(rng, 3, 5)}, attrs, opset=9)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize(
    ("starts", "ends", "steps"),
    [([-1], [-100], [-1]), ([10], [0], [-2]), ([0], [10], [3]), ([2], [1], [1]), ([-100], [100], [-1])],
)
def test_slice_steps_and_clamping(rng, starts, ends, steps):
    inputs = {
        "x": _x(rng, 6, 2),
        "starts": np.array(starts, np.int64),
        "ends": np.array(ends, np.int64),
        "axes": np.array([0], np.int64),
        "steps": np.array(steps, np.int64),
    }
    model, feeds = _single("Slice", inputs, opset=13, initializers=("starts", "ends", "axes", "steps"))
    assert_matches_onnxruntime(model, feeds)


def test_concat_opset4_negative_axis(rng):
    model, feeds = _single("Concat", {"a": _x(rng, 2, 3), "b": _x(rng, 2, 1)}, {"axis": -1}, opset=11)
    assert_matches_onnxruntime(model, feeds)


def test_tile_and_expand(rng):
    model, feeds = _single("Tile", {"x": _x(rng, 2, 3), "r": np.array([2, 1], np.int64)}, opset=6)
    assert_matches_onnxruntime(model, feeds)
    model, feeds = _single("Expand", {"x": _x(rng, 3, 1), "s": np.array([2, 1, 4], np.int64)}, opset=13)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize(("start", "end"), [(-10, 10), (1, -1), (2, 1)])
def test_shape_start_end(rng, start, end):
    attrs = {"start": start, "end": end}
    model, feeds = _single("Shape", {"x": _x(rng, 2, 3, 4)}, attrs, opset=15, out_dtype=TensorProto.INT64)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_round_trip(rng, mode):
    attrs = {"blocksize": 2, "mode": mode}
    model, feeds = _single("DepthToSpace", {"x": _x(rng, 1, 8, 2, 3)}, attrs, opset=13)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_pad_attribute_opset2(rng, mode):
    model, feeds = _single("Pad", {"x": _x(rng, 3, 4)}, {"pads": [1, 2, 2, 3], "mode": mode}, opset=2)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_axes_and_negative_pads(rng, mode):
    consts = {"pads": np.array([-1, 2, 1, -2], np.int64), "axes": np.array([-1, 1], np.int64)}
    inits = [int64_tensor(n, a) for n, a in consts.items()]
    node = helper.make_node("Pad", ["x", "pads", "", "axes"], ["y0"], mode=mode)
    model = make_model([node], [tensor_info("x", [3, 5, 4])], [tensor_info("y0", None)], 19, inits)
    assert_matches_onnxruntime(model, {"x": _x(rng, 3, 5, 4)})


def test_pad_integer_constant(rng):
    x = rng.integers(0, 100, (2, 3)).astype(np.int32)
    inputs = {"x": x, "pads": np.array([1, 0, 0, 2], np.int64), "v": np.array(7, np.int32)}
    model, feeds = _single("Pad", inputs, opset=18, initializers=("pads",), out_dtype=TensorProto.INT32)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize(("start", "limit", "delta"), [(10.0, 4.0, -2.5), (1.0, 1.0, 1.0), (0.5, 7.2, 0.7)])
def test_range_float(start, limit, delta):
    inputs = {n: np.array(v, np.float32) for n, v in zip("sld", (start, limit, delta), strict=True)}
    model, feeds = _single("Range", inputs, opset=11)
    assert_matches_onnxruntime(model, feeds)


def test_eye_like_offsets_and_dtype(rng):
    attrs = {"k": -1, "dtype": TensorProto.INT32}
    model, feeds = _single("EyeLike", {"x": _x(rng, 3, 5)}, attrs, opset=9, out_dtype=TensorProto.INT32)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize(("op", "attrs", "n_in"), [("Transpose", {"perm": [1, 0]}, 1), ("Concat", {"axis": -1}, 2)])
def test_string_tensors(op, attrs, n_in):
    x = np.array([["a", "bc", ""], ["d", "e", "f"]], dtype=object)
    inputs = {f"x{i}": x for i in range(n_in)}
    model, feeds = _single(op, inputs, attrs, opset=13, out_dtype=TensorProto.STRING)
    assert_matches_onnxruntime(model, feeds)
