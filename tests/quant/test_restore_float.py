"""`quant.lower.restore_float`: quantized layers that read and write float made float nodes again, with their
dequantized weights (what the float fallback runs); layers in a chain stay quantized."""

import numpy as np

from tensorforge import Executor
from tensorforge.ir import DType
from tensorforge.ir.clone import clone_model
from tensorforge.ops.fused import dequantized_weight
from tensorforge.ops.infer import infer_model
from tensorforge.passes.pipeline import optimize
from tensorforge.passes.quant_chain import chain_quantized
from tensorforge.quant import calibrate
from tensorforge.quant.lower import quantize_layers, restore_float
from tests.helpers import relative_error
from tests.quant.support import random_batches, small_conv_model


def _lowered():
    model = small_conv_model()
    model.graph.inputs[0].shape = (2, 3, 8, 8)
    model, _ = optimize(model)
    infer_model(model, check=False)
    float_model = clone_model(model)
    quantize_layers(model, calibrate(model, random_batches(3), "minmax"))
    return float_model, model


def test_every_float_to_float_layer_becomes_its_float_node_with_the_dequantized_weight():
    float_model, model = _lowered()
    quantized = {node.name: node for node in model.graph.nodes if node.op_type.startswith("Quantized")}
    weights = {
        name: dequantized_weight(node.op_type, node.inputs[1].const, node.inputs[4].const)
        for name, node in quantized.items()
    }
    restored = restore_float(model, list(quantized.values()))
    assert sorted(restored) == sorted(quantized) and len(restored) == 4
    ops = [node.op_type for node in model.graph.nodes]
    assert "QuantizedConv" not in ops and "QuantizedGemm" not in ops
    for node in model.graph.nodes:
        if node.name in weights:
            assert np.array_equal(node.inputs[1].const.numpy(), weights[node.name].numpy())
            assert not {"x_scale", "quant", "y_scale"} & set(node.attributes)
    feed = random_batches(1, seed=7)[0]
    got, want = Executor(model).run(feed)["y"], Executor(float_model).run(feed)["y"]
    assert 0 < relative_error(got, want) <= 2e-2  # int8 weights, float activations


def test_chained_layers_stay_quantized():
    _, model = _lowered()
    model, section = chain_quantized(model)
    assert section["chained"]
    layers = [node for node in model.graph.nodes if node.op_type.startswith("Quantized")]
    in_chain = {
        node.name
        for node in layers
        if node.inputs[0].dtype == DType.INT8 or node.attributes.get("y_scale") or node.attributes.get("z_scale")
    }
    assert in_chain
    restored = restore_float(model, layers)
    assert not in_chain & set(restored)
    assert {node.name for node in model.graph.nodes if node.op_type.startswith("Quantized")} == in_chain
