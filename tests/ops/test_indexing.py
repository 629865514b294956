"""Indexing ops against ONNX Runtime: negative indices, duplicate-index reductions, batch dims, dtypes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from tests.helpers import assert_matches_onnxruntime
from tests.ops.single_node import single_node_model

I64 = TensorProto.INT64


def test_gather_negative_indices_uint16(rng):
    x = rng.integers(0, 60000, (4, 3)).astype(np.uint16)
    inputs = {"x": x, "i": np.array([[-1, 0], [2, -4]], np.int64)}
    model, feeds = single_node_model("Gather", inputs, {"axis": 0}, opset=13, out_dtype=TensorProto.UINT16)
    assert_matches_onnxruntime(model, feeds)


def test_gather_elements_negative(rng):
    inputs = {"x": rng.standard_normal((3, 4)).astype(np.float32), "i": np.array([[-1, 0, 3]], np.int32)}
    model, feeds = single_node_model("GatherElements", inputs, {"axis": 1}, opset=13)
    assert_matches_onnxruntime(model, feeds)


def test_gather_nd_batch_dims_negative(rng):
    inputs = {"x": rng.standard_normal((2, 3, 4)).astype(np.float32), "i": np.array([[[-1], [0]], [[1], [-3]]])}
    model, feeds = single_node_model("GatherND", inputs, {"batch_dims": 1}, opset=13)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_elements_duplicate_reductions(rng, reduction):
    inputs = {
        "x": rng.standard_normal((3, 3)).astype(np.float32),
        "i": np.array([[0, 0, 2], [0, -3, 2]], np.int64),
        "u": rng.standard_normal((2, 3)).astype(np.float32),
    }
    model, feeds = single_node_model("ScatterElements", inputs, {"reduction": reduction}, opset=18)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_slices(rng, reduction):
    indices = np.array([[1], [-1]] if reduction == "none" else [[1], [1], [-1]], np.int64)
    inputs = {
        "x": rng.integers(-9, 9, (3, 2, 2)).astype(np.int32),
        "i": indices,
        "u": rng.integers(-9, 9, (len(indices), 2, 2)).astype(np.int32),
    }
    attrs = {"reduction": reduction}
    model, feeds = single_node_model("ScatterND", inputs, attrs, opset=18, out_dtype=TensorProto.INT32)
    assert_matches_onnxruntime(model, feeds)


def test_compress_short_condition(rng):
    inputs = {"x": rng.standard_normal((4, 3)).astype(np.float32), "c": np.array([True, False])}
    model, feeds = single_node_model("Compress", inputs, {"axis": -2}, opset=11)
    assert_matches_onnxruntime(model, feeds)


def test_nonzero_bool():
    inputs = {"x": np.array([[True, False], [False, True]])}
    model, feeds = single_node_model("NonZero", inputs, opset=13, out_dtype=I64)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_one_hot_negative_and_out_of_range(axis):
    inputs = {
        "i": np.array([[0, -1], [5, -4]], np.int64),
        "d": np.array(3, np.int64),
        "v": np.array([2, 9], np.float32),
    }
    model, feeds = single_node_model("OneHot", inputs, {"axis": axis}, opset=11)
    assert_matches_onnxruntime(model, feeds)


def test_reverse_sequence_batch_first(rng):
    inputs = {"x": rng.standard_normal((3, 4, 2)).astype(np.float32), "l": np.array([4, 1, 2], np.int64)}
    attrs = {"batch_axis": 0, "time_axis": 1}
    model, feeds = single_node_model("ReverseSequence", inputs, attrs, opset=10)
    assert_matches_onnxruntime(model, feeds)


@pytest.mark.parametrize(("axis", "is_sorted"), [(None, 0), (None, 1), (1, 0), (-2, 1)])
def test_unique_all_outputs(axis, is_sorted):
    x = np.array([[3, 1, 3], [2, 2, 2], [3, 1, 3], [0, 5, 0]], np.float32)
    attrs = {"sorted": is_sorted} | ({} if axis is None else {"axis": axis})
    model, feeds = single_node_model("Unique", {"x": x}, attrs, opset=11, n_out=4)
    for value in model.graph.output[1:]:
        value.type.tensor_type.elem_type = I64
    assert_matches_onnxruntime(model, feeds)


def test_gather_strings():
    inputs = {"x": np.array(["a", "bc", "", "d"], dtype=object), "i": np.array([[3, -4]], np.int64)}
    model, feeds = single_node_model("Gather", inputs, opset=13, out_dtype=TensorProto.STRING)
    assert_matches_onnxruntime(model, feeds)


def test_gather_scalar_index_of_vector():
    inputs = {"x": np.array([4, 7, 9], np.int64), "i": np.array(-1, np.int64)}
    model, feeds = single_node_model("Gather", inputs, opset=13, out_dtype=I64)
    assert_matches_onnxruntime(model, feeds)


def test_gather_nd_to_scalar():
    inputs = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.array([1, -1], np.int64)}
    model, feeds = single_node_model("GatherND", inputs, opset=13)
    assert_matches_onnxruntime(model, feeds)
