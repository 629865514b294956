"""Tensors written straight into the concatenation that reads them (`build.concat_views`, the memory plan's views,
`vendor.concat-into`): which ones the plan picks, and that a schedule running so still gives every answer right."""

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge import Executor, zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.concat_views import concat_views, prefer_concat_into
from tensorforge.build.config import BuildConfig
from tensorforge.build.memory import plan_graph
from tensorforge.frontend import import_model
from tensorforge.ir import DType, Node, Value
from tensorforge.ops import load_all
from tensorforge.passes.pipeline import optimize
from tensorforge.runtime.plan import Layer
from tensorforge.runtime.schedule import Schedule
from tensorforge.tactics import base
from tensorforge.tactics.autotune import Candidate, build_layer_kernel
from tensorforge.tactics.base import tactic_by_key
from tests.helpers import make_model, relative_error, tensor_info
from tests.runtime.test_arena import _IntoArena

CONCAT = "vendor.concat-into"
NHWC = {"precision": "fp32", "layout": "NHWC"}


class _Strided(_IntoArena):
    """FusedConv through the reference, copied through the strides of the buffer `alloc` gives."""

    name = "strided-into"
    strided_inputs = True
    strided_outputs = True


@pytest.fixture
def strided():
    tactic = _Strided()
    base._TACTICS.append(tactic)
    yield tactic
    base._TACTICS.remove(tactic)


def _plan(name, tactic_key, size=None, precision="fp32", others=None):
    """The model's CPU engine with every FusedConv forced to `tactic_key` (a list: in turn) and every 4-D channel
    Concat to `vendor.concat-into`, in `precision` (and the ops of `others`, op type -> tactic, to theirs); the
    model, engine, layers and the memory plan with its views."""
    model = import_model(zoo.export(name, dynamic_batch=False, size=size))
    engine = build_engine(model, BuildConfig(effort=0))
    graph = engine.model.graph
    nodes = graph.nodes
    concat = tactic_by_key(CONCAT)
    keys = tactic_key if isinstance(tactic_key, list) else [tactic_key]
    config = {"precision": precision, "layout": "NHWC"}
    layers = []
    for layer in engine.plans[0].layers:
        node = nodes[layer.node]
        if node.op_type == "FusedConv":
            layer = Layer(layer.node, keys[len(layers) % len(keys)], config, layer.median_ms)
        elif node.op_type == "Concat" and concat.supports(node, 17, torch.device("cpu")) is None:
            layer = Layer(layer.node, CONCAT, config, layer.median_ms)
        elif node.op_type in (others or {}):
            layer = Layer(layer.node, others[node.op_type], config, layer.median_ms)
        layers.append(layer)
    shapes, dtypes = _shapes_and_dtypes(graph)
    views = concat_views(engine.model, layers, shapes, dtypes)
    outside = {v.name for l in layers if not tactic_by_key(l.tactic).writes_into for v in nodes[l.node].outputs}
    memory = plan_graph(graph, outside=outside, views=views)
    return model, engine, layers, memory


def _run_matches_the_reference(model, engine, layers, memory):
    """Run the detector's schedule on the CPU in a NaN-poisoned arena and compare it with the reference executor;
    returns (schedule, arena, input, output) for further runs."""
    schedule = Schedule(engine.model, layers, torch.device("cpu"), {}, memory)
    arena = torch.full((memory.arena_bytes,), 0xFF, dtype=torch.uint8)  # NaN bytes for float32
    x = torch.randn(zoo.input_shape("yolo", size=64))
    (got,) = schedule.execute({"input": x}, arena=arena)
    want = Executor(model).run({"input": x})["output"]
    assert relative_error(got.numpy(), want.numpy()) <= 1e-4
    return schedule, arena, x, got


@pytest.fixture
def contiguous_into():
    """A FusedConv tactic that writes into the buffers it is given but ignores their strides."""
    tactic = _Strided()
    tactic.strided_outputs = False
    tactic.name = "contiguous-into"
    base._TACTICS.append(tactic)
    yield tactic
    base._TACTICS.remove(tactic)


def _shapes_and_dtypes(graph):
    values = [v for n in graph.nodes for v in n.outputs] + list(graph.inputs)
    return {v.name: tuple(v.shape) for v in values if v.shape is not None}, {v.name: v.dtype for v in values}


def _timed_alone(layers, into_ms):
    """`layers` with each concat-into layer back on the reference (1 ms), as the autotuner left it, with a
    concat-into candidate timed alone at `into_ms`."""
    timed = []
    for layer in layers:
        if layer.tactic == CONCAT:
            reference = Candidate("reference.registry", {"precision": "fp32", "layout": "any"}, 1.0)
            into = Candidate(CONCAT, NHWC, into_ms)
            layer = Layer(layer.node, reference.tactic, reference.config, 1.0, (reference, into))
        timed.append(layer)
    return timed


def test_concatenations_move_to_concat_into_where_their_inputs_land_in_place(strided):
    """Timed alone, concat-into lost by 10% (it copied every input); in the plan, where the views place inputs,
    it copies less, so each Concat with inputs in place moves to it, and only those. Timed alone 10× slower, it
    pays only where every input is in place (nothing left to copy)."""
    _, engine, layers, _ = _plan("yolo", strided.key, size=64)
    graph = engine.model.graph
    shapes, dtypes = _shapes_and_dtypes(graph)

    def moved(into_ms):
        chosen = prefer_concat_into(engine.model, _timed_alone(layers, into_ms), shapes, dtypes)
        return chosen, {graph.nodes[layer.node].outputs[0].name for layer in chosen if layer.tactic == CONCAT}

    chosen, some_in_place = moved(1.1)
    placed = dict.fromkeys(some_in_place, 0)
    for name, (host, _) in concat_views(engine.model, chosen, shapes, dtypes).items():
        placed[host] += shapes[name][1]
    assert len(some_in_place) >= 8 and all(placed.values())
    all_in_place = {host for host, channels in placed.items() if channels == shapes[host][1]}
    assert all_in_place and moved(10.0)[1] == all_in_place < some_in_place


def test_concatenations_with_nothing_in_place_keep_the_faster_tactic(contiguous_into):
    _, engine, layers, _ = _plan("yolo", contiguous_into.key, size=64)
    shapes, dtypes = _shapes_and_dtypes(engine.model.graph)
    timed = _timed_alone(layers, into_ms=1.1)
    assert prefer_concat_into(engine.model, timed, shapes, dtypes) == timed


def test_the_detector_writes_its_c2f_blocks_into_their_concatenations(strided):
    """Each C2f block's first 1×1 convolution (split in two slices, both concatenated) and its bottlenecks write
    inside the block's concatenation; the schedule run so matches the reference executor."""
    model, engine, layers, memory = _plan("yolo", strided.key, size=64)
    graph = engine.model.graph
    by_name = {v.name: n for n in graph.nodes for v in n.outputs}
    hosts = {host for host, _ in memory.views.values()}
    assert len(hosts) >= 8, memory.views
    for name, (host, _) in memory.views.items():
        assert by_name[host].op_type == "Concat" and by_name[name].op_type == "FusedConv"
        assert memory.offsets[name] == memory.offsets[host]
    split_sources = [name for name, (_, first) in memory.views.items() if first == 0 and "cv1" in name]
    assert split_sources, "no C2f cv1 output written at the start of its concatenation"
    assert "written into their concatenation" in memory.report()
    schedule, arena, x, got = _run_matches_the_reference(model, engine, layers, memory)
    (again,) = schedule.execute({"input": x}, arena=arena)
    assert torch.equal(again, got)


def test_the_detector_pools_its_sppf_maps_into_their_concatenation(strided):
    """The Triton max pool (layout "any", a strided reader and writer, here under the interpreter) writes SPPF's
    three pooled maps inside the block's concatenation, each pool reading the previous one's channel slice; the
    schedule still matches the reference executor."""
    model, engine, layers, _ = _plan("yolo", strided.key, size=64, others={"MaxPool": "triton.maxpool"})
    graph = engine.model.graph
    layers = [
        Layer(layer.node, layer.tactic, {"precision": "fp32", "layout": "any"}, layer.median_ms)
        if layer.tactic == "triton.maxpool"
        else layer
        for layer in layers
    ]
    shapes, dtypes = _shapes_and_dtypes(graph)
    views = concat_views(engine.model, layers, shapes, dtypes)
    by_name = {v.name: n for n in graph.nodes for v in n.outputs}
    pooled = [name for name in views if by_name[name].op_type == "MaxPool"]
    assert len(pooled) == 3 and len({views[name][0] for name in pooled}) == 1, views
    outside = {v.name for l in layers if not tactic_by_key(l.tactic).writes_into for v in graph.nodes[l.node].outputs}
    memory = plan_graph(graph, outside=outside, views=views)
    _run_matches_the_reference(model, engine, layers, memory)


def test_producers_that_ignore_strides_are_not_given_a_slice(contiguous_into):
    """`strided_outputs` is what lets a producer write inside a concatenation: without it, no views."""
    _, _, _, memory = _plan("inception", contiguous_into.key)
    assert not memory.views


def test_the_concatenation_copies_only_what_is_not_in_place(monkeypatch):
    """Two of three inputs already live at their place in the output: one copy, and the right result."""
    load_all()
    values = [Value(n, DType.FLOAT, (2, c, 3, 3)) for n, c in (("a", 2), ("b", 3), ("c", 4))]
    node = Node("Concat", values, [Value("y", DType.FLOAT, (2, 9, 3, 3))], {"axis": 1})
    kernel = build_layer_kernel(tactic_by_key(CONCAT), node, 17, torch.device("cpu"), NHWC, {})
    out = torch.empty(2, 9, 3, 3).contiguous(memory_format=torch.channels_last)
    a = out[:, 0:2]
    b = torch.randn(2, 3, 3, 3)
    c = out[:, 5:9]
    a.copy_(torch.randn(2, 2, 3, 3))
    c.copy_(torch.randn(2, 4, 3, 3))
    want = torch.cat([a.clone(), b, c.clone()], dim=1)
    copies = []
    real = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, *k: copies.append(1) or real(self, src, *k))
    (got,) = kernel([a, b, c], alloc=lambda index, shape, dtype, fmt: out)
    assert got is out and len(copies) == 1
    assert torch.equal(got, want)


@pytest.mark.gpu
def test_the_concatenation_copies_what_is_not_in_place_on_the_gpu():
    """On CUDA the inputs not in place are copied by the tiled strided copy; the one in place is left alone."""
    torch.manual_seed(3)
    values = [Value(n, DType.FLOAT16, (4, c, 6, 6)) for n, c in (("a", 24), ("b", 40), ("c", 8))]
    node = Node("Concat", values, [Value("y", DType.FLOAT16, (4, 72, 6, 6))], {"axis": 1})
    config = {"precision": "fp16", "layout": "NHWC"}
    kernel = build_layer_kernel(tactic_by_key(CONCAT), node, 17, torch.device("cuda"), config, {})
    out = torch.full((4, 72, 6, 6), float("nan"), device="cuda").half().contiguous(memory_format=torch.channels_last)
    a = out[:, 0:24]
    a.copy_(torch.randn(4, 24, 6, 6))
    b = torch.randn(4, 40, 6, 6, device="cuda").half()  # NCHW: converted, then copied
    c = torch.randn(4, 8, 6, 6, device="cuda").half().contiguous(memory_format=torch.channels_last)
    want = torch.cat([a.clone(), b, c], dim=1)
    (got,) = kernel([a, b, c], alloc=lambda index, shape, dtype, fmt: out)
    assert got is out and torch.equal(got, want)


def test_concat_into_declines_other_axes_and_ranks():
    tactic = tactic_by_key(CONCAT)
    cpu = torch.device("cpu")
    x = Value("x", DType.FLOAT, (1, 2, 3, 3))
    along_w = Node("Concat", [x, x], [Value("y", DType.FLOAT, (1, 2, 3, 6))], {"axis": 3})
    assert "axis 1" in tactic.supports(along_w, 17, cpu)
    flat = Value("f", DType.FLOAT, (1, 4))
    assert "4-D" in tactic.supports(
        Node("Concat", [flat, flat], [Value("z", DType.FLOAT, (1, 8))], {"axis": 1}), 17, cpu
    )


@pytest.mark.gpu
def test_triton_convolutions_write_into_their_concatenations_on_the_gpu():
    """The detector in fp16 with its convolutions alternately the Triton implicit GEMM and cuDNN + the Triton
    epilogue, its upsampling and SPPF pools the Triton kernels, all writing into the concatenations and reading channel
    slices, against the float32 reference."""
    torch.manual_seed(0)
    keys = ["triton.conv-igemm", "triton.cudnn-epilogue"]
    others = {"Resize": "triton.upsample-nearest", "MaxPool": "triton.maxpool"}
    model, engine, layers, memory = _plan("yolo", keys, size=64, precision="fp16", others=others)
    assert len(memory.views) > 20
    by_name = {v.name: n for n in engine.model.graph.nodes for v in n.outputs}
    assert sum(by_name[name].op_type == "Resize" for name in memory.views) == 2
    assert sum(by_name[name].op_type == "MaxPool" for name in memory.views) == 3
    schedule = Schedule(engine.model, layers, torch.device("cuda"), {}, memory)
    arena = torch.full((memory.arena_bytes,), 0xFF, dtype=torch.uint8, device="cuda")  # NaN bytes
    x = torch.randn(zoo.input_shape("yolo", size=64))
    (got,) = schedule.execute({"input": x.cuda()}, arena=arena)
    want = Executor(model).run({"input": x})["output"]
    assert relative_error(got.float().cpu().numpy(), want.numpy()) <= 5e-3


def test_a_concatenation_with_a_constant_input_is_left_alone(strided):
    """A Concat reading a constant (no observed shape) gets no views, and planning does not fail on it."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros((1, 2, 5, 5), np.float32), "extra"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["c", "extra"], ["y"], axis=1),
    ]
    model = import_model(make_model(nodes, [tensor_info("x", [1, 3, 5, 5])], [tensor_info("y", None)], 17, inits))
    optimize(model)
    graph = model.graph
    layers = [Layer(i, CONCAT if n.op_type == "Concat" else strided.key, NHWC, 0.0) for i, n in enumerate(graph.nodes)]
    values = [v for n in graph.nodes for v in n.outputs]
    shapes = {v.name: tuple(v.shape) for v in values if v.shape is not None}
    assert concat_views(model, layers, shapes, {v.name: v.dtype for v in values}) == {}


def test_our_cpu_convolutions_write_into_their_concatenations_and_allocate_the_rest():
    """A CPU build of the detector: our convolution kernels write the tensors the plan places inside concatenations
    there, and only those (their other outputs stay outside the arena); run in a NaN-poisoned arena, it matches the
    reference executor."""
    from tensorforge.kernels.cpu import conv
    from tensorforge.kernels.cpu.extension import compiler_problem

    if compiler_problem() or conv.problem():
        pytest.skip("our CPU kernels do not run here")
    model = import_model(zoo.export("yolo", dynamic_batch=False, size=64))
    engine = build_engine(model, BuildConfig(effort=0))
    plan, nodes = engine.plans[0], engine.model.graph.nodes
    ours = {
        nodes[layer.node].outputs[0].name
        for layer in plan.layers
        if tactic_by_key(layer.tactic).arena_for_concatenations
    }
    memory = plan.memory
    in_place = ours & set(memory.views)
    assert len(in_place) >= 8, memory.views
    assert ours & set(memory.offsets) == in_place  # the others are allocated by their kernels
    assert (ours - in_place) <= set(memory.outside)
    _run_matches_the_reference(model, engine, list(plan.layers), memory)
