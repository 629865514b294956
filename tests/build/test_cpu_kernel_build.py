"""CPU engines with our C++ kernels: a whole MobileNetV3 on them against ONNX Runtime, and the builder compiling
them first (in parallel) only when the build may use them."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tensorforge import zoo
from tensorforge.build import builder
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.frontend import import_model
from tensorforge.kernels.cpu import depthwise, depthwise_pointwise, pointwise
from tensorforge.kernels.cpu.extension import compiler_problem
from tests.helpers import make_model, relative_error, run_onnxruntime, tensor_info

REL_TOL = 1e-4  # float32, normwise against ONNX Runtime
_PROBLEM = compiler_problem() or depthwise.problem() or pointwise.problem() or depthwise_pointwise.problem()


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
def test_mobilenetv3_on_our_cpu_kernels_matches_onnxruntime():
    """Only our family, the fallback and the reference allowed: every layer of MobileNetV3 runs on our kernels (the
    stem; the 7 depthwise + 1×1 pairs without squeeze-excite, 6 of them with their expansions; the 8 expansions and
    depthwise convolutions before a squeeze-excite block; the 8 squeeze-excite blocks with their 1×1; the last 1×1;
    the head's pool and product; the last product), and the engine computes what ONNX Runtime does."""
    proto = zoo.export("mobilenetv3", batch=2, size=64, dynamic_batch=False)
    feeds = {key: value.numpy() for key, value in zoo.example_inputs("mobilenetv3", 2, 64, seed=3).items()}
    config = BuildConfig(effort=0, tactic_families=("cpu", "fallback", "reference"))
    engine = build_engine(import_model(proto), config)
    used = collections.Counter(layer.tactic for layer in engine.plans[0].layers)
    assert used == {
        "cpu.stem-conv": 1, "cpu.depthwise-pointwise": 1, "cpu.expand-depthwise": 14,
        "cpu.squeeze-excite-pointwise": 8, "cpu.pointwise": 1, "cpu.pooled-gemm": 1, "cpu.gemm": 1,
    }, used  # fmt: skip
    got = engine.create_context().run(feeds)["output"]
    assert relative_error(got.numpy(), run_onnxruntime(proto, feeds)["output"]) <= REL_TOL


def _one_conv():
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4, 1, 1)).astype(np.float32), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["y"])
    return import_model(make_model([conv], [tensor_info("x", [1, 4, 5, 5])], [tensor_info("y", None)], 17, [w]))


@pytest.mark.parametrize(
    ("config", "compiles"),
    [
        ({}, True),
        ({"tactic_families": ("cpu", "reference")}, True),
        ({"tactic_families": ("vendor", "reference")}, False),
        ({"precompile": False}, False),
    ],
)
def test_cpu_builds_compile_our_kernels_first_when_they_may_use_them(monkeypatch, config, compiles):
    calls = []
    monkeypatch.setattr(builder, "compile_cpu_kernels", lambda: calls.append(1))
    build_engine(_one_conv(), BuildConfig(effort=0, **config))
    assert len(calls) == (1 if compiles else 0)


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
def test_a_depthwise_block_is_fused_only_when_the_build_may_use_our_kernels(tmp_path):
    """The default CPU build runs a depthwise + 1×1 block as one layer, and its engine file loads and runs again;
    a build without our family keeps the two convolutions (the fused node would have no fast tactic there)."""
    from tensorforge.runtime.engine import Engine
    from tests.passes.test_cpu_blocks import _block, _feeds

    proto = _block(residual=True, stride=1)
    feeds = {key: value.numpy() for key, value in _feeds(residual=True, stride=1)[0].items()}
    want = run_onnxruntime(proto, feeds)["y"]
    fused = build_engine(import_model(proto), BuildConfig(effort=0))
    apart = build_engine(import_model(proto), BuildConfig(effort=0, tactic_families=("vendor", "reference")))
    assert [layer.tactic for layer in fused.plans[0].layers] == ["cpu.depthwise-pointwise"]
    assert len(apart.plans[0].layers) == 2
    fused.save(tmp_path / "block.engine")
    for engine in (fused, apart, Engine.load(tmp_path / "block.engine")):
        assert relative_error(engine.create_context().run(feeds)["y"].numpy(), want) <= REL_TOL


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
def test_quantized_cpu_builds_keep_depthwise_blocks_apart():
    """Each of the two convolutions may be quantized (and chained) on its own: the fusion would hide them."""
    assert builder.Builder(BuildConfig(effort=0))._cpu_kernels() is not None
    assert builder.Builder(BuildConfig(effort=0, precisions=("fp32", "int8")))._cpu_kernels() is None


def _int8_block_engine(monkeypatch, fused_faster: bool, timed_float: int = 2):
    """The int8 CPU engine of a depthwise block (`tests.passes.test_cpu_blocks._block`), the first `timed_float` of
    its quantized layers taken as run in float by every plan and the fused plans timed faster (or slower) side by
    side."""
    from tensorforge.build.config import QuantizationConfig
    from tensorforge.passes.quant_chain import is_quantized_layer
    from tests.passes.test_cpu_blocks import SHAPE, _block

    def runs_float(model, plan):
        quantized = sorted(layer.node for layer in plan.layers if is_quantized_layer(model.graph.nodes[layer.node]))
        return set(quantized[:timed_float])

    monkeypatch.setattr(builder, "_runs_float", runs_float)
    monkeypatch.setattr(builder.Builder, "_time_side_by_side", lambda self, *args: (2.0, 1.0) if fused_faster
                        else (1.0, 2.0))  # fmt: skip
    rng = np.random.default_rng(0)
    calibration = [{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(2)]
    quantization = QuantizationConfig(method="minmax", chain="off")
    config = BuildConfig(effort=0, precisions=("fp32", "int8"), quantization=quantization)
    return builder.Builder(config, calibration_data=calibration).build(import_model(_block())), calibration[0]


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
def test_a_quantized_cpu_build_fuses_the_blocks_it_runs_in_float(monkeypatch):
    """Layers every plan runs as their float originals become float nodes again, the CPU block fusions take them,
    and the fused plans are kept when faster; the engine computes what its own graph's reference does."""
    from tensorforge import Executor

    engine, feed = _int8_block_engine(monkeypatch, fused_faster=True)
    section = engine.report["quantization"]["float_blocks"]["timed_float"]
    assert section["restored"] == 2 and section["fused"] == {"depthwise-pointwise": 1} and section["kept"]
    assert [node.op_type for node in engine.model.graph.nodes] == ["DepthwisePointwise"]
    got = engine.create_context().run(feed)["y"].numpy()
    assert relative_error(got, Executor(engine.model).run(feed)["y"]) <= REL_TOL


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
def test_a_quantized_cpu_build_keeps_its_layers_apart_when_fused_is_slower(monkeypatch):
    engine, _ = _int8_block_engine(monkeypatch, fused_faster=False)
    section = engine.report["quantization"]["float_blocks"]["timed_float"]
    assert section["restored"] == 2 and not section["kept"]
    assert [node.op_type for node in engine.model.graph.nodes] == ["QuantizedConv", "QuantizedConv"]


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
def test_a_quantized_cpu_build_restores_every_layer_when_the_fused_float_plan_is_faster(monkeypatch):
    """One layer of the block timed faster quantized: restoring the other alone fuses nothing (timed all the same,
    and kept: faster here), then every quantized layer is restored and fused, and kept because it timed faster
    still; inspect says so."""
    from tensorforge.runtime.inspect import quantization_lines

    engine, _ = _int8_block_engine(monkeypatch, fused_faster=True, timed_float=1)
    section = engine.report["quantization"]["float_blocks"]
    seconds = section["timed_float"].pop("seconds")
    assert section["timed_float"] == {"restored": 1, "fused": {}, "plan_ms": {"apart": 2.0, "fused": 1.0}, "kept": True}
    assert set(seconds) == {"graph", "planning", "timing"} and all(s >= 0 for s in seconds.values())
    assert section["everything"]["restored"] == 2 and section["everything"]["kept"]
    assert [node.op_type for node in engine.model.graph.nodes] == ["DepthwisePointwise"]
    lines = quantization_lines(engine.report)
    assert any(line.startswith("every quantized layer restored to float (2; fused: 1 depthwise-pointwise)")
               and ", kept (" in line and line.endswith(" s timing)") for line in lines)  # fmt: skip


def _two_convolutions():
    """Two 3×3 convolutions with ReLU: nothing for the CPU block fusions once restored to float."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32), f"w{i}")
        for i in range(2)
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["y"]),
    ]
    return make_model(nodes, [tensor_info("x", [1, 16, 12, 12])], [tensor_info("y", None)], 17, inits)


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
@pytest.mark.parametrize("float_faster", [True, False])
def test_every_layer_restored_to_float_is_timed_even_where_nothing_fuses(monkeypatch, float_faster):
    """A float plan has kernels and in-place concatenations that a quantized one lacks, so the all-float attempt is
    timed against the quantized plans although no block fusion takes its layers, and kept only when faster."""
    from tensorforge.build.config import QuantizationConfig

    monkeypatch.setattr(builder, "_runs_float", lambda model, plan: set())
    monkeypatch.setattr(builder.Builder, "_time_side_by_side", lambda self, *args: (2.0, 1.0) if float_faster
                        else (1.0, 2.0))  # fmt: skip
    rng = np.random.default_rng(0)
    calibration = [{"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)} for _ in range(2)]
    quantization = QuantizationConfig(method="minmax", chain="off")
    config = BuildConfig(effort=0, precisions=("fp32", "int8"), quantization=quantization)
    engine = builder.Builder(config, calibration_data=calibration).build(import_model(_two_convolutions()))
    section = engine.report["quantization"]["float_blocks"]["everything"]
    assert section["restored"] == 2 and section["fused"] == {} and section["kept"] is float_faster
    assert section["plan_ms"] == ({"apart": 2.0, "fused": 1.0} if float_faster else {"apart": 1.0, "fused": 2.0})
    kinds = {node.op_type for node in engine.model.graph.nodes}
    assert ("QuantizedConv" in kinds) is not float_faster


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
@pytest.mark.parametrize("faster", [True, False])
def test_the_layers_the_all_float_plan_ran_faster_are_restored_alone(monkeypatch, faster):
    """Both layers run quantized and the all-float plan is slower, but it ran the first layer faster than the
    quantized plan does: that layer alone is restored (keeping the original nodes it stands for), the plan timed,
    and kept only when faster; inspect names the attempt."""
    from tensorforge.build.config import QuantizationConfig
    from tensorforge.passes.quant_chain import is_quantized_layer
    from tensorforge.runtime.inspect import quantization_lines

    def layer_ms(model, plans, positions=None):
        nodes, times = model.graph.nodes, {}
        for layer in plans[0].layers:
            node = nodes[layer.node]
            if positions is None or layer.node in positions:
                float_ms = 0.5 if builder._layer_key(node) == "r0" else 2.0
                times[builder._layer_key(node)] = 1.0 if node.op_type == "QuantizedConv" else float_ms
        return times

    timings = iter([(1.0, 2.0), (1.0, 0.5) if faster else (1.0, 1.5)])  # all-float, then the first layer restored
    monkeypatch.setattr(builder, "_runs_float", lambda model, plan: set())
    monkeypatch.setattr(builder, "_runs_quantized", lambda model, plan: {
        layer.node for layer in plan.layers if is_quantized_layer(model.graph.nodes[layer.node])})  # fmt: skip
    monkeypatch.setattr(builder, "_layer_ms", layer_ms)
    monkeypatch.setattr(builder.Builder, "_time_side_by_side", lambda self, *args: next(timings))
    rng = np.random.default_rng(0)
    calibration = [{"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)} for _ in range(2)]
    config = BuildConfig(effort=0, precisions=("fp32", "int8"), quantization=QuantizationConfig(chain="off"))
    engine = builder.Builder(config, calibration_data=calibration).build(import_model(_two_convolutions()))
    section = engine.report["quantization"]["float_blocks"]
    assert not section["everything"]["kept"]
    tried = section["faster_in_float"]
    assert tried["restored"] == 1 and len(tried["layers"]) == 1 and tried["kept"] is faster
    kinds = [node.op_type for node in engine.model.graph.nodes]
    assert kinds == (["FusedConv", "QuantizedConv"] if faster else ["QuantizedConv", "QuantizedConv"])
    restored = [node for node in engine.model.graph.nodes if node.op_type == "FusedConv"]
    assert [node.origins for node in restored] == ([("Conv(c0)", "Relu(r0)")] if faster else [])  # inspect shows them
    lines = quantization_lines(engine.report)
    assert any(line.startswith("the layers the all-float plan ran faster restored to float (1;") for line in lines)
