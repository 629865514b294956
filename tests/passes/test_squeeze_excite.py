"""Squeeze-and-excitation fusion: the fused graph computes what the original did; what it must not fuse stays."""

import math

import numpy as np
import pytest
import torch
from onnx import helper

from tensorforge import zoo
from tensorforge.frontend import import_model
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.ops import Executor
from tensorforge.passes.pipeline import default_passes, optimize
from tensorforge.tactics.autotune import TOLERANCE, autotune, build_layer_kernel, relative_error
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, tensor_info
from tests.passes.support import init, ops, optimize_and_compare

SHAPE = [2, 16, 7, 7]


def _se_model(act1="Relu", act2="HardSigmoid", pool="GlobalAveragePool", gate_is_output=False, stride=1):
    """x → pool → Conv 1×1 (16→4) → act1 → Conv 1×1 (4→16) → act2 → Mul with x (gate first)."""
    rng = np.random.default_rng(0)
    inits = [
        init("w1", rng.standard_normal((4, 16, 1, 1)).astype(np.float32) * 0.3),
        init("b1", rng.standard_normal(4).astype(np.float32)),
        init("w2", rng.standard_normal((16, 4, 1, 1)).astype(np.float32) * 0.3),
        init("b2", rng.standard_normal(16).astype(np.float32)),
    ]
    if pool == "GlobalAveragePool":
        nodes = [helper.make_node("GlobalAveragePool", ["x"], ["s"])]
    else:
        inits.append(init("axes", np.array([2, 3], dtype=np.int64)))
        nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["s"], keepdims=1)]
    nodes += [
        helper.make_node("Conv", ["s", "w1", "b1"], ["h0"], kernel_shape=[1, 1], strides=[stride, stride]),
        helper.make_node(act1, ["h0"], ["h"]),
        helper.make_node("Conv", ["h", "w2", "b2"], ["g0"], kernel_shape=[1, 1]),
        helper.make_node(act2, ["g0"], ["g"]),
        helper.make_node("Mul", ["g", "x"], ["y"]),
    ]
    outputs = [tensor_info("y", None)] + ([tensor_info("g", None)] if gate_is_output else [])
    return make_model(nodes, [tensor_info("x", SHAPE)], outputs, 18, inits)


def _feeds():
    return [{"x": torch.randn(*SHAPE)}, {"x": torch.randn(*SHAPE) * 4}]


@pytest.mark.parametrize(
    ("act1", "act2", "pool"),
    [("Relu", "HardSigmoid", "GlobalAveragePool"), ("Relu", "Sigmoid", "ReduceMean")],
)
def test_squeeze_excite_fuses_into_one_node_with_the_same_results(act1, act2, pool):
    model, report = optimize_and_compare(_se_model(act1, act2, pool), _feeds(), default_passes("cpu"))
    assert ops(model) == ["SqueezeExcite"]
    (node,) = model.graph.nodes
    assert (node.attributes["act1"], node.attributes["act2"]) == (act1, act2)
    assert node.name  # the gating product's name: the block is recognizable in profiles
    assert any(e.rule == "squeeze-excite" and e.status == "fired" for e in report.events)


def test_silu_reduction_as_efficientnet_has_it_fuses():
    """EfficientNet's block: SiLU written x·σ(x) after the reducing convolution, Sigmoid after the expanding."""
    proto = _se_model("Sigmoid", "Sigmoid")
    graph = proto.graph
    sig = next(n for n in graph.node if n.output[0] == "h")
    sig.output[0] = "h_sig"
    graph.node.insert(list(graph.node).index(sig) + 1, helper.make_node("Mul", ["h0", "h_sig"], ["h"]))
    model, _ = optimize_and_compare(proto, _feeds(), default_passes("cpu"))
    assert ops(model) == ["SqueezeExcite"]
    assert model.graph.nodes[0].attributes["act1"] == "SiLU"


def test_an_intermediate_read_elsewhere_keeps_the_block_apart():
    model, report = optimize_and_compare(_se_model(gate_is_output=True), _feeds(), default_passes("cpu"))
    assert "SqueezeExcite" not in ops(model)
    declined = [e for e in report.events if e.rule == "squeeze-excite" and e.status == "declined"]
    assert declined and "graph output" in declined[0].detail


def test_a_strided_convolution_is_not_a_product_with_the_vector():
    """A stride on a 1×1 map changes nothing numerically but is outside the pattern; the rule says why."""
    model, report = optimize_and_compare(_se_model(stride=2), _feeds(), default_passes("cpu"))
    assert "SqueezeExcite" not in ops(model)
    assert any("strided" in e.detail for e in report.events if e.rule == "squeeze-excite")


def test_the_fusion_runs_for_cpu_and_cuda_builds():
    assert ops(optimize(import_model(_se_model()), device="cpu")[0]) == ["SqueezeExcite"]
    assert ops(optimize(import_model(_se_model()), device="cuda")[0]) == ["SqueezeExcite"]
    assert "SqueezeExcite" not in ops(optimize(import_model(_se_model()))[0])  # the device-independent pipeline


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_torch_squeeze_excite_tactic_matches_the_reference(layout):
    model, _ = optimize(import_model(_se_model()), device="cpu")
    (node,) = model.graph.nodes
    cpu = torch.device("cpu")
    x = torch.randn(*SHAPE)
    if layout == "NHWC":
        x = x.contiguous(memory_format=torch.channels_last)
    choice = autotune(node, 1, [x, None, None, None, None], "cpu", effort=0)
    timed = [c for c in choice.candidates if c.tactic == "vendor.torch-squeeze-excite"]
    assert timed and all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, cpu, {}, {})
    kernel = build_layer_kernel(tactic_by_key("vendor.torch-squeeze-excite"), node, 1, cpu, {"precision": "fp32"}, {})
    got, want = kernel([x])[0], reference([x])[0]
    assert got.shape == want.shape
    assert relative_error(got, want) <= TOLERANCE["fp32"]
    assert got.is_contiguous(memory_format=torch.channels_last) == (layout == "NHWC")  # x's layout kept
    bigger = torch.randn(3, *SHAPE[1:])  # another batch size, same prepared weights
    assert relative_error(kernel([bigger])[0], reference([bigger])[0]) <= TOLERANCE["fp32"]


@pytest.mark.skipif(compiler_problem() is not None, reason=str(compiler_problem()))
@pytest.mark.parametrize(("act1", "act2"), [("Relu", "HardSigmoid"), ("Relu", "Sigmoid")])
def test_cpu_squeeze_excite_tactic_passes_the_autotuners_check(act1, act2):
    """The C++ block (`cpu.squeeze-excite`) timed and checked by the autotuner, then against the reference with
    another batch size; channels_last out whatever the input's layout."""
    model, _ = optimize(import_model(_se_model(act1, act2)), device="cpu")
    (node,) = model.graph.nodes
    cpu = torch.device("cpu")
    choice = autotune(node, 1, [torch.randn(*SHAPE), None, None, None, None], "cpu", effort=0, families=["cpu"])
    timed = [c for c in choice.candidates if c.tactic == "cpu.squeeze-excite"]
    assert timed and all(math.isfinite(c.median_ms) for c in timed), [c.note for c in timed]
    reference = build_layer_kernel(tactic_by_key("reference.registry"), node, 1, cpu, {}, {})
    kernel = build_layer_kernel(tactic_by_key("cpu.squeeze-excite"), node, 1, cpu, {"precision": "fp32"}, {})
    bigger = torch.randn(3, *SHAPE[1:])
    got = kernel([bigger])[0]
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert relative_error(got, reference([bigger])[0]) <= TOLERANCE["fp32"]


def test_cpu_squeeze_excite_tactic_declines_with_reasons():
    model, _ = optimize(import_model(_se_model("Relu", "HardSigmoid")), device="cpu")
    (node,) = model.graph.nodes
    tactic = tactic_by_key("cpu.squeeze-excite")
    assert tactic.supports(node, 1, torch.device("cuda")) == "a CPU kernel"
    node.attributes["act1"] = "Gelu"
    assert "no act1 'Gelu'" in tactic.supports(node, 1, torch.device("cpu"))


@pytest.mark.parametrize("device", ["cpu", "cuda"])  # the graph optimized for that device type, run on the CPU
@pytest.mark.parametrize(("name", "blocks"), [("mobilenetv3", 8), ("efficientnet_b0", 16)])
def test_zoo_blocks_fuse_and_the_model_computes_the_same(name, blocks, device):
    proto = zoo.export(name, batch=1, size=64, dynamic_batch=False)
    model, _ = optimize(import_model(proto), device=device)
    assert ops(model).count("SqueezeExcite") == blocks
    assert ops(model).count("GlobalAveragePool") == 1  # the head's pool is left
    x = zoo.example_inputs(name, 1, 64, seed=3)
    want = Executor(import_model(proto)).run(x)
    got = Executor(model).run(x)
    for key, expected in want.items():
        assert relative_error(got[key], expected) <= 1e-5, key
