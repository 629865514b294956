"""Layers whose kernels write into given buffers run out of the context's arena, at the memory plan's offsets,
and every answer stays right (a planning or aliasing mistake would let a later layer overwrite a live value)."""

import contextlib

import pytest
import torch

from tensorforge import Executor, zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.build.memory import plan_graph
from tensorforge.frontend import import_model
from tensorforge.ops import load_all
from tensorforge.ops.fused import DOMAIN
from tensorforge.ops.registry import REGISTRY, OpContext
from tensorforge.runtime.plan import Layer
from tensorforge.runtime.schedule import Schedule
from tensorforge.tactics import base
from tensorforge.tactics.base import Tactic, allocate
from tests.helpers import relative_error


class _IntoArena(Tactic):
    """FusedConv through the reference, copied into the buffer `alloc` gives (channels_last when NHWC)."""

    family = "test"
    name = "into-arena"
    op_types = (f"{DOMAIN}::FusedConv",)
    precisions = ("fp32",)
    layouts = ("NHWC",)
    writes_into = True

    def build(self, node, opset, device, config):
        load_all()
        impl = REGISTRY.lookup("FusedConv", DOMAIN, 1).impl
        ctx = OpContext(node=node, opset=opset, device=device)

        def kernel(inputs, alloc=None):
            y = impl(ctx, *inputs, **node.attributes)
            out = allocate(alloc, 0, y.shape, y.dtype, y.device, torch.channels_last)
            out.copy_(y)
            return (out,)

        return kernel


@pytest.fixture
def into_arena():
    tactic = _IntoArena()
    base._TACTICS.append(tactic)
    yield tactic
    base._TACTICS.remove(tactic)


def _forced(engine, tactic_key):
    nodes = engine.model.graph.nodes
    return [
        Layer(l.node, tactic_key, {"precision": "fp32", "layout": "NHWC"}, l.median_ms)
        if nodes[l.node].op_type == "FusedConv"
        else l
        for l in engine.plans[0].layers
    ]


def test_a_schedule_writes_its_convolutions_into_the_arena(into_arena):
    model = import_model(zoo.export("resnet50", dynamic_batch=False))
    engine = build_engine(model, BuildConfig(effort=0))
    layers = _forced(engine, into_arena.key)
    graph = engine.model.graph
    outside = {v.name for l in layers if l.tactic != into_arena.key for v in graph.nodes[l.node].outputs}
    memory = plan_graph(graph, outside=outside)
    assert memory.offsets and memory.outside
    assert memory.arena_bytes <= 1.10 * memory.lower_bound_bytes
    schedule = Schedule(engine.model, layers, torch.device("cpu"), {}, memory)
    assert schedule.binds_arena and schedule.arena_bytes == memory.arena_bytes
    arena = torch.full((memory.arena_bytes,), 0xFF, dtype=torch.uint8)  # NaN bytes for float32
    written = []

    def watch(layer):  # records which tactics ran
        written.append(layer.tactic)
        return contextlib.nullcontext()

    x = torch.randn(zoo.input_shape("resnet50"))
    (got,) = schedule.execute({"input": x}, around=watch, arena=arena)
    want = Executor(model).run({"input": x})["output"]
    assert relative_error(got.numpy(), want.numpy()) <= 1e-4
    assert written.count(into_arena.key) == 53
    assert not torch.all(arena == 0xFF)  # the convolutions wrote there
    (again,) = schedule.execute({"input": x}, arena=arena)  # a second run over a used arena
    assert torch.equal(again, got)


def test_views_of_an_arena_tensor_keep_it_alive(into_arena):
    """Inception's merged 1×1 convolutions write one tensor that a Split cuts into views read by later layers:
    the layers in between must not be given its bytes."""
    model = import_model(zoo.export("inception", dynamic_batch=False))
    engine = build_engine(model, BuildConfig(effort=0))
    graph = engine.model.graph
    assert "Split" in [node.op_type for node in graph.nodes]
    layers = _forced(engine, into_arena.key)
    outside = {v.name for l in layers if l.tactic != into_arena.key for v in graph.nodes[l.node].outputs}
    memory = plan_graph(graph, outside=outside)
    schedule = Schedule(engine.model, layers, torch.device("cpu"), {}, memory)
    arena = torch.full((memory.arena_bytes,), 0xFF, dtype=torch.uint8)
    x = torch.randn(zoo.input_shape("inception"))
    (got,) = schedule.execute({"input": x}, arena=arena)
    want = Executor(model).run({"input": x})["output"]
    assert relative_error(got.numpy(), want.numpy()) <= 1e-4


def test_a_too_small_arena_is_refused(into_arena):
    model = import_model(zoo.export("inception", dynamic_batch=False))
    engine = build_engine(model, BuildConfig(effort=0))
    layers = _forced(engine, into_arena.key)
    memory = plan_graph(engine.model.graph)
    schedule = Schedule(engine.model, layers, torch.device("cpu"), {}, memory)
    with pytest.raises(ValueError, match="arena has 16 bytes"):
        schedule.execute({"input": torch.randn(zoo.input_shape("inception"))}, arena=torch.empty(16, dtype=torch.uint8))


def test_engines_whose_kernels_allocate_list_their_tensors_outside_the_arena():
    model = import_model(zoo.export("inception", dynamic_batch=False))
    memory = build_engine(model, BuildConfig(effort=0)).plans[0].memory
    assert not memory.offsets and memory.arena_bytes == 0  # ours write there only inside concatenations
    assert len(memory.outside) > 5 and "outside" in memory.report()
