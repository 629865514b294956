"""`passes.quant_chain`: quantized layers hand quantized activations to quantized readers. The chained graph
computes exactly what the unchained one computes, the registry's quantized layers with quantized inputs and
outputs equal a float64 simulation up to float32 rounding, and the pass declines, with its reason, where a
tensor must stay float."""

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from tensorforge import Executor
from tensorforge.frontend import import_model
from tensorforge.ir import DType, Node, Value
from tensorforge.ops import load_all
from tensorforge.ops.chain_rules import FROM_LAYER_NORM, ChainView, QuantizedLayer, plan_chains
from tensorforge.ops.fused import QUANT_TYPES
from tensorforge.ops.infer import infer_model
from tensorforge.ops.registry import REGISTRY
from tensorforge.passes.pipeline import optimize
from tensorforge.passes.quant_chain import chain_quantized
from tensorforge.quant.lower import engine_layers, quantize_layers
from tests.helpers import make_model, run_onnxruntime, tensor_info
from tests.quant.chain_support import (
    batches,
    calibrated,
    copy,
    downsample_proto,
    lowered,
    pool_proto,
    prenorm_proto,
)


def _node(model, name):
    return next(node for node in model.graph.nodes if node.name == name)


def test_chains_form_where_every_reader_is_quantized_and_the_others_stay_float_with_a_reason():
    model, section = chain_quantized(lowered(), residuals=False)
    dtypes = {node.name: node.outputs[0].dtype for node in model.graph.nodes}
    assert {name for name, dtype in dtypes.items() if dtype == DType.INT8} == {"conv2", "conv3", "fc1"}
    assert section["chained"] == [_node(model, name).outputs[0].name for name in ("conv2", "conv3", "fc1")]
    residual = _node(model, "conv1").outputs[0].name
    assert section["float"] == {
        "conv1": f"QuantizedConv node 'conv3' reads {residual!r} as input 3 (a residual stays float)"
    }
    # the producer writes on its reader's scale; the reader's input is the quantized tensor itself
    conv2, conv3 = _node(model, "conv2"), _node(model, "conv3")
    assert conv2.attributes["y_scale"] == conv3.attributes["x_scale"] > 0
    assert conv3.inputs[0] is conv2.outputs[0]


def test_a_residual_stream_travels_quantized_on_the_scale_its_input_readers_give_it():
    """conv1's output is conv2's input and conv3's residual; conv3 reads its own input quantized (from conv2), so
    conv1 writes int8 on conv2's scale and conv3 adds it dequantized (`z_scale`)."""
    model, section = chain_quantized(lowered())
    conv1, conv2, conv3 = (_node(model, name) for name in ("conv1", "conv2", "conv3"))
    assert conv1.outputs[0].dtype == DType.INT8 and conv3.inputs[3] is conv1.outputs[0]
    assert conv1.attributes["y_scale"] == conv2.attributes["x_scale"] == conv3.attributes["z_scale"] > 0
    assert section["quantized_residuals"] == ["conv3"] and section["float"] == {}
    assert len(section["chained"]) == 4


def test_a_residual_only_tensor_chains_on_its_own_calibrated_scale():
    """A stage's first block: the Add folds into one of its two last convolutions, and the other's output is
    only added. It has no input reader to give it a scale, so it takes its calibrated one (`y_range_scale`):
    written int8, added dequantized by that scale, and the graph computes the unchained one with that residual
    quantized and dequantized, as closely as the float32 rounding of the two orders of evaluation allows."""
    model, table = calibrated(downsample_proto())
    planned = plan_chains(model.graph, engine_layers(model, table).get)  # what the accuracy search simulates
    quantize_layers(model, table)
    infer_model(model, check=False)
    unchained = copy(model)
    chained, section = chain_quantized(model)
    (adder,) = [node for node in chained.graph.nodes if node.attributes.get("z_scale")]
    residual = adder.inputs[3]
    producer = residual.producer()
    assert residual.dtype == DType.INT8 and len(list(residual.uses())) == 1
    residual_scale = producer.attributes["y_range_scale"]
    assert producer.attributes["y_scale"] == residual_scale == adder.attributes["z_scale"] > 0
    assert section["float"] == {} and section["quantized_residuals"] == [adder.name]
    assert {node.name: scale for node, scale in planned.residuals.items()} == {producer.name: residual_scale}
    # Rounding the residual moves t2 by at most half a step, and conv3's quantized input by that plus one of its
    # own steps; y by that times the largest row sum of conv3's dequantized weight.
    conv3 = _node(chained, "conv3")
    weight = conv3.inputs[1].const.float() * conv3.inputs[4].const.reshape(-1, 1, 1, 1)
    bound = (adder.attributes["z_scale"] / 2 + conv3.attributes["x_scale"]) * weight.abs().sum((1, 2, 3)).max()
    for feed in batches(2, seed=5):
        want = torch.as_tensor(Executor(unchained).run(feed)["y"])
        got = torch.as_tensor(Executor(chained).run(feed)["y"])
        assert 0 < (got - want).abs().max() <= bound * (1 + 1e-5)


def test_the_chained_graph_computes_exactly_what_the_unchained_one_computes():
    unchained = lowered()
    chained, _ = chain_quantized(copy(unchained), residuals=False)
    for feed in batches(3, seed=11):
        want = Executor(unchained).run(feed)["y"]
        got = Executor(chained).run(feed)["y"]
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))


def test_a_quantized_residual_computes_the_unchained_graph_with_its_residual_quantized_and_dequantized():
    """The one approximation residual chaining adds: the residual rounded onto its readers' grid. The chained
    graph equals, exactly, the unchained one with QuantizeLinear / DequantizeLinear on conv3's residual."""
    unchained = lowered()
    chained, _ = chain_quantized(copy(unchained))
    scale = _node(chained, "conv3").attributes["z_scale"]
    conv3 = _node(unchained, "conv3")
    residual = conv3.inputs[3]
    scale_value = Value("z_scale", DType.FLOAT, (), const=torch.tensor(scale, dtype=torch.float32))
    zero = Value("z_zero", DType.INT8, (), const=torch.tensor(0, dtype=torch.int8))
    quantized = Value("z_q", DType.INT8, residual.shape)
    restored = Value("z_dq", DType.FLOAT, residual.shape)
    unchained.graph.initializers.update({v.name: v for v in (scale_value, zero)})
    unchained.graph.append(Node("QuantizeLinear", [residual, scale_value, zero], [quantized], {}, name="q"))
    unchained.graph.append(Node("DequantizeLinear", [quantized, scale_value, zero], [restored], {}, name="dq"))
    conv3.set_input(3, restored)
    unchained.graph.sort()
    for feed in batches(3, seed=11):
        want = Executor(unchained).run(feed)["y"]
        got = Executor(chained).run(feed)["y"]
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))


def _simulated_conv(x64, xq_given, w, w_scale, bias, x_scale, y_scale, groups, pads):
    """QuantizedConv in float64: Q(X) (or the given quantized X), the convolution of integers, the scales and the
    bias, ReLU, then Q(Y) (or Y); the rounding to int8 in float64 too."""
    xq = xq_given.double() if xq_given is not None else torch.round(x64 / x_scale).clamp(-128, 127)
    acc = torch.nn.functional.conv2d(xq, w.double(), None, 1, pads, 1, groups)
    y = torch.relu(acc * (x_scale * w_scale.double()).reshape(1, -1, 1, 1) + bias.double().reshape(1, -1, 1, 1))
    return y if not y_scale else y / y_scale


@pytest.mark.parametrize("quantized_in", [False, True])
@pytest.mark.parametrize("quantized_out", [False, True])
def test_the_registry_quantized_conv_equals_a_float64_simulation(quantized_in, quantized_out):
    load_all()
    impl = REGISTRY.lookup("QuantizedConv", "tensorforge", 1).impl
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 6, 6, generator=generator)
    xq = torch.randint(-128, 128, x.shape, generator=generator, dtype=torch.int8) if quantized_in else None
    w = torch.randint(-127, 128, (16, 8, 3, 3), generator=generator, dtype=torch.int8)
    w_scale = torch.rand(16, generator=generator) * 1e-3 + 1e-4
    bias = torch.randn(16, generator=generator) * 0.1
    x_scale, y_scale = 0.03, (0.02 if quantized_out else 0.0)
    got = impl(
        None, xq if quantized_in else x, w, bias, None, w_scale, x_scale=x_scale, y_scale=y_scale, pads=[1, 1, 1, 1],
        pre="Relu",
    )  # fmt: skip
    real = _simulated_conv(x.double(), xq, w, w_scale, bias, x_scale, y_scale, 1, 1)
    if not quantized_out:
        assert got.dtype == torch.float32
        assert ((got.double() - real).abs().max() / real.abs().max()).item() <= 1e-6
        return
    assert got.dtype == torch.int8
    want = torch.round(real).clamp(-128, 127)
    differ = got.double() != want
    # float32 and float64 disagree only within float32's rounding of a tie (x.5)
    near_tie = (real - real.floor() - 0.5).abs() <= 1e-5 * real.abs().max()
    assert not (differ & ~near_tie).any()
    assert (got.double() - want).abs().max() <= 1


def test_readers_with_different_scales_or_types_are_declined_with_the_reason():
    model = lowered()
    _node(model, "conv3").attributes["x_scale"] *= 2  # as if a model's own Q/DQ gave conv2's output two scales
    _node(model, "fc2").attributes["quant"] = "fp8e4m3"
    model, section = chain_quantized(model)
    assert "conv1" not in section["float"] and _node(model, "conv3").attributes["z_scale"]  # conv2's scale
    assert section["float"]["fc1"] == "QuantizedGemm node 'fc2' quantizes to fp8e4m3, this layer's type is int8"
    assert "conv2" not in section["float"] and _node(model, "conv2").outputs[0].dtype == DType.INT8  # one reader


def test_a_tensor_with_two_readers_and_two_scales_stays_float():
    model = lowered()
    conv2 = _node(model, "conv2")
    conv1 = _node(model, "conv1")
    # conv3 reads conv1's output as its X (instead of as its residual), quantized with another scale than conv2's
    conv3 = _node(model, "conv3")
    conv3.set_input(3, None)
    conv3.set_input(0, conv1.outputs[0])
    conv3.attributes["x_scale"] = conv2.attributes["x_scale"] * 3
    model, section = chain_quantized(model)
    assert "quantize it with different scales" in section["float"]["conv1"]


def test_graph_outputs_and_float_readers_stay_float():
    model = lowered()
    graph = model.graph
    graph.outputs = [*graph.outputs, _node(model, "conv2").outputs[0]]  # conv2's output also a graph output
    model, section = chain_quantized(model)
    assert "is a graph output: it stays float" in section["float"]["conv2"]
    assert _node(model, "conv4").outputs[0].dtype == DType.FLOAT  # read by GlobalAveragePool: not a candidate
    assert "conv4" not in section["float"]


def test_only_eligible_layers_chain_when_the_build_names_them():
    model = lowered()
    eligible = {node for node in model.graph.nodes if node.name != "conv4"}  # conv4 runs as float, say
    model, section = chain_quantized(model, eligible=eligible)
    assert "QuantizedConv node 'conv4' runs as its float original in the tuned plan" in section["float"]["conv3"]
    assert _node(model, "conv3").outputs[0].dtype == DType.FLOAT
    assert _node(model, "conv2").outputs[0].dtype == DType.INT8


def test_chaining_off_leaves_the_graph_alone():
    model, section = chain_quantized(lowered(), enabled=False)
    assert section == {"enabled": False, "chained": [], "float": {}}
    assert all(node.outputs[0].dtype == DType.FLOAT for node in model.graph.nodes)


# -- explicitly quantized models ---------------------------------------------------------------------------


def _float_chain():
    """x[2,3,8,8] → Conv 3→8 → Conv 8→8 → Conv 8→4 = y: two chained activations once quantized. (ONNX Runtime's
    quantizer puts a Q/DQ pair between a Conv and its Relu: the model then rounds the pre-activation, a tensor no
    quantized layer reads, and such activations stay float.)"""
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.normal(0, 0.4, (8, 3, 3, 3)),
        "w2": rng.normal(0, 0.3, (8, 8, 3, 3)),
        "w3": rng.normal(0, 0.3, (4, 8, 1, 1)),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c2", "w3"], ["y"], name="conv3"),
    ]
    initializers = [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()]
    return make_model(nodes, [tensor_info("x", [2, 3, 8, 8])], [tensor_info("y", [2, 4, 8, 8])], 17, initializers)


class _Batches(CalibrationDataReader):
    def __init__(self):
        self.batches = iter(batches(4, seed=2))

    def get_next(self):
        return next(self.batches, None)


def test_an_explicitly_quantized_model_chains_and_still_matches_onnx_runtime(tmp_path):
    source, target = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(_float_chain(), source)
    quantize_static(
        str(source), str(target), _Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    )  # fmt: skip
    model, _ = optimize(import_model(onnx.load(target)))
    assert [node.op_type for node in model.graph.nodes].count("QuantizedConv") == 3
    model, section = chain_quantized(model)
    assert len(section["chained"]) == 2, section
    assert [node.outputs[0].dtype for node in model.graph.nodes if node.op_type == "QuantizedConv"] == [
        DType.INT8, DType.INT8, DType.FLOAT,
    ]  # fmt: skip
    x = batches(1, seed=5)[0]["x"]
    got = Executor(model).run({"x": x})["y"].numpy()
    np.testing.assert_array_equal(got, run_onnxruntime(str(target), {"x": x}, quantized=True)["y"])


def _pool_model(quant: str = "int8", **options):
    model, table = calibrated(pool_proto(**options))
    quantize_layers(model, table, quant=quant)
    infer_model(model, check=False)
    return model


@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
def test_a_max_pool_passes_quantized_values_from_its_producer_to_its_readers_exactly(quant):
    """conv0 → MaxPool → conv1 and convd: conv0 writes int8 (or E4M3) on its readers' scale, the pool pools the
    quantized values, and the chained graph computes exactly what the unchained one does (the maximum commutes
    with the rounding)."""
    unchained = _pool_model(quant)
    chained, section = chain_quantized(copy(unchained), residuals=False)
    conv0, pool = _node(chained, "conv0"), _node(chained, "pool")
    readers = [reader for reader, _ in pool.outputs[0].uses()]
    assert sorted(reader.name for reader in readers) == ["conv1", "convd"]
    assert conv0.outputs[0].dtype == pool.outputs[0].dtype == QUANT_TYPES[quant]
    assert conv0.attributes["y_scale"] == readers[0].attributes["x_scale"] == readers[1].attributes["x_scale"] > 0
    assert conv0.outputs[0].name in section["chained"] and "conv0" not in section["float"]
    for feed in batches(3, seed=7):
        want = Executor(unchained).run(feed)["y"]
        got = Executor(chained).run(feed)["y"]
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))


def test_a_max_pool_passes_nothing_where_its_output_must_stay_float():
    chained, section = chain_quantized(_pool_model(pooled_output=True), residuals=False)
    assert _node(chained, "pool").outputs[0].dtype == DType.FLOAT
    assert "the max pool's output, is a graph output" in section["float"]["conv0"]
    model = _pool_model()
    eligible = [node for node in model.graph.nodes if node.name != "convd"]
    chained, section = chain_quantized(model, residuals=False, eligible=eligible)
    assert _node(chained, "pool").outputs[0].dtype == DType.FLOAT
    assert "runs as its float original" in section["float"]["conv0"]


@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
def test_a_layer_norm_writes_its_quantized_readers_input_exactly(quant):
    """ln1 → fc1 and ln2 → fc3: each norm writes its reader's quantized input on the reader's scale (the domain's
    norm with `y_scale`), and the chained graph computes exactly what the unchained one does."""
    unchained = lowered(quant, proto=prenorm_proto())
    chained, section = chain_quantized(copy(unchained), residuals=False)
    norms = [node for node in chained.graph.nodes if node.op_type == "LayerNormalization"]
    assert len(norms) == 2
    for norm in norms:
        ((reader, index),) = norm.outputs[0].uses()
        assert index == 0 and reader.op_type == "QuantizedGemm" and norm.domain == "tensorforge"
        assert norm.attributes["y_scale"] == reader.attributes["x_scale"] > 0 and norm.attributes["quant"] == quant
        assert norm.outputs[0].dtype == QUANT_TYPES[quant] and norm.outputs[0].name in section["chained"]
    for feed in batches(3, seed=13):
        want = Executor(unchained).run(feed)["y"]
        got = Executor(chained).run(feed)["y"]
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))


@pytest.mark.parametrize("quant", ["int8", "fp8e4m3"])
@pytest.mark.parametrize("residuals", [False, True])
def test_a_post_norm_blocks_norm_writes_its_readers_input_and_their_residual_exactly(quant, residuals):
    """ln1's output is fc1's input and fc2's residual: ln1 writes Q(n1) on fc1's scale for fc1 and n1 itself (its
    second output, under n1's name) for fc2, which adds it in float; the chained graph computes exactly what the
    unchained one does, and the accuracy search's plan has no residual to round."""
    model, table = calibrated(prenorm_proto(post_norm=True))
    planned = plan_chains(model.graph, engine_layers(model, table, quant=quant).get)
    quantize_layers(model, table, quant=quant)
    infer_model(model, check=False)
    unchained = copy(model)
    chained, section = chain_quantized(copy(model), residuals=residuals)
    ln1, fc1, fc2 = (_node(chained, name) for name in ("ln1", "fc1", "fc2"))
    quantized, y = ln1.outputs
    assert ln1.domain == "tensorforge" and ln1.attributes["quant"] == quant
    assert quantized.dtype == QUANT_TYPES[quant] and fc1.inputs[0] is quantized and quantized.name in section["chained"]
    assert y.dtype == DType.FLOAT and y.name == "n1" and fc2.inputs[3] is y and not fc2.attributes.get("z_scale")
    assert ln1.attributes["y_scale"] == fc1.attributes["x_scale"] > 0
    assert planned.adders == {} and "fc2" not in section["quantized_residuals"]
    for feed in batches(3, seed=17):
        want = Executor(unchained).run(feed)["y"]
        got = Executor(chained).run(feed)["y"]
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))


def test_a_layer_norm_whose_output_is_a_graph_output_writes_it_beside_its_readers_quantized_input():
    unchained = lowered(proto=prenorm_proto(norm_output=True))
    chained, section = chain_quantized(copy(unchained), residuals=False)
    ln1 = _node(chained, "ln1")
    quantized, y = ln1.outputs
    assert quantized.dtype == DType.INT8 and y.dtype == DType.FLOAT and y.name == "n1" and y in chained.graph.outputs
    assert _node(chained, "fc1").inputs[0] is quantized and "ln1" not in section["float"]
    for feed in batches(2, seed=19):
        want, got = Executor(unchained).run(feed), Executor(chained).run(feed)
        for name in ("y", "n1"):
            assert torch.equal(torch.as_tensor(got[name]), torch.as_tensor(want[name]))


def test_a_layer_norm_stays_float_where_its_readers_do():
    model = lowered(proto=prenorm_proto())
    eligible = [node for node in model.graph.nodes if node.op_type == "QuantizedGemm" and node.outputs[0].name != "y"]
    chained, section = chain_quantized(model, residuals=False, eligible=eligible)
    ln2 = next(node for node in chained.graph.nodes if node.outputs[0].name == "n2")
    assert ln2.outputs[0].dtype == DType.FLOAT and "runs as its float original" in section["float"][ln2.name]


def test_a_layer_norm_writes_its_quantized_input_for_the_readers_that_agree_and_y_for_the_others():
    """Of a norm's readers, those quantizing Y per tensor as X with the first one's type and scale take Q(Y); one
    with another scale, one quantizing per channel and a float one read Y; only eligible readers count."""
    y = Value("y", DType.FLOAT, (4, 8))
    norm = Node("LayerNormalization", [Value("x", DType.FLOAT, (4, 8)), Value("g", DType.FLOAT, (8,))], [y])
    readers = {name: Node("Op", [y], [Value(f"{name}_out")], name=name) for name in ("a", "b", "c", "d", "f")}
    layers = {
        readers["a"]: QuantizedLayer("QuantizedGemm", "int8", 0.1),
        readers["b"]: QuantizedLayer("QuantizedGemm", "int8", 0.2),
        readers["c"]: QuantizedLayer("QuantizedConv", "int8", 0.1, per_channel=True),
        readers["d"]: QuantizedLayer("QuantizedGemm", "int8", 0.1),
    }
    view = ChainView(layers.get)
    uses = FROM_LAYER_NORM.candidate(norm, view)
    assert FROM_LAYER_NORM.problem(norm, uses, view) is None
    assert [reader.name for reader, _ in FROM_LAYER_NORM.quantized_readers(uses, view)] == ["a", "d"]
    assert FROM_LAYER_NORM.scale(norm, uses, view) == 0.1
    eligible = [readers["b"], readers["d"]]
    assert [reader.name for reader, _ in FROM_LAYER_NORM.quantized_readers(uses, view, eligible)] == ["b"]
    assert "runs as its float original" in FROM_LAYER_NORM.problem(norm, uses, view, [readers["f"]])
