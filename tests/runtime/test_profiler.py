"""The per-layer profiler: medians that add up to a timed run, a Chrome trace, a bar chart."""

import json
import statistics
import time

import numpy as np
import pytest
import torch

from tensorforge import zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig, Profile
from tensorforge.build.memory import VIEW_OPS
from tensorforge.errors import InputError
from tensorforge.frontend import import_model
from tensorforge.ir import qualified_op
from tensorforge.runtime.profiler import profile_engine

SHAPE = zoo.input_shape("inception", batch=2)


def _engine(device: str):
    profile = Profile().add("input", zoo.input_shape("inception", 1), SHAPE, zoo.input_shape("inception", 4))
    config = BuildConfig(device=device, effort=0, profiles=(profile,))
    return build_engine(import_model(zoo.export("inception")), config)


@pytest.fixture(scope="module")
def engine():
    return _engine("cpu")


@pytest.fixture(scope="module")
def feeds():
    return {"input": np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)}


def test_every_layer_is_timed_and_described(engine, feeds):
    result = profile_engine(engine, feeds, runs=5, warmup=1)
    plan = engine.plans[0]
    nodes = engine.model.graph.nodes
    assert [layer.node for layer in result.layers] == [layer.node for layer in plan.layers]
    for position, (timed, built) in enumerate(zip(result.layers, plan.layers, strict=True)):
        node = nodes[built.node]
        assert timed.position == position
        assert (timed.name, timed.op) == (node.name, qualified_op(node))
        assert (timed.tactic, timed.precision, timed.layout) == (built.tactic, built.precision, built.layout)
        if (node.domain, node.op_type) in VIEW_OPS:  # a view of its input: no call of its own in a CPU graph
            assert timed.median_ms >= 0 and timed.duration_ms >= 0
        else:
            assert timed.median_ms > 0 and timed.duration_ms > 0
    assert sum(layer.share for layer in result.layers) == pytest.approx(1.0)
    assert result.total_ms == pytest.approx(sum(layer.median_ms for layer in result.layers))
    slowest = result.slowest(3)
    assert len(slowest) == 3 and slowest[0].median_ms == max(layer.median_ms for layer in result.layers)
    assert result.shapes == {"input": SHAPE} and (result.runs, result.warmup, result.plan) == (5, 1, 0)


def test_layers_add_up_to_a_timed_run(engine, feeds):
    """The timer adds microseconds to millisecond layers, so the sum of the layers' medians is a timed run's
    length give or take noise; profiles and plain runs alternate so that both see the same machine load."""
    context = engine.create_context()
    sums, plain = [], []
    for _ in range(5):
        sums.append(profile_engine(engine, feeds, runs=5, warmup=1).total_ms)
        for _ in range(5):
            start = time.perf_counter()
            context.run(feeds)
            plain.append((time.perf_counter() - start) * 1e3)
    ratio = statistics.median(sums) / statistics.median(plain)
    assert 0.5 < ratio < 1.5, (sums, plain)


def test_in_one_run_the_layers_follow_each_other(engine, feeds):
    result = profile_engine(engine, feeds, runs=3, warmup=1)
    ends = 0.0
    for layer in result.layers:
        assert layer.start_ms >= ends - 1e-6  # no overlap: one track, one layer at a time
        ends = layer.start_ms + layer.duration_ms
    assert ends <= result.run_ms * 1.5  # the representative run is one of median length


def test_chrome_trace_has_one_complete_event_per_layer(engine, feeds, tmp_path):
    result = profile_engine(engine, feeds, runs=3, warmup=1)
    path = tmp_path / "trace.json"
    result.write_trace(path)
    trace = json.loads(path.read_text())
    events = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    assert len(events) == len(engine.plans[0].layers)
    assert {(event["pid"], event["tid"]) for event in trace["traceEvents"]} == {(0, 0)}
    for event, layer in zip(events, result.layers, strict=True):
        assert event["name"] == layer.name
        assert event["ts"] == pytest.approx(layer.start_ms * 1e3)  # microseconds
        assert event["dur"] == pytest.approx(layer.duration_ms * 1e3)
        assert event["args"]["tactic"] == layer.tactic
    assert {event["name"] for event in trace["traceEvents"] if event["ph"] == "M"} == {"process_name", "thread_name"}


def test_bar_chart_is_a_png(engine, feeds, tmp_path):
    result = profile_engine(engine, feeds, runs=2, warmup=0)
    path = tmp_path / "layers.png"
    result.plot(path, top=4)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_form_round_trips(engine, feeds):
    data = json.loads(json.dumps(profile_engine(engine, feeds, runs=2, warmup=0).to_dict()))
    assert len(data["layers"]) == len(engine.plans[0].layers)
    assert {"median_ms", "share", "tactic", "precision", "layout", "op", "name"} <= set(data["layers"][0])
    assert data["shapes"] == {"input": list(SHAPE)}


def test_on_the_cpu_the_profile_replays_the_cpu_graph_unless_told_not_to(engine, feeds):
    """The layers of a CPU-graph profile are the calls each layer recorded: a layer whose kernels write into memory
    the graph keeps costs its C++ call alone. Eager timing includes each layer's Python, so it sums to more."""
    replayed = profile_engine(engine, feeds, runs=5, warmup=1)
    eager = profile_engine(engine, feeds, runs=5, warmup=1, graphs=False)
    assert (replayed.mode, replayed.note, eager.mode) == ("cpu graph", "", "eager")
    assert [layer.node for layer in replayed.layers] == [layer.node for layer in eager.layers]
    assert replayed.to_dict()["mode"] == "cpu graph"


def test_bad_arguments_say_what_is_wrong(engine, feeds):
    with pytest.raises(InputError, match="runs >= 1"):
        profile_engine(engine, feeds, runs=0)
    with pytest.raises(InputError, match="no optimization profile"):
        profile_engine(engine, {"input": np.ones((8, 64, 16, 16), np.float32) * 0.5})


@pytest.mark.gpu
def test_cuda_events_time_every_layer(feeds):
    engine = _engine("cuda")
    result = profile_engine(engine, feeds, runs=10, warmup=3)
    assert result.device.startswith("cuda")
    assert all(layer.median_ms > 0 for layer in result.layers)
    ends = 0.0
    for layer in result.layers:  # events on one stream: each layer starts after the one before has ended
        assert layer.start_ms >= ends - 1e-3
        ends = layer.start_ms + layer.duration_ms
    assert result.total_ms <= result.run_ms * 1.25
    # held behind a sleep while the host enqueues, the layers run back to back: little of a run is gaps
    assert result.total_ms >= 0.7 * result.run_ms
    context = engine.create_context(cuda_graphs=False)
    context.run(feeds)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        context.run(feeds)
    eager_ms = (time.perf_counter() - start) * 1e3 / 10
    assert result.total_ms < 1.5 * eager_ms  # events see GPU time, at most the host-timed eager run
