"""The compile pass before tuning (`tactics.precompile`): every layer's compiling candidates, each variant but TF32
and each configuration, run once on inputs of the layer's real shapes from a worker pool; failures left to the
tuning; the pass ends early at a layer the reference cannot run. Run on the CPU with a stand-in compiling tactic
(the real ones need CUDA, where the builder runs this pass)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge.build.config import BuildConfig
from tensorforge.frontend import import_model
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics import base
from tensorforge.tactics.autotune import layer_key
from tensorforge.tactics.base import Tactic
from tensorforge.tactics.precompile import precompile
from tensorforge.tactics.timing import ContextLost, Timing
from tensorforge.tactics.timing_cache import TimingCache
from tensorforge.tactics.vendor import ReferenceTactic
from tests.helpers import make_model, tensor_info

CPU = torch.device("cpu")


class _CompilingTactic(Tactic):
    """A Triton-family stand-in: records each (layer, tile, activation shape) it runs; its second config fails to
    build."""

    family, name, op_types = "triton", "stand-in", ("tensorforge::FusedConv",)
    precisions = ("fp32", "tf32")
    runs: ClassVar[list[tuple[str, int, tuple]]] = []

    def space(self, effort):
        return [{"tile": 1}, {"tile": "broken"}, {"tile": 3}][: 2 + effort]

    def build(self, node, opset, device, config):
        if config["tile"] == "broken":
            raise RuntimeError("this configuration does not compile")

        def kernel(inputs):
            type(self).runs.append((node.name, config["tile"], tuple(inputs[0].shape)))
            return (inputs[0],)  # what it computes does not matter here

        return kernel


@pytest.fixture
def compiling(monkeypatch):
    _CompilingTactic.runs = []
    monkeypatch.setattr(base, "_TACTICS", [*base._TACTICS, _CompilingTactic()])
    return _CompilingTactic


def _two_convs():
    """Conv 4→8 (3×3, padded) + ReLU, then Conv 8→6 (1×1, stride 2): two FusedConv layers of different shapes."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((6, 8, 1, 1)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="first"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["y"], strides=[2, 2], name="second"),
    ]
    model, _ = optimize(
        import_model(make_model(nodes, [tensor_info("x", [2, 4, 10, 10])], [tensor_info("y", None)], 17, inits))
    )
    assert [n.op_type for n in model.graph.nodes] == ["FusedConv", "FusedConv"]
    return model


def _env(model):
    (x,) = model.graph.inputs
    return {x: torch.randn(2, 4, 10, 10)}


def test_every_layer_every_variant_but_tf32_every_config_runs_once_on_the_layers_shapes(compiling, monkeypatch):
    monkeypatch.setattr(compiling, "precisions", ("fp16", "tf32", "fp32"))
    model = _two_convs()
    done = precompile(
        model, _env(model), CPU, effort=1, precisions=("fp32", "tf32", "fp16"), families=None, constants={},
        workers=4,
    )  # fmt: skip
    first, second = (n.name for n in model.graph.nodes)
    # per layer: fp16's 3 configs, fp32's first one, TF32 left out
    assert done.submitted == 2 * (3 + 1) and done.seconds > 0 and done.stopped == ""
    assert sorted(compiling.runs, key=str) == sorted(
        [
            (name, tile, shape)
            for name, shape in ((first, (2, 4, 10, 10)), (second, (2, 8, 10, 10)))
            for tile in (1, 3, 1)
        ],
        key=str,
    )  # the broken configuration failed quietly: the tuning meets and reports it


def test_a_promoted_twin_is_left_to_the_tuning(compiling, monkeypatch):
    """An E4M3 layer's space lists each tile unpromoted and promoted: only the first compile here (the tuning
    builds a promoted one where its twin fails the check)."""
    monkeypatch.setattr(compiling, "precisions", ("fp16",))
    monkeypatch.setattr(compiling, "space", lambda self, effort: [{"tile": 1, "promote": False}, {"tile": 1}])
    model = _two_convs()
    done = precompile(model, _env(model), CPU, effort=0, precisions=("fp16",), families=None, constants={}, workers=2)
    assert done.submitted == 2 and [tile for _, tile, _ in compiling.runs] == [1, 1]


def test_the_float_fallback_on_a_compiling_kernel_is_compiled_too(compiling, monkeypatch):
    """A tactic of a family that compiles nothing (the float fallback) whose configuration runs an inner kernel of
    one that does: those configurations are compiled, the others left (as fallbacks on the vendor's kernels are)."""
    monkeypatch.setattr(compiling, "precisions", ("fp16",))
    wrapper = type(
        "_Wrapper",
        (Tactic,),
        {
            "family": "fallback",
            "name": "wrapper",
            "op_types": ("tensorforge::FusedConv",),
            "precisions": ("fp16",),
            "space": lambda self, effort: [{"inner": "reference.registry"}, {"inner": "triton.stand-in"}],
            "build": lambda self, node, opset, device, config: base.tactic_by_key(config["inner"]).build(
                node, opset, device, {"tile": 2}
            ),
        },
    )()
    monkeypatch.setattr(base, "_TACTICS", [*base._TACTICS, wrapper])
    model = _two_convs()
    done = precompile(
        model, _env(model), CPU, effort=0, precisions=("fp16",), families=("fallback",), constants={}, workers=2
    )
    assert done.submitted == 2 and [tile for _, tile, _ in compiling.runs] == [2, 2]


def test_families_outside_the_build_are_not_compiled(compiling):
    model = _two_convs()
    done = precompile(
        model, _env(model), CPU, effort=0, precisions=("fp32",), families=("vendor",), constants={}, workers=2
    )
    assert done.submitted == 0 and compiling.runs == []


def test_a_layer_the_reference_cannot_run_ends_the_pass(compiling, monkeypatch):
    model = _two_convs()
    real = ReferenceTactic.build
    calls = []

    def failing_on_the_first(self, node, *args):
        calls.append(node.name)
        if len(calls) == 1:
            raise RuntimeError("no reference here")
        return real(self, node, *args)

    monkeypatch.setattr(ReferenceTactic, "build", failing_on_the_first)
    done = precompile(model, _env(model), CPU, effort=0, precisions=("fp32",), families=None, constants={}, workers=2)
    assert "no reference here" in done.stopped and model.graph.nodes[0].label in done.stopped
    assert done.submitted == 1  # the first layer's float32 first config; the second layer's inputs never existed
    assert {run[0] for run in compiling.runs} == {model.graph.nodes[0].name}


def test_the_build_config_keeps_the_switch():
    assert BuildConfig().precompile
    off = BuildConfig(device="cpu", precompile=False)
    assert BuildConfig.from_dict(off.to_dict()) == off
    assert BuildConfig.from_dict({k: v for k, v in off.to_dict().items() if k != "precompile"}).precompile


def test_candidates_the_timing_cache_holds_are_not_compiled(compiling, monkeypatch):
    """A rebuild with the cache of an earlier build: the first layer's candidates are timed in it under the key of
    fp16 channels_last inputs (what the layers before it would hand it in an fp16 build), so they are left to the
    tuning, which takes their times from the cache; the second layer's, not in it, are compiled."""
    monkeypatch.setattr(compiling, "precisions", ("fp16", "fp32"))
    model = _two_convs()
    first, second = model.graph.nodes
    cache = TimingCache()
    x = torch.empty(2, 4, 10, 10, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    key = layer_key(first, [x, None], CPU)  # as the builder hands autotune a layer's inputs
    timing = Timing.from_samples([1.0])
    for precision, configs in (("fp16", compiling().space(1)), ("fp32", compiling().space(1)[:1])):
        for config in configs:
            cache.record(key, compiling().key, {"precision": precision, "layout": "any", **config}, timing)
    done = precompile(
        model, _env(model), CPU, effort=1, precisions=("fp32", "fp16"), families=None, constants={}, workers=2,
        cache=cache,
    )  # fmt: skip
    assert {run[0] for run in compiling.runs} == {second.name}, compiling.runs
    assert done.submitted == 3 + 1  # the second layer's fp16 configs and its fp32 first one


def test_a_candidate_that_loses_the_cuda_context_stops_the_pass_and_is_named(compiling, monkeypatch):
    def build(self, node, opset, device, config):
        def kernel(inputs):
            if config["tile"] == 3:
                raise RuntimeError("CUDA error: an illegal memory access was encountered\nFor debugging consider ...")
            return (inputs[0],)

        return kernel

    monkeypatch.setattr(compiling, "build", build)
    monkeypatch.setattr(compiling, "precisions", ("fp16",))
    model = _two_convs()
    with pytest.raises(ContextLost) as caught:
        precompile(model, _env(model), CPU, effort=1, precisions=("fp16",), families=None, constants={}, workers=2)
    message = str(caught.value)
    assert "triton.stand-in" in message and "illegal memory access" in message and "For debugging" not in message
    assert model.graph.nodes[0].label in message or model.graph.nodes[1].label in message
