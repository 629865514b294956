"""INT8 CPU engines whose quantized layers pass int8 activations to each other (`passes.quant_chain`), against
the unchained int8 engine, the quantized graph on the reference executor and the float model: the int8
tensors between layers through tuning, the memory plan (a byte per element), the engine file and `inspect`."""

import math

import numpy as np
import onnx
import pytest
import torch

from tensorforge import Executor
from tensorforge.build.builder import Builder
from tensorforge.build.config import BuildConfig, Profile, QuantizationConfig
from tensorforge.compare import compare
from tensorforge.frontend import import_model
from tensorforge.ir import DType
from tensorforge.ops.executor import bind_feeds
from tensorforge.quant import simulate_quantized
from tensorforge.quant.sensitivity import agreement
from tensorforge.runtime.engine import Engine
from tensorforge.runtime.inspect import describe_engine, quantization_lines
from tests.helpers import DEVICES, relative_error
from tests.quant.chain_support import SHAPE, batches, calibrated, chain_model, chain_proto, pool_proto

PROFILE = Profile().add("x", SHAPE, SHAPE, SHAPE)
INT8_FAMILIES = ("reference", "vendor")  # no float fallback: every quantized layer runs in int8
# Depthwise inputs per tensor, as chain_support calibrates them: the chains these tests name need it.


def _build(chain: str, families=INT8_FAMILIES) -> Engine:
    config = BuildConfig(
        precisions=("fp32", "int8"), profiles=(PROFILE,), effort=0, tactic_families=families,
        quantization=QuantizationConfig(method="minmax", chain=chain, depthwise_channels=False),
    )  # fmt: skip
    return Builder(config, calibration_data=batches()).build(chain_model())


@pytest.fixture(scope="module")
def engines():
    return _build("always"), _build("off")


def _node(model, name):
    return next(node for node in model.graph.nodes if node.name == name)


def _run(engine, feed) -> np.ndarray:
    return engine.create_context().run(feed)["y"].cpu().numpy()


def test_the_chained_engine_passes_int8_between_its_layers_and_says_so(engines):
    chained, unchained = engines
    section = chained.report["quantized_activations"]
    assert section["enabled"] and len(section["chained"]) == 4  # conv1's output too: conv3's residual
    assert section["quantized_residuals"] == ["conv3"] and section["float"] == {}
    assert unchained.report["quantized_activations"] == {"enabled": False, "chained": [], "float": {}, "mode": "off"}
    int8 = [v for node in chained.model.graph.nodes for v in node.outputs if v.dtype == DType.INT8]
    assert [v.name for v in int8] == section["chained"]
    lines = quantization_lines(chained.report)
    assert any(line.startswith("4 activations pass quantized") for line in lines), lines
    assert "  residuals added from quantized values: conv3" in lines


def test_the_chained_engine_computes_the_quantized_graph_the_unchained_one_and_not_fp32(engines):
    """Each engine its own graph (float32's bound); the chained one differs from the unchained one by its int8
    residual's rounding (`tests/passes/test_quant_chain.py` shows that exactly), well inside int8's error."""
    chained, unchained = engines
    float_model = chain_model()
    for feed in batches(2, seed=7):
        got = _run(chained, feed)
        want = Executor(unchained.model).run(feed)["y"].numpy()  # the unchained quantized graph's reference
        assert relative_error(got, Executor(chained.model).run(feed)["y"].numpy()) <= 1e-5
        assert relative_error(_run(unchained, feed), want) <= 1e-5
        assert 0 < relative_error(got, want) < 0.05
        fp32 = Executor(float_model).run(feed)["y"].numpy()
        error = relative_error(got, fp32)
        assert 1e-4 < error < 0.1, error  # quantized, and close to float


def test_int8_activations_take_a_byte_per_element_in_the_memory_plan(engines):
    chained, unchained = engines
    values = {v.name: v for node in chained.model.graph.nodes for v in node.outputs}
    for name in chained.report["quantized_activations"]["chained"]:
        memory = chained.plans[0].memory
        planned = memory.sizes.get(name, memory.outside.get(name))
        assert planned == math.prod(values[name].shape), (name, planned)
    float_bytes = sum(unchained.plans[0].memory.sizes.values()) + sum(unchained.plans[0].memory.outside.values())
    int8_bytes = sum(chained.plans[0].memory.sizes.values()) + sum(chained.plans[0].memory.outside.values())
    assert int8_bytes < float_bytes


def test_the_chained_engine_file_round_trips_and_inspect_shows_the_int8_activations(engines, tmp_path):
    chained, _ = engines
    path = tmp_path / "chained.engine"
    chained.save(path)
    loaded = Engine.load(path)
    feed = batches(1, seed=9)[0]
    assert np.array_equal(_run(loaded, feed), _run(chained, feed))
    layers = {layer["name"]: layer for layer in describe_engine(loaded)["profiles"][0]["layers"]}
    conv3 = layers["conv3"]["precision"]
    assert conv3.startswith("int8 (x_scale ") and " from i8 -> int8 (y_scale " in conv3
    assert layers["conv3"]["outputs"][0]["stored_dtype"] == str(DType.INT8)
    assert layers["conv4"]["precision"].endswith("from i8 -> fp32")


def _simulated(residuals: bool, keep_float=()):
    """The chain model optimized and calibrated as `_build` does, simulated with Q/DQ."""
    model, table = calibrated(chain_proto())
    return simulate_quantized(model, table, keep_float=keep_float, residuals=residuals)


def test_the_chained_engine_computes_the_simulation_with_quantized_residuals(engines):
    """The simulation the accuracy-target search runs, with residuals, is the chained CPU engine (oneDNN and
    reference int8 kernels) up to float32 rounding; without them it is the unchained engine."""
    chained, unchained = engines
    rounded, plain = _simulated(True), _simulated(False)
    for feed in batches(3, seed=7):
        got = _run(chained, feed)
        assert relative_error(got, Executor(rounded).run(feed)["y"].numpy()) <= 1e-5
        assert relative_error(_run(unchained, feed), Executor(plain).run(feed)["y"].numpy()) <= 1e-5
        assert relative_error(got, Executor(plain).run(feed)["y"].numpy()) > 1e-4  # the residual's rounding


def _target_build(target, chain="always", keep_float=()) -> Engine:
    config = BuildConfig(
        precisions=("fp32", "int8"), profiles=(PROFILE,), effort=0, tactic_families=INT8_FAMILIES,
        quantization=QuantizationConfig(
            method="minmax", chain=chain, target=target, keep_float=keep_float, depthwise_channels=False
        ),
    )  # fmt: skip
    return Builder(config, calibration_data=batches()).build(chain_model())


def test_an_accuracy_target_build_keeps_quantized_residuals_and_meets_the_target():
    """The search rounded the residuals as the chained engine adds them, so the engine keeps them quantized and
    says they were verified; the engine itself meets the target on the calibration data, and computes the
    simulation the search measured."""
    engine = _target_build(("cosine", 0.9))
    section = engine.report["quantized_activations"]
    target = engine.report["quantization"]["target"]
    assert target["met"] and target["residuals"] and target["achieved"] >= 0.9
    assert section["quantized_residuals"] == ["conv3"] and section["float"] == {}
    assert section["residuals"].startswith("verified: the accuracy-target search rounded the residuals")
    assert _node(engine.model, "conv3").attributes["z_scale"] > 0
    lines = quantization_lines(engine.report)
    assert any(
        line.startswith("accuracy target cosine >= 0.9: met") and "quantized residuals" in line for line in lines
    )
    assert any(line.startswith("  residuals: verified") for line in lines)
    float_model, data = chain_model(), batches()
    reference = [Executor(float_model).run(feed)["y"].numpy() for feed in data]
    outputs = [_run(engine, feed) for feed in data]
    assert agreement(reference, outputs).cosine >= 0.9
    simulated = _simulated(True, list(engine.report["quantization"]["float"]))
    for feed, got in zip(data, outputs, strict=True):
        assert relative_error(got, Executor(simulated).run(feed)["y"].numpy()) <= 1e-5


def test_a_float_layer_in_a_target_build_breaks_the_stream_it_stands_in():
    """conv2 kept float reads conv1's output in float: that residual stays float in the engine and in the
    simulation the search measured (the build's final float layers), which the engine computes."""
    engine = _target_build(("cosine", 0.9), keep_float=("conv2",))
    section = engine.report["quantized_activations"]
    assert "conv2" in engine.report["quantization"]["float"]
    assert not section["quantized_residuals"]
    assert section["float"]["conv1"].startswith("FusedConv node 'conv2' (FusedConv) reads")
    simulated = _simulated(True, list(engine.report["quantization"]["float"]))
    for feed in batches(2, seed=7):
        assert relative_error(_run(engine, feed), Executor(simulated).run(feed)["y"].numpy()) <= 1e-5


def test_with_chaining_off_the_search_does_not_round_residuals():
    engine = _target_build(("cosine", 0.9), chain="off")
    assert engine.report["quantization"]["target"]["residuals"] is False
    assert "residuals" not in engine.report["quantized_activations"]


def test_a_layerwise_comparison_reads_int8_activations_as_the_real_values_they_stand_for(engines, tmp_path):
    chained, _ = engines
    path = tmp_path / "chain.onnx"
    onnx.save(chain_proto(), path)
    result = compare(path, chained, layerwise=True)
    by_origin = {t.original: t for t in result.tensors}
    relu2 = by_origin["b"]  # conv2's output, int8 in the engine
    assert 0 < relu2.rel < 0.05 and relu2.tolerance > 0  # the quantization error, not int8 against float


@pytest.mark.parametrize(("quant", "bound"), [("int8", 5e-2), ("fp8", 1.5e-1)])
def test_a_layerwise_comparison_of_a_pooled_chain_passes_and_blames_a_wrong_weight(quant, bound, tmp_path):
    """The stem's quantized output through the max pool: the pool's quantized output is compared as the real
    values it stands for (its input's scale: the pool is exact, so its error is the stem's), every value within its
    quantized type's tolerance; with one output channel of conv1's quantized weight negated, conv1 is named."""
    config = BuildConfig(
        precisions=("fp32", quant), profiles=(PROFILE,), effort=0, tactic_families=INT8_FAMILIES,
        quantization=QuantizationConfig(method="minmax", chain="always", depthwise_channels=False),
    )  # fmt: skip
    engine = Builder(config, calibration_data=batches()).build(import_model(pool_proto()))
    path = tmp_path / "pool.onnx"
    onnx.save(pool_proto(), path)
    result = compare(path, engine, layerwise=True)
    by_origin = {t.original: t for t in result.tensors}
    assert result.ok and result.first_exceeding is None
    assert by_origin["p"].rel == pytest.approx(by_origin["t0"].rel) and by_origin["p"].tolerance == bound
    assert all(0 < t.rel < t.tolerance == bound for t in result.tensors)
    (conv1,) = [n for n in engine.model.graph.nodes if n.name == "conv1"]
    weight = conv1.inputs[1]
    flipped = weight.const.float()
    flipped[0] = -flipped[0]
    weight.const = flipped.to(weight.const.dtype)
    engine.save(tmp_path / "wrong.engine")
    wrong = compare(path, Engine.load(tmp_path / "wrong.engine"), layerwise=True)
    assert not wrong.ok and wrong.first_exceeding.node == "conv1"


def test_with_the_float_fallback_the_chain_still_computes_close_to_the_quantized_graph():
    """Every family: a layer may run as its float original (dequantizing its int8 input, quantizing its
    output); the engine then sits between the quantized graph and float, as an unchained one does."""
    engine = _build("always", families=None)
    feed = batches(1, seed=7)[0]
    got = _run(engine, feed)
    quantized = Executor(engine.model).run(feed)["y"].numpy()
    fp32 = Executor(chain_model()).run(feed)["y"].numpy()
    assert relative_error(got, quantized) < 0.1 and relative_error(got, fp32) < 0.1
    assert torch.isfinite(torch.from_numpy(got)).all()


def test_by_default_the_chain_is_kept_only_when_it_times_faster():
    """Chaining "auto": the chained graph is tuned too and both plans are timed whole; the engine has the faster, and
    the report says what was tried and which was kept."""
    engine = _build("auto", families=None)
    section = engine.report["quantized_activations"]
    assert section["mode"] == "auto" and section["enabled"]
    int8 = [v.name for node in engine.model.graph.nodes for v in node.outputs if v.dtype == DType.INT8]
    assert int8 == section["chained"]
    timed, attempts = section["plan_ms"], section["attempts"]
    assert attempts[0]["scope"] == "everywhere" and attempts[0]["chained"] == 4
    # the chain as the chaining step kept it: the CPU build may then restore a chained stretch to float (its fused
    # plan timed faster), which the report lists
    kept_chain = section["chained"] or section.get("restored_to_float")
    assert timed in [a["plan_ms"] for a in attempts]
    faster = [a for a in attempts if a["plan_ms"]["chained"] < a["plan_ms"]["unchained"] * (1 - a["margin"])]
    assert bool(faster) == bool(kept_chain)
    if faster:  # the fastest of them, one that rounds residuals counted its margin slower
        assert timed == min(faster, key=lambda a: a["plan_ms"]["chained"] / (1 - a["margin"]))["plan_ms"]
    assert kept_chain or section["timed_slower"]
    feed = batches(1, seed=7)[0]
    assert relative_error(_run(engine, feed), Executor(engine.model).run(feed)["y"].numpy()) < 0.1
    lines = quantization_lines(engine.report)
    (verdict,) = [line for line in lines if "chained plan" in line]
    if section.get("restored_to_float") and not section["chained"]:  # kept, then restored: said so, not "not kept"
        assert "then restored to float" in verdict
    else:
        assert ("not kept" in verdict) is not bool(section["chained"])
    assert sum("  tried " in line for line in lines) == len(attempts)


@pytest.mark.parametrize(("rounding_ms", "kept"), [(0.985, False), (0.97, True)])
def test_a_chain_that_rounds_residuals_must_beat_the_exact_one_by_a_margin(monkeypatch, rounding_ms, kept):
    """The chain model's chains everywhere round conv3's residual; the same chains with that residual float are
    exact. Timed 0.985 against the exact chains' 0.995 (in units of the unchained plan) the rounding is noise and a
    loss of accuracy: the exact chains are kept. At 0.97 it pays for itself and is kept. The report records the
    margin each attempt was held to."""
    from tensorforge.build import builder

    def timed(self, model, plans, other, *args):
        rounds = any(node.attributes.get("z_scale") for node in other.graph.nodes)
        return 1.0, rounding_ms if rounds else 0.995

    monkeypatch.setattr(Builder, "_time_side_by_side", timed)
    monkeypatch.setattr(Builder, "_restore_float_if_faster", lambda self, model, *args: (model, *args[-2:], None))
    section = _build("auto", families=None).report["quantized_activations"]
    rounding, exact = section["attempts"][:2]
    assert rounding["scope"] == "everywhere" and rounding["margin"] == builder._ROUNDING_MARGIN > 0
    assert exact["scope"] == "everywhere, residuals float" and exact["margin"] == 0 == exact["quantized_residuals"]
    assert bool(section["quantized_residuals"]) is kept and section["chained"]
    assert section["plan_ms"] == (rounding if kept else exact)["plan_ms"]


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["int8", "fp8"])
def test_a_chained_quantized_engine_on_cuda_matches_its_graph_on_the_reference_executor(monkeypatch, quant):
    """The Triton kernels reading and writing int8 / E4M3 between layers on the GPU (no float fallback, fp32
    float math) against the engine's own chained graph on the reference executor (CPU). int8 sums are exact and
    the epilogue is the reference's float32 arithmetic: float32's bound, as for the unchained engine. E4M3
    tensor cores add in reduced precision (about 1e-3), and an E4M3 output near a rounding boundary of its 3-bit
    mantissa then moves by a whole step (6 to 12 %) for the next layer: bfloat16's bound, not fp16's. The residual
    stream is rounded whatever it costs (in E4M3 it costs more than the build allows): its kernels are under test."""
    from tensorforge.quant import sensitivity

    monkeypatch.setattr(sensitivity, "ROUNDING_LOSS_FACTOR", math.inf)
    config = BuildConfig(
        device="cuda", precisions=("fp32", quant), profiles=(PROFILE,), effort=0,
        quantization=QuantizationConfig(method="minmax", chain="always", depthwise_channels=False),
        tactic_families=("reference", "vendor", "triton"),
    )  # fmt: skip
    engine = Builder(config, calibration_data=batches()).build(chain_model())
    assert len(engine.report["quantized_activations"]["chained"]) == 4
    feed = batches(1, seed=7)[0]
    got = engine.create_context().run(feed)["y"].cpu().numpy()
    want = Executor(engine.model).run(feed)["y"].numpy()
    assert relative_error(got, want) <= (1e-4 if quant == "int8" else 3e-2)


def _observed(engine, feed) -> dict[str, torch.Tensor]:
    """Every value the engine writes running `feed`, by name, as it wrote it (int8 / E4M3 codes included)."""
    seen = {}

    def observe(value, tensor):
        if isinstance(tensor, torch.Tensor):
            seen[value.name] = tensor.detach().clone()

    graph = engine.model.graph
    engine.schedule(0).execute({v.name: t for v, t in bind_feeds(graph, feed, engine.device).items()}, observe=observe)
    return seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("quant", "dtype"), [("int8", DType.INT8), ("fp8", DType.FLOAT8E4M3FN)])
def test_a_max_pool_passes_quantized_values_in_the_engine(device, quant, dtype, tmp_path):
    """The stem's int8 (or E4M3) output through the max pool (on the CPU the vendor's pool in float32 or the
    reference's, on CUDA ours or the vendor's) to both of its readers: the pool's output is exactly the max of its
    window of the stem's codes as the engine wrote them, it takes a byte per element, and the quantized layers run
    quantized (no float fallback). The engine computes its own chained graph: exactly in int8, and in E4M3 on the
    CPU. E4M3 tensor cores add in reduced precision, and a sum that lands next to a rounding boundary of the 3-bit
    mantissa moves a whole step (6 to 12 %): measured on an H100, one stem output of 1024 moved a step and took
    y 6.1e-2 (of its largest value) from the graph's. There each value is held to E4M3's tolerance against the
    float model instead, layer by layer (`compare`)."""
    config = BuildConfig(
        device=device, precisions=("fp32", quant), profiles=(PROFILE,), effort=0,
        tactic_families=(*INT8_FAMILIES, "triton") if device == "cuda" else INT8_FAMILIES,
        quantization=QuantizationConfig(method="minmax", chain="always", depthwise_channels=False),
    )  # fmt: skip
    engine = Builder(config, calibration_data=batches()).build(import_model(pool_proto()))
    pool = next(node for node in engine.model.graph.nodes if node.op_type == "MaxPool")
    assert pool.inputs[0].dtype == pool.outputs[0].dtype == dtype
    assert pool.inputs[0].name in engine.report["quantized_activations"]["chained"]
    memory = engine.plans[0].memory
    pooled = pool.outputs[0]
    assert memory.sizes.get(pooled.name, memory.outside.get(pooled.name)) == math.prod(pooled.shape)
    exact_graph = device == "cpu" or quant == "int8"
    for feed in batches(2, seed=7):
        values = _observed(engine, feed)
        window = torch.nn.functional.max_pool2d(values[pool.inputs[0].name].float(), 3, 2, padding=1)
        assert torch.equal(values[pooled.name].float(), window)
        if exact_graph:
            want = Executor(engine.model).run(feed)["y"].numpy()
            assert relative_error(_run(engine, feed), want) <= (1e-5 if device == "cpu" else 1e-4)
    if not exact_graph:
        onnx.save(pool_proto(), tmp_path / "pool.onnx")
        for seed in (7, 8):
            result = compare(tmp_path / "pool.onnx", engine, layerwise=True, seed=seed)
            assert result.ok and len(result.tensors) >= 4, result.tensors


@pytest.mark.parametrize("factor", [0.0, 1e9])
def test_a_build_rounds_residuals_only_where_measured_to_cost_little_accuracy(monkeypatch, factor):
    """Without an accuracy target the build measures, on the calibration data, what rounding the chain model's one
    residual stream (conv1's output, added by conv3) costs: allowed no loss at all, the chains keep that residual
    float; allowed any, it travels in int8. The report and `inspect` say which and why."""
    from tensorforge.quant import sensitivity

    monkeypatch.setattr(sensitivity, "ROUNDING_LOSS_FACTOR", factor)
    engine = _build("always")
    rounding = engine.report["quantization"]["residual_rounding"]
    assert rounding["residuals"] == 1 and rounding["kept"] is (factor > 0)
    assert float(rounding["cosine_loss_rounded"]) != float(rounding["cosine_loss_exact"])
    section = engine.report["quantized_activations"]
    assert section["quantized_residuals"] == (["conv3"] if factor else [])
    assert bool(_node(engine.model, "conv3").attributes.get("z_scale")) is (factor > 0)
    (line,) = [line for line in quantization_lines(engine.report) if line.startswith("residual streams:")]
    assert line.endswith("may round them" if factor else "adds them in float")


def test_from_a_calibration_cache_alone_the_rounding_is_not_measured_and_residuals_stay_float(tmp_path):
    cache = str(tmp_path / "calib.json")

    def build(data):
        config = BuildConfig(
            precisions=("fp32", "int8"), profiles=(PROFILE,), effort=0, tactic_families=INT8_FAMILIES,
            quantization=QuantizationConfig(method="minmax", chain="always", depthwise_channels=False, cache=cache),
        )  # fmt: skip
        return Builder(config, calibration_data=data).build(chain_model())

    build(batches())  # writes the cache
    engine = build(None)
    rounding = engine.report["quantization"]["residual_rounding"]
    assert rounding["kept"] is False and "--calib" in rounding["why"]
    assert engine.report["quantized_activations"]["quantized_residuals"] == []


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_post_norm_blocks_norm_writes_both_outputs_in_the_engine(device):
    """A post-norm block (ln1's output is fc1's input and fc2's residual): the engine's ln1 writes Q(n1) for fc1 and
    n1 itself, under its name, for fc2 to add (a byte and four bytes per element in the memory plan), and the
    engine computes its own chained graph, in a recorded graph from its second run on."""
    from tensorforge.kernels.cpu import layer_norm as ln
    from tests.quant.chain_support import prenorm_proto

    config = BuildConfig(
        device=device, precisions=("fp32", "int8"), profiles=(PROFILE,), effort=0,
        quantization=QuantizationConfig(method="minmax", chain="always"),
        tactic_families=("reference", "vendor", "cpu", "triton"),
    )  # fmt: skip
    engine = Builder(config, calibration_data=batches()).build(import_model(prenorm_proto(post_norm=True)))
    ln1 = next(node for node in engine.model.graph.nodes if node.name == "ln1")
    quantized, y = ln1.outputs
    assert (quantized.dtype, y.dtype, y.name) == (DType.INT8, DType.FLOAT, "n1")
    assert quantized.name in engine.report["quantized_activations"]["chained"]
    layer = engine.plans[0].layers[engine.model.graph.nodes.index(ln1)]
    kernel = "triton.layernorm" if device == "cuda" else None if ln.problem() else "cpu.layernorm"
    if kernel:  # our kernel ran both outputs correctly (a finite time), whichever won
        assert math.isfinite(next(c.median_ms for c in layer.candidates if c.tactic == kernel))
    memory = engine.plans[0].memory
    for value, size in ((quantized, 1), (y, 4)):
        assert memory.sizes.get(value.name, memory.outside.get(value.name)) == size * math.prod(value.shape)
    context = engine.create_context()
    for feed in batches(3, seed=7):
        want = Executor(engine.model).run(feed)["y"].numpy()
        assert relative_error(context.run(feed)["y"].cpu().numpy(), want) <= 1e-5
    assert not context.eager_shapes  # its kernels record (a CPU graph; a CUDA graph): the second run replays


def test_a_norms_quantized_output_is_compared_as_real_values_and_inspect_says_what_it_writes(tmp_path):
    """`compare --layerwise` on a post-norm block's engine: ln2's int8 output (fc3's input) is compared as
    Q(n2) · y_scale, ln1's float copy as it is; each within the quantization's error of ONNX Runtime's float.
    `inspect` gives each norm's quantized output and, for ln1, the float one beside it."""
    from tests.quant.chain_support import prenorm_proto

    proto = prenorm_proto(post_norm=True)
    config = BuildConfig(
        precisions=("fp32", "int8"), profiles=(PROFILE,), effort=0,
        quantization=QuantizationConfig(method="minmax", chain="always"),
    )  # fmt: skip
    engine = Builder(config, calibration_data=batches()).build(import_model(proto))
    path = tmp_path / "post_norm.onnx"
    onnx.save(proto, path)
    by_origin = {t.original: t for t in compare(path, engine, layerwise=True).tensors}
    ln2 = next(node for node in engine.model.graph.nodes if node.name == "ln2")
    assert ln2.outputs[0].dtype == DType.INT8 and by_origin["n2"].tolerance > 0
    assert 0 < by_origin["n2"].rel < 0.05 and 0 < by_origin["n1"].rel < 0.05
    layers = {layer["name"]: layer for layer in describe_engine(engine)["profiles"][0]["layers"]}
    ln1, ln2 = layers["ln1"]["precision"], layers["ln2"]["precision"]
    assert ln1.startswith("fp32 -> int8 (y_scale") and ln1.endswith(" and fp32")  # n1 written too
    assert ln2.startswith("fp32 -> int8 (y_scale") and " and " not in ln2  # its readers' input alone
