"""A feature map flattened into tokens, transposed first (passes.tokens): a vision transformer's patch embedding as
a dynamic-batch export writes it, against the unoptimized graph."""

from __future__ import annotations

import numpy as np
from onnx import helper

from tensorforge.passes import qualified_op
from tensorforge.passes.cleanup import Cleanup
from tensorforge.passes.fold import ConstantFolding, DeadCodeElimination
from tensorforge.passes.shapes import InferShapes
from tensorforge.passes.tokens import ChannelsLastTokens
from tests.helpers import make_model, tensor_info
from tests.passes.support import init, optimize_and_compare

C, K, P, HW = 3, 8, 4, 12  # input channels, embedding width, patch size, image size
PASSES = (ConstantFolding(), Cleanup(), InferShapes(), ChannelsLastTokens(), DeadCodeElimination())


def _rand(*shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _patch_embedding(extra_outputs=()):
    """x [batch, C, HW, HW] → Conv (P × P at stride P) → Reshape to [batch, K, -1] (its target from Shape → Slice →
    Concat) → Transpose [0, 2, 1] → Add the position table → y."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["map"], kernel_shape=[P, P], strides=[P, P]),
        helper.make_node("Shape", ["map"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two", "zero"], ["nc"]),
        helper.make_node("Concat", ["nc", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["map", "target"], ["flat"]),
        helper.make_node("Transpose", ["flat"], ["tokens"], perm=[0, 2, 1]),
        helper.make_node("Add", ["tokens", "position"], ["y"]),
    ]
    tokens = (HW // P) ** 2
    initializers = [
        init("w", _rand(K, C, P, P, seed=1)), init("b", _rand(K, seed=2)),
        init("position", _rand(1, tokens, K, seed=3)),
        init("zero", np.array([0], np.int64)), init("two", np.array([2], np.int64)),
        init("minus_one", np.array([-1], np.int64)),
    ]  # fmt: skip
    outputs = [tensor_info(name, None) for name in ("y", *extra_outputs)]
    return make_model(nodes, [tensor_info("x", ["batch", C, HW, HW])], outputs, initializers=initializers)


def _feeds():
    return [{"x": _rand(batch, C, HW, HW, seed=10 + batch)} for batch in (1, 3)]


def test_the_map_is_transposed_before_it_is_flattened_and_the_target_is_a_constant():
    model, report = optimize_and_compare(_patch_embedding(), _feeds(), PASSES)
    ops = [qualified_op(n) for n in model.graph]
    assert ops.count("Shape") == 0 and ops.count("Transpose") == 1, ops
    (transpose,) = [n for n in model.graph if n.op_type == "Transpose"]
    assert transpose.attributes["perm"] == [0, 2, 3, 1]
    ((reshape, _),) = transpose.outputs[0].uses()
    assert reshape.op_type == "Reshape" and reshape.inputs[1].const.tolist() == [0, -1, K]
    assert any(e.rule == "transpose-before-flatten" and e.status == "fired" for e in report.events)


def test_declines_where_the_flattened_map_is_read_elsewhere():
    model, report = optimize_and_compare(_patch_embedding(extra_outputs=("flat",)), _feeds(), PASSES)
    assert [n.attributes["perm"] for n in model.graph if n.op_type == "Transpose"] == [[0, 2, 1]]
    declined = [e for e in report.events if e.rule == "transpose-before-flatten" and e.status == "declined"]
    assert declined and "read elsewhere" in declined[0].detail
