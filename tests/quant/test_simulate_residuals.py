"""`simulate_quantized(residuals=True)`: the simulation rounds exactly the residuals a chained engine adds from
their quantized value (`passes.quant_chain`'s residual streams), for every choice of float layers, and computes
what the chained quantized graph computes; with residuals it is what the accuracy-target search measures."""

from itertools import combinations

import pytest
import torch

from tensorforge import Executor
from tensorforge.errors import InputError
from tensorforge.ir.clone import clone_model
from tensorforge.ops.infer import infer_model
from tensorforge.passes.quant_chain import chain_quantized
from tensorforge.quant import Target, mixed_precision, quantizable_layers, simulate_quantized
from tensorforge.quant.lower import quantize_layers
from tensorforge.quant.sensitivity import Agreement, ResidualRounding, agreement, residual_rounding
from tests.helpers import relative_error
from tests.quant.chain_support import batches, calibrated, chain_proto, lowered, prenorm_proto, skip_proto

QUANTS = ["int8", "fp8e4m3"]
MODELS = {
    "chain": chain_proto,  # conv3 adds conv1's output
    "skips": skip_proto,  # conv2 and conv3 add, t0's stream needs t1's (the fixed point)
    "skips-t2-output": lambda: skip_proto(b_output=True),  # conv3 reads its input in float: no stream
}


def _node(model, name):
    return next(node for node in model.graph.nodes if node.name == name)


def _rounded_residuals(simulated) -> list[str]:
    """The layers of a simulated graph whose residual (input 3) reads a dequantized tensor."""
    names = []
    for node in simulated.graph.nodes:
        residual = node.inputs[3] if len(node.inputs) > 3 else None
        if residual is not None and residual.producer() is not None:
            if residual.producer().op_type == "DequantizeLinear":
                names.append(node.name)
    return names


def _chained(model, table, keep_float, quant):
    """`model` lowered with `keep_float` in float and chained everywhere the graph allows, as a build does."""
    lowered = clone_model(model)
    quantize_layers(lowered, table, keep_float=keep_float, quant=quant)
    infer_model(lowered, check=False)
    return chain_quantized(lowered)


def test_a_quantized_residual_reads_the_pair_its_input_readers_read():
    """conv3 adds conv1's output, which conv2 reads as X: with residuals, conv3's Z is conv2's DQ(Q(a)); without,
    the float tensor itself (the plain simulation)."""
    model, table = calibrated()
    plain = simulate_quantized(model, table)
    rounded = simulate_quantized(model, table, residuals=True)
    conv1 = _node(model, "conv1").outputs[0].name
    assert _node(plain, "conv3").inputs[3].name == conv1
    residual = _node(rounded, "conv3").inputs[3]
    assert residual is _node(rounded, "conv2").inputs[0] and residual.producer().op_type == "DequantizeLinear"
    assert residual.producer().inputs[0].producer().inputs[0].name == conv1
    ops = [node.op_type for node in rounded.graph.nodes]
    assert ops == [node.op_type for node in plain.graph.nodes]  # the same pairs, one more reader of one of them
    assert _rounded_residuals(rounded) == ["conv3"] and _rounded_residuals(plain) == []
    for feed in batches(2, seed=11):
        a, b = Executor(rounded).run(feed)["y"], Executor(plain).run(feed)["y"]
        assert relative_error(a.numpy(), b.numpy()) > 1e-4  # the rounding is there


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_for_every_set_of_float_layers_the_simulation_rounds_what_the_chained_graph_rounds(name, quant):
    """Every subset of layers kept float: the residuals the simulation rounds are those the chaining pass
    quantizes in the graph lowered with the same float layers (a float layer breaks the streams it stands in), and
    the simulation computes that chained graph's output up to float32 summation order."""
    model, table = calibrated(MODELS[name]())
    names = [layer.name for layer in quantizable_layers(model)]
    feed = batches(1, seed=11)[0]
    streams = set()
    for count in range(len(names) + 1):
        for keep in combinations(names, count):
            simulated = simulate_quantized(model, table, quant=quant, keep_float=keep, residuals=True)
            chained, section = _chained(model, table, keep, quant)
            quantized = section["quantized_residuals"] if section else []  # None: no quantized layer
            assert _rounded_residuals(simulated) == quantized, keep
            streams.add(tuple(quantized))
            want = Executor(chained).run(feed)["y"].numpy()
            assert relative_error(Executor(simulated).run(feed)["y"].numpy(), want) <= 1e-5, keep
    both = {(), ("conv2",), ("conv3",), ("conv2", "conv3")}
    expected = {"chain": {(), ("conv3",)}, "skips": both, "skips-t2-output": both}
    assert streams == expected[name]


def test_a_float_adder_breaks_its_own_stream_only():
    """conv2 adds t0 and reads t1, which conv3 adds. With conv3 float, t1 stays float (a float layer reads it),
    and conv2 still adds t0 quantized while it quantizes its float input on load: in the simulation as in the
    chained graph."""
    model, table = calibrated(skip_proto())
    simulated = simulate_quantized(model, table, residuals=True)
    assert _rounded_residuals(simulated) == ["conv2", "conv3"]
    assert _node(simulated, "conv2").inputs[3] is _node(simulated, "conv1").inputs[0]  # DQ(Q(t0))
    assert _node(simulated, "conv3").inputs[3] is _node(simulated, "conv2").inputs[0]  # DQ(Q(t1))
    assert _rounded_residuals(simulate_quantized(model, table, keep_float=["conv3"], residuals=True)) == ["conv2"]
    _, section = _chained(model, table, ["conv3"], "int8")
    assert section["quantized_residuals"] == ["conv2"]
    assert "FusedConv node 'conv3' (FusedConv) reads" in section["float"]["conv1"]


def test_a_graph_output_stays_float_and_its_reader_still_adds_quantized():
    """t2 is a graph output, so it stays float; conv3 reads it in float (quantized on load) and still adds t1 in
    int8, as conv2 adds t0."""
    model, table = calibrated(skip_proto(b_output=True))
    simulated = simulate_quantized(model, table, residuals=True)
    assert _rounded_residuals(simulated) == ["conv2", "conv3"]
    _, section = _chained(model, table, (), "int8")
    assert section["quantized_residuals"] == ["conv2", "conv3"]
    assert "graph output" in section["float"]["conv2"]


def test_residuals_change_nothing_where_no_layer_adds_a_quantized_residual():
    """The adder in float (its residual is a float layer's input), and a model without residuals: the
    simulation with residuals is the plain one, bit for bit."""
    feed = batches(1, seed=3)[0]
    model, table = calibrated()
    cases = [(model, table, ["conv3"])]
    no_residuals, no_table = calibrated(skip_proto())
    for node in no_residuals.graph.nodes:
        if len(node.inputs) > 3:
            node.set_input(3, None)  # conv2 and conv3 without their residual (its table is the model's own)
    cases.append((no_residuals, no_table, []))
    for graph, scales, keep in cases:
        rounded = simulate_quantized(graph, scales, keep_float=keep, residuals=True, verify=False)
        plain = simulate_quantized(graph, scales, keep_float=keep, verify=False)
        assert _rounded_residuals(rounded) == []
        assert torch.equal(Executor(rounded).run(feed)["y"], Executor(plain).run(feed)["y"])


def test_on_layers_already_quantized_the_residual_pair_has_their_scale_and_gives_the_chained_graph_exactly():
    """A graph whose layers are QuantizedConv / QuantizedGemm already (as a model's own Q/DQ gives them): no
    calibrated X reader makes a pair, so the residual gets its own, on the scale its X reader quantizes with.
    That is the graph `tests/passes/test_quant_chain.py` writes by hand, and it computes the chained graph bit for
    bit."""
    quantized = lowered()
    _, table = calibrated()  # no tensor of it is looked up: nothing is left to calibrate
    simulated = simulate_quantized(quantized, table, residuals=True, verify=False)
    chained, _ = chain_quantized(clone_model(quantized))
    residual = _node(simulated, "conv3").inputs[3]
    assert residual.producer().op_type == "DequantizeLinear"
    scale = residual.producer().inputs[1].const
    assert scale.dtype == torch.float32 and scale.item() == pytest.approx(_node(chained, "conv3").attributes["z_scale"])
    assert [node.op_type for node in simulated.graph.nodes].count("QuantizeLinear") == 1
    for feed in batches(3, seed=11):
        assert torch.equal(Executor(simulated).run(feed)["y"], Executor(chained).run(feed)["y"])


def test_unknown_float_layers_are_refused_with_residuals_too():
    model, table = calibrated()
    with pytest.raises(InputError, match="keep_float names unknown layers"):
        simulate_quantized(model, table, keep_float=["nope"], residuals=True)


def test_the_search_with_residuals_measures_their_rounding():
    """A target between the all-quantized agreements with and without residual rounding: one search meets it
    with every layer quantized, the other must return layers to float (which of them depends on the data: a
    rounding can land closer to float as well). Each measures the graph it says it measures."""
    model, table = calibrated(chain_proto())
    data = batches(4, seed=3)
    reference = [Executor(model).run(feed)["y"].numpy() for feed in data]

    def cosine(simulated):
        return agreement(reference, [Executor(simulated).run(feed)["y"].numpy() for feed in data]).cosine

    plain = cosine(simulate_quantized(model, table))
    rounded = cosine(simulate_quantized(model, table, residuals=True))
    assert rounded != plain
    target = Target("cosine", (plain + rounded) / 2)
    searches = {flag: mixed_precision(model, table, data, target, residuals=flag) for flag in (False, True)}
    for flag, result in searches.items():
        assert result.residuals == flag and result.met
        assert result.all_quantized.cosine == pytest.approx(rounded if flag else plain, abs=1e-12)
        measured = cosine(simulate_quantized(model, table, keep_float=result.keep_float, residuals=flag))
        assert measured == pytest.approx(result.achieved.cosine, abs=1e-12)
    returned = {flag: bool(result.keep_float) for flag, result in searches.items()}
    assert returned == {True: rounded < plain, False: plain < rounded}


@pytest.mark.parametrize("quant", QUANTS)
def test_the_cost_of_rounding_residuals_is_measured_against_the_exact_streams(quant):
    """`residual_rounding`: the all-quantized model's agreement with float with its residuals exact and rounded, as
    `agreement` over the simulations gives them; a residual MLP's stream (fc0's output, fc1's input and fc2's
    residual) is rounded."""
    model, table = calibrated(prenorm_proto(first_norm=False))
    rounding = residual_rounding(model, table, batches(), quant=quant)
    float_outputs = [Executor(model).run(feed)["y"].numpy() for feed in batches()]
    for residuals, measured in ((False, rounding.exact), (True, rounding.rounded)):
        simulated = simulate_quantized(model, table, quant=quant, residuals=residuals)
        outputs = [Executor(simulated).run(feed)["y"].numpy() for feed in batches()]
        assert measured == agreement(float_outputs, outputs)
    assert rounding.residuals == 1 and rounding.rounded != rounding.exact  # the rounding changes the output
    assert rounding.report()["kept"] is rounding.kept


def test_the_rounding_is_kept_while_it_adds_at_most_half_again_to_the_quantization_loss():
    exact = Agreement(cosine=0.999, top1=1.0)
    assert ResidualRounding(1, exact, Agreement(0.9985, 1.0)).kept  # loss 1.5e-3 against 1e-3
    assert not ResidualRounding(1, exact, Agreement(0.998, 1.0)).kept  # 2e-3: doubled
    assert ResidualRounding(1, Agreement(1.0, 1.0), Agreement(1.0, 1.0)).kept  # lossless both ways


@pytest.mark.parametrize("post_norm", [False, True])
def test_a_model_without_residual_streams_has_no_rounding_to_measure(post_norm):
    """Pre-norm: the residual adds the float stream e, read by no quantized layer; post-norm: the norm writes its
    output beside its quantized readers' input, and the residual adds that, exactly."""
    model, table = calibrated(prenorm_proto(post_norm=post_norm))
    assert residual_rounding(model, table, batches()) is None
