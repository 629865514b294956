"""CPU graphs: runs recorded as their kernel calls and replayed, on hand-written runs (kept memory, values, views,
in-place ops, host reads, a C++ kernel the recorder does not see) and on whole engines of the zoo, whose replays
must give what their eager runs give, input after input."""

from __future__ import annotations

import pytest
import torch

from tensorforge import zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.frontend import import_model
from tensorforge.kernels.cpu import pointwise, squeeze_excite
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.runtime.cpu_graph import NotReplayable, capture

_PROBLEM = compiler_problem() or pointwise.problem()
needs_kernels = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


def _random(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _network(conv: pointwise.PointwiseConv, x: torch.Tensor) -> torch.Tensor:
    """What a run does: a C++ kernel into memory it allocates, a view of it, functional ops (values), an in-place
    op on a value, views of values, and a second kernel reading a value."""
    y = conv(x)  # kept memory: the kernel's output (channels_last), allocated with torch.empty
    y[:, :1].clone()  # a view of kept memory (not replayed), then a value no one reads
    flat = y.reshape(y.shape[0], -1)  # a copy (channels_last does not flatten as NCHW): a value
    z = torch.tanh(flat).reshape(y.shape)  # a value, and a view of it
    z.mul_(2.0)  # in place on a value
    return conv(z.contiguous(memory_format=torch.channels_last)[:, :, :, :], residual=y) + 1.0


@needs_kernels
def test_a_replay_recomputes_the_run_on_new_input_values():
    weight, bias = _random(8, 8, 1, 1, seed=1), _random(8, seed=2)
    conv = pointwise.PointwiseConv(weight, bias, "Relu", (0.0, 0.0), "", (0.0, 0.0), pointwise.TILES[0])
    static = _random(2, 8, 5, 5, seed=3).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        graph, recorded = capture(lambda: _network(conv, static), [static])
        assert torch.equal(recorded, _network(conv, static))
        for seed in (4, 5):
            static.copy_(_random(2, 8, 5, 5, seed=seed))
            replayed = graph.replay()
            want = _network(conv, static)
            assert replayed is not recorded  # the last op's result is a value: made anew by each replay
            assert torch.equal(replayed, want)
    # conv, clone, reshape's copy, tanh, reshape of a value, mul_, contiguous's copy, the slice of a value, conv, add
    assert len(graph) == 10


@needs_kernels
def test_a_kernel_that_returns_a_tensor_gives_a_value():
    x = _random(1, 16, 4, 4, seed=1).contiguous(memory_format=torch.channels_last)
    w1, w2 = _random(4, 16, seed=2), _random(16, 4, seed=3)

    def run():
        return squeeze_excite.gate(x, w1, None, w2, None, "Relu", (0.0, 0.0), "Sigmoid", (0.0, 0.0)) * 3.0

    with torch.inference_mode():
        graph, _ = capture(run, [x])
        x.copy_(_random(1, 16, 4, 4, seed=4))
        assert torch.equal(graph.replay(), run())


def test_an_op_that_returns_its_argument_is_not_replayed():
    """A cast to the type a value has returns the value itself: nothing to make again (a classifier's last layers
    paid a dispatch each for it, 6-30 µs with cold caches)."""
    x = _random(3, 5, seed=1)

    def run():
        return (torch.tanh(x).to(torch.float32) * 2.0).to(torch.float32)

    with torch.inference_mode():
        graph, _ = capture(run, [x])
        x.copy_(_random(3, 5, seed=2))
        assert torch.equal(graph.replay(), run())
    assert len(graph) == 2  # tanh and the product


def test_the_kept_memory_is_planned_by_liveness():
    """Ten 1 MiB buffers written in a chain, each read only by the next write: the graph keeps two buffers' worth,
    not ten, and the replay still computes the chain."""
    x = _random(512, 512, seed=1)

    def run():
        y = x
        for _ in range(10):
            y = torch.add(y, 1.0, out=torch.empty_like(x))
        return y

    with torch.inference_mode():
        graph, _ = capture(run, [x])
        x.copy_(_random(512, 512, seed=2))
        assert torch.equal(graph.replay(), run())
    assert graph.kept_bytes == 2 * x.numel() * 4


@pytest.mark.parametrize(
    "read",
    [
        lambda t: float(t.sum()),
        lambda t: t.tolist(),
        lambda t: torch.nonzero(t > 0),
        lambda t: t.numpy(),
    ],
    ids=["item", "tolist", "nonzero", "numpy"],
)
def test_reading_the_runs_values_on_the_host_is_refused(read):
    x = _random(3, 4, seed=1)
    with torch.inference_mode(), pytest.raises(NotReplayable, match="on the host"):
        capture(lambda: read(torch.relu(x)), [x])
    with torch.inference_mode(), pytest.raises(NotReplayable, match="on the host"):
        capture(lambda: read(x), [x])  # an input's values


def test_reading_a_constants_values_on_the_host_is_allowed():
    x, sizes, w = _random(6, 4, seed=1), torch.tensor([2, 4]), _random(4, seed=3)

    def run():
        scale = 2.0 if torch.equal(w, w) and w.tolist()[0] == float(w[0]) else 3.0  # numbers from constants
        return torch.split(x * scale, sizes.tolist())[1]

    with torch.inference_mode():
        graph, _ = capture(run, [x])
        x.copy_(_random(6, 4, seed=2))
        assert torch.equal(graph.replay(), (x * 2)[2:])


def _reshaped_by_its_shape(x: torch.Tensor) -> torch.Tensor:
    """A dynamic-shape model's shape arithmetic: x's shape as a tensor, dims picked and joined into a target shape
    (Shape → Gather → Unsqueeze → Concat → Reshape), then work on the values."""
    shape = torch.tensor(x.shape)
    rows = shape.index_select(0, torch.tensor([0])) * shape.index_select(0, torch.tensor([1]))
    target = torch.cat([rows, torch.tensor([-1])])
    return torch.tanh(x).reshape(target.tolist()) * 2.0


def test_the_shape_arithmetic_of_constants_is_folded_not_replayed():
    x = _random(2, 3, 4, seed=1)
    with torch.inference_mode():
        graph, _ = capture(lambda: _reshaped_by_its_shape(x), [x])
        for seed in (2, 3):
            x.copy_(_random(2, 3, 4, seed=seed))
            assert torch.equal(graph.replay(), torch.tanh(x).reshape(6, 4) * 2.0)
    assert len(graph) == 3  # tanh, the reshape of a value, the product: the index_selects, mul and cat are folded


def test_a_folded_constant_written_in_place_gets_its_value_back_each_replay():
    """A small tensor made from constants alone is folded; a later in-place add of an input into it would pile up
    over replays, unless each replay starts from its recorded value."""
    x = _random(4, seed=1)

    def run():
        accumulator = torch.zeros(4)  # reads nothing of the run: folded
        view = accumulator[1:]
        view.add_(x[1:])  # written in place through a view
        return accumulator * 3.0

    with torch.inference_mode():
        graph, _ = capture(run, [x], tag=lambda: "layer")
        for seed in (2, 3, 4):
            x.copy_(_random(4, seed=seed))
            assert torch.equal(graph.replay(), run())
        _, marks = graph.timed_replay()
    assert [tag for tag, _, _ in marks] == ["layer"] * len(graph)  # the restore too: a profile counts it somewhere


def test_large_constants_and_random_draws_are_made_again_each_replay():
    x = _random(3, seed=1)
    with torch.inference_mode():
        graph, _ = capture(lambda: (x + 1.0, torch.ones(2048) * 2.0), [x])  # 8 KB > FOLDED_BYTES
        assert torch.equal(graph.replay()[1], torch.full((2048,), 2.0))
        # a draw is not folded into a constant: a replay draws again, which the capture's check refuses
        with pytest.raises(NotReplayable, match="differs"):
            capture(lambda: x + torch.rand(3), [x])
    assert len(graph) == 4  # add, ones, its detach (a view of a value), mul


@needs_kernels
def test_a_write_the_recorder_does_not_see_fails_the_check():
    """A C++ call made around the interception (the raw module function) is not recorded: its output, poisoned
    before the check's replay, stays poisoned, and the capture is refused."""
    conv = pointwise.PointwiseConv(_random(8, 8, 1, 1, seed=1))
    raw = conv._module.module
    x = _random(1, 8, 3, 3, seed=2).contiguous(memory_format=torch.channels_last)

    def run():
        out = torch.empty((1, 8, 3, 3), memory_format=torch.channels_last)
        saved, conv._module = conv._module, raw
        try:
            return conv(x, out=out)
        finally:
            conv._module = saved

    with torch.inference_mode(), pytest.raises(NotReplayable, match="differs"):
        capture(run, [x])


MODELS = ["inception", "mobilenetv3", "efficientnet_b0", "yolo", "transformer", "vit_s16", "convnext_tiny"]


@needs_kernels
@pytest.mark.parametrize("name", MODELS)
def test_engines_replay_what_they_run_eagerly(name):
    """A CPU engine's context records its second run of a shape and replays it from then on: outputs equal to an
    eager context's on every new input (the replay reads the new values, writes every output)."""
    size = 32 if name != "inception" else None
    model = import_model(zoo.export(name, size=size, dynamic_batch=False))
    engine = build_engine(model, BuildConfig(effort=0))
    graphs, eager = engine.create_context(), engine.create_context(cpu_graphs=False)
    for seed in range(4):
        feeds = zoo.example_inputs(name, 1, size, seed=seed)
        got, want = graphs.run(feeds), eager.run(feeds)
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), (name, seed, key)
    assert not graphs.eager_shapes and len(graphs.captured_shapes) == 1


@needs_kernels
def test_a_dynamic_batch_transformer_replays_with_its_reshape_targets_folded():
    """With a dynamic batch the attention's Reshape targets are computed at run time from the input's shape
    (Shape → Gather → Unsqueeze → Concat): the same on every run of a shape, so each shape is recorded and
    replayed (these engines ran every layer from Python before), and gives what an eager context gives."""
    from tensorforge.build.config import Profile

    profile = Profile().add("input", (1, 16, 64), (2, 16, 64), (3, 16, 64))
    engine = build_engine(import_model(zoo.export("transformer")), BuildConfig(effort=0, profiles=(profile,)))
    graphs, eager = engine.create_context(), engine.create_context(cpu_graphs=False)
    for seed, batch in enumerate((1, 2, 1, 3, 2, 3, 1)):
        feeds = zoo.example_inputs("transformer", batch, seed=seed)
        got, want = graphs.run(feeds), eager.run(feeds)
        for key in want:
            assert torch.equal(got[key], want[key]), (batch, seed, key)
    assert not graphs.eager_shapes and len(graphs.captured_shapes) == 3


def test_numbers_read_from_the_values_of_a_run_keep_it_eager():
    """A Slice whose end comes from the input's values (a count of positive entries, not a shape) cannot be
    replayed: the schedule says so before any recording, and the context runs that shape eagerly."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Greater", ["x", "zero"], ["positive"]),
            helper.make_node("Cast", ["positive"], ["ones"], to=TensorProto.INT64),
            helper.make_node("ReduceSum", ["ones", "first"], ["count"], keepdims=1),
            helper.make_node("Slice", ["x", "start", "count", "second"], ["y"]),
        ],
        "slice_by_values",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "n"])],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
         helper.make_tensor("first", TensorProto.INT64, [2], [0, 1]),
         helper.make_tensor("start", TensorProto.INT64, [1], [0]),
         helper.make_tensor("second", TensorProto.INT64, [1], [1])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    engine = build_engine(import_model(model), BuildConfig(effort=0))
    assert "reads the values of 'count', computed at run time" in engine.schedule(0).replay_problem
    context = engine.create_context()
    for seed in (1, 2, 1):
        x = _random(2, 6, seed=seed)
        count = int((x > 0).sum())
        assert torch.equal(context.run({"x": x})["y"], x[:, :count])
    assert context.eager_shapes and not context.captured_shapes


def test_cpu_graphs_can_be_turned_off_and_need_a_cpu_engine():
    engine = build_engine(import_model(zoo.export("inception", dynamic_batch=False)), BuildConfig(effort=0))
    context = engine.create_context(cpu_graphs=False)
    context.run(zoo.example_inputs("inception", 1))
    assert not context.captured_shapes and not context.eager_shapes
    from tensorforge import InputError

    with pytest.raises(InputError, match="CUDA graphs need an engine built for CUDA"):
        engine.create_context(cuda_graphs=True)


def test_each_shape_of_a_profile_gets_its_own_graph_in_memory_they_share():
    from tensorforge.build.config import Profile

    profile = Profile().add("input", (1, 64, 16, 16), (2, 64, 16, 16), (4, 64, 16, 16))
    engine = build_engine(import_model(zoo.export("inception")), BuildConfig(effort=0, profiles=(profile,)))
    graphs, eager = engine.create_context(), engine.create_context(cpu_graphs=False)
    for seed, batch in enumerate((1, 2, 1, 4, 2, 1, 4)):  # each new shape grows the shared memory, moving the others
        feeds = zoo.example_inputs("inception", batch, seed=seed)
        assert torch.equal(graphs.run(feeds)["output"], eager.run(feeds)["output"]), batch
    assert len(graphs.captured_shapes) == 3 and not graphs.eager_shapes
    kept = [graphs._graphs[key].graph.kept_bytes for key in graphs.captured_shapes]
    assert graphs._kept.buffer.numel() == max(kept) < sum(kept)


@needs_kernels
def test_contexts_replay_concurrently_from_threads():
    """Each context records its own graph (its own memory); replays from two threads at once, each on its own
    inputs, give the eager results."""
    import threading

    engine = build_engine(import_model(zoo.export("mobilenetv3", size=32, dynamic_batch=False)), BuildConfig(effort=0))
    reference = engine.create_context(cpu_graphs=False)
    feeds = [zoo.example_inputs("mobilenetv3", 1, 32, seed=seed) for seed in range(6)]
    wants = [reference.run(f)["output"] for f in feeds]
    failures = []

    def work(context, order):
        for index in order * 5:
            if not torch.equal(context.run(feeds[index])["output"], wants[index]):
                failures.append(index)

    contexts = [engine.create_context() for _ in range(2)]
    threads = [
        threading.Thread(target=work, args=(context, order))
        for context, order in zip(contexts, ([0, 1, 2], [3, 4, 5]), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert all(len(context.captured_shapes) == 1 for context in contexts)


def test_the_build_times_plans_as_replays_and_reports_the_recording():
    from tensorforge.runtime.inspect import plan_selection_line

    engine = build_engine(import_model(zoo.export("inception", dynamic_batch=False)), BuildConfig(effort=0))
    assert engine.report["plan_selection"][0]["cpu_graph"] == "captured"
    assert plan_selection_line(engine.report, 0).endswith("; CPU graph: captured")


@pytest.mark.parametrize("name", ["resnet50", "mobilenetv3"])
def test_int8_engines_replay_what_they_run_eagerly(name):
    """Quantized layers (oneDNN's int8 convolutions and products, quantize and dequantize steps, float fallbacks on
    our kernels) replay like float ones."""
    from tensorforge.build.builder import Builder
    from tensorforge.build.config import QuantizationConfig

    model = import_model(zoo.export(name, size=32, dynamic_batch=False))
    batches = [zoo.example_inputs(name, 1, 32, seed=seed) for seed in range(4)]
    config = BuildConfig(effort=0, precisions=("fp32", "int8"), quantization=QuantizationConfig())
    engine = Builder(config, calibration_data=batches).build(model)
    assert engine.report["quantization"]["quantized"]
    graphs, eager = engine.create_context(), engine.create_context(cpu_graphs=False)
    for seed in range(10, 14):
        feeds = zoo.example_inputs(name, 1, 32, seed=seed)
        assert torch.equal(graphs.run(feeds)["output"], eager.run(feeds)["output"]), seed
    assert not graphs.eager_shapes and len(graphs.captured_shapes) == 1
