"""A small float model with every kind of quantizable layer, and random calibration batches for it."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.ir import Model
from tests.helpers import make_model, tensor_info


def small_conv_model(opset: int = 17, seed: int = 0) -> Model:
    """x[N,3,8,8] → Conv 3→4 (3×3, pad 1) → Relu → Conv 4→6 (stride 2) → Flatten → Gemm(transB) 96→5 →
    MatMul by a 5×3 weight → y[N,3]."""
    rng = np.random.default_rng(seed)
    weights = {
        "w1": rng.normal(0, 0.4, (4, 3, 3, 3)),
        "b1": rng.normal(0, 0.1, 4),
        "w2": rng.normal(0, 0.3, (6, 4, 3, 3)),
        "w3": rng.normal(0, 0.2, (5, 96)),
        "b3": rng.normal(0, 0.1, 5),
        "w4": rng.normal(0, 0.5, (5, 3)),
    }
    initializers = [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Flatten", ["c2"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["g"], name="fc", transB=1),
        helper.make_node("MatMul", ["g", "w4"], ["y"], name="head"),
    ]
    proto = make_model(nodes, [tensor_info("x", ["N", 3, 8, 8])], [tensor_info("y", ["N", 3])], opset, initializers)
    return import_model(proto)


def random_batches(count: int, batch: int = 2, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (batch, 3, 8, 8)).astype(np.float32)} for _ in range(count)]
