"""bf16 on the CPU: tried where the CPU has bf16 dot products (oneDNN's bf16 convolutions and products), dropped with
a note where it has none."""

from __future__ import annotations

import math

import pytest
import torch

from tensorforge import zoo
from tensorforge.build import builder
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.frontend import import_model
from tensorforge.ops.executor import Executor
from tensorforge.ops.math_flags import cpu_native_precisions
from tensorforge.runtime.plan import Layer
from tensorforge.runtime.schedule import Schedule
from tests.helpers import relative_error

native = pytest.mark.skipif("bf16" not in cpu_native_precisions(), reason="this CPU has no bf16 dot products")
BF16_TOLERANCE = 2e-2  # max-norm relative error of a small network in bf16 (8-bit significands), float32 sums


@native
@pytest.mark.parametrize(
    ("name", "tactic"), [("inception", "vendor.onednn-fused"), ("transformer", "vendor.onednn-linear")]
)
def test_onednn_layers_run_in_bf16_within_tolerance_and_write_float32_outputs(name, tactic):
    """Every layer the oneDNN tactic takes forced to bf16 (the rest to the reference in bf16): the graph's output
    stays float32 and within bf16's tolerance of the float32 reference."""
    model = import_model(zoo.export(name, dynamic_batch=False))
    engine = build_engine(model, BuildConfig(effort=0))
    forced = []
    for layer in engine.plans[0].layers:
        takes = any(c.tactic == tactic and math.isfinite(c.median_ms) for c in layer.candidates)
        chosen = tactic if takes else "reference.registry"
        forced.append(Layer(layer.node, chosen, {"precision": "bf16", "layout": layer.config.get("layout", "any")}, 0))
    assert any(layer.tactic == tactic for layer in forced), f"{tactic} took none of {name}'s layers"
    schedule = Schedule(engine.model, forced, torch.device("cpu"), {})
    x = torch.randn(zoo.input_shape(name))
    (got,) = schedule.execute({"input": x})
    want = Executor(model).run({"input": x})["output"]
    assert got.dtype == torch.float32
    error = relative_error(got.numpy(), want.numpy())
    assert 0 < error <= BF16_TOLERANCE  # (0: the layers did not run in bf16)


@native
@pytest.mark.parametrize(
    ("name", "tactics"),
    [
        ("inception", {"vendor.onednn-fused", "cpu.pointwise", "cpu.winograd"}),
        ("transformer", {"vendor.onednn-linear", "cpu.gemm"}),
    ],
)
def test_a_cpu_build_with_bf16_allowed_times_bf16_candidates_and_stays_within_tolerance(name, tactics):
    """oneDNN's and our 1×1 / GEMM kernels' bf16 candidates pass the autotuner's check against the float32
    reference (a wrong one scores inf) and are timed; the engine, whatever it chose, is within bf16's tolerance."""
    model = import_model(zoo.export(name, dynamic_batch=False))
    engine = build_engine(model, BuildConfig(effort=0, precisions=("fp32", "bf16")))
    assert not any("not tried on the CPU" in note for note in engine.report["notes"])
    timed = {
        c.tactic for layer in engine.plans[0].layers for c in layer.candidates
        if c.config.get("precision") == "bf16" and math.isfinite(c.median_ms)
    }  # fmt: skip
    assert tactics <= timed
    x = torch.randn(zoo.input_shape(name))
    got = engine.create_context().run({"input": x})["output"]
    want = Executor(model).run({"input": x})["output"]
    assert got.dtype == torch.float32
    assert relative_error(got.numpy(), want.numpy()) <= BF16_TOLERANCE


@native
@pytest.mark.parametrize("name", ["mobilenetv3", "efficientnet_b0"])
def test_the_depthwise_blocks_run_in_bf16_within_tolerance(name):
    """The CPU block kernels' bf16 candidates (inverted residuals, depthwise + 1×1, squeeze-excite + 1×1, the
    classifier's pooled product) pass the autotuner's check and are timed; forced to bf16 wherever one of our kernels
    takes the layer, the network stays within bf16's tolerance and is not exact."""
    model = import_model(zoo.export(name, batch=2, size=64, dynamic_batch=False))
    engine = build_engine(model, BuildConfig(effort=0, precisions=("fp32", "bf16")))
    timed = {
        c.tactic for layer in engine.plans[0].layers for c in layer.candidates
        if c.config.get("precision") == "bf16" and math.isfinite(c.median_ms)
    }  # fmt: skip
    blocks = {"cpu.expand-depthwise", "cpu.squeeze-excite-pointwise", "cpu.pooled-gemm", "cpu.pointwise"}
    assert blocks <= timed
    forced = []
    for layer in engine.plans[0].layers:
        ours = [c for c in layer.candidates if c.config.get("precision") == "bf16" and math.isfinite(c.median_ms)
                and c.tactic.startswith("cpu.")]  # fmt: skip
        chosen = min(ours, key=lambda c: c.median_ms) if ours else None
        forced.append(Layer(layer.node, chosen.tactic, chosen.config, 0) if chosen else layer)
    assert sum(layer.config.get("precision") == "bf16" for layer in forced) > len(forced) // 2
    schedule = Schedule(engine.model, forced, torch.device("cpu"), {})
    x = torch.randn(zoo.input_shape(name, batch=2, size=64))
    (got,) = schedule.execute({"input": x})
    want = Executor(model).run({"input": x})["output"]
    assert got.dtype == torch.float32
    assert 0 < relative_error(got.numpy(), want.numpy()) <= BF16_TOLERANCE


def test_without_bf16_dot_products_bf16_is_dropped_and_the_report_says_why(monkeypatch):
    monkeypatch.setattr(builder, "cpu_native_precisions", lambda: ())
    model = import_model(zoo.export("inception", dynamic_batch=False))
    engine = build_engine(model, BuildConfig(effort=0, precisions=("fp32", "bf16")))
    assert {layer.precision for layer in engine.plans[0].layers} == {"fp32"}
    assert any("no bf16 dot products" in note for note in engine.report["notes"])
