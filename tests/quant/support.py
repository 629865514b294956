"""Small float models (every kind of quantizable layer; a separable block) and random calibration batches."""

from __future__ import annotations

import numpy as np
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import from_torch, import_model
from tensorforge.ir import Model
from tensorforge.passes.pipeline import optimize
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


class Separable(torch.nn.Module):
    """A 1×1 convolution whose output channels differ in range by 100×, ReLU, a depthwise 3×3 and a 1×1 one."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = torch.nn.Conv2d(3, 8, 1)
        self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.project = torch.nn.Conv2d(8, 4, 1)
        with torch.no_grad():
            self.expand.weight.mul_(torch.logspace(-1, 1, 8).reshape(8, 1, 1, 1))

    def forward(self, x):
        return self.project(self.depthwise(torch.relu(self.expand(x))))


def separable_model(batches: int = 4) -> tuple[Model, list[dict[str, np.ndarray]]]:
    """`Separable` exported and optimized as a build does (input "input" [2, 3, 8, 8]), with random batches."""
    torch.manual_seed(0)
    model, _ = optimize(from_torch(Separable().eval(), torch.randn(2, 3, 8, 8)))
    rng = np.random.default_rng(0)
    return model, [{"input": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(batches)]
