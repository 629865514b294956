"""`tensorforge.compare`: the error measures, and tolerances that follow the precisions upstream."""

import dataclasses
import math

import numpy as np
import onnx
import pytest

from tensorforge import zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.compare import compare, tensor_error
from tensorforge.runtime.engine import Engine


def test_tensor_error_measures():
    b = np.array([1.0, -2.0, 4.0])
    assert tensor_error(b, b) == (0.0, 0.0, 1.0)
    a = b + np.array([0.0, 0.0, 0.4])
    max_abs, rel, cosine = tensor_error(a, b)
    assert max_abs == pytest.approx(0.4) and rel == pytest.approx(0.1)  # max |a-b| / max |b|
    assert cosine == pytest.approx(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
    assert tensor_error(-b, b)[2] == pytest.approx(-1.0)
    # Equal infinities agree; a NaN never passes a tolerance.
    assert tensor_error(np.array([np.inf, 1.0]), np.array([np.inf, 1.0]))[:2] == (0.0, 0.0)
    assert math.isnan(tensor_error(np.array([np.nan, 1.0]), np.array([0.0, 1.0]))[1])
    # All-zero tensors: the relative error falls back to the absolute one.
    assert tensor_error(np.zeros(3), np.zeros(3)) == (0.0, 0.0, 1.0)
    assert tensor_error(np.full(3, 1e-3), np.zeros(3))[:2] == pytest.approx((1e-3, 1e-3))
    assert tensor_error(np.array([], dtype=np.float32), np.array([], dtype=np.float32)) == (0.0, 0.0, 1.0)


def test_layers_behind_a_half_precision_layer_get_its_tolerance(tmp_path):
    """An fp32 layer reading an fp16 layer's output carries the fp16 error: measured against 1e-4 it would
    be blamed for it. The merged 1x1 convolution is made fp16 (emulated on the CPU, like a GPU engine's)."""
    path = tmp_path / "inception.onnx"
    onnx.save(zoo.export("inception"), path)
    engine = build_engine(path, BuildConfig(effort=0))
    nodes = engine.model.graph.nodes
    plan = engine.plans[0]
    layers = list(plan.layers)
    (merged,) = [
        i
        for i, layer in enumerate(layers)
        if len(nodes[layer.node].origins) == 9 and nodes[layer.node].op_type == "FusedConv"
    ]
    layers[merged] = dataclasses.replace(
        layers[merged], tactic="reference.registry", config={"precision": "fp16", "layout": "any"}
    )
    half = Engine(engine.model, engine.config, [dataclasses.replace(plan, layers=tuple(layers))], engine.environment)
    result = compare(path, half, layerwise=True)
    assert result.ok and result.first_exceeding is None
    downstream = [t for t in result.tensors if t.layer > merged]
    assert downstream and all(t.tolerance == 5e-3 for t in downstream)
    assert max(t.rel for t in downstream) > 1e-4  # the fp16 error is really there, and accepted
    assert all(t.tolerance == 1e-4 for t in result.tensors if t.layer < merged)
    # The pool branch does not read the fp16 layer: it keeps the fp32 tolerance.
    pool = next(t for t in result.tensors if t.original == "/branch_pool/branch_pool.1/Relu_output_0")
    assert pool.tolerance == 1e-4
