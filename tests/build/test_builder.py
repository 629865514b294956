"""Engines built on the CPU: they match the reference executor, save and load, honour their profiles."""

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge import Executor, InputError, UnsupportedError, zoo
from tensorforge import realdata as rd
from tensorforge.build.builder import Builder, _uniform, build_engine
from tensorforge.build.config import BuildConfig, Profile
from tensorforge.frontend import import_model
from tensorforge.runtime.engine import Engine
from tensorforge.runtime.plan import Layer
from tensorforge.tactics.autotune import Candidate
from tensorforge.tactics.timing_cache import TimingCache
from tests.helpers import DEVICES, make_model, relative_error, run_onnxruntime, tensor_info

# Engines use other kernels than the reference executor (oneDNN convolutions, fused epilogues): the bound
# for a different implementation of the same float32 model.
FP32_BOUND = 1e-4


def _reference(model, feeds):
    return {name: t.cpu().numpy() for name, t in Executor(model).run(feeds).items()}


def _check_matches(engine, model, feeds, bound=FP32_BOUND):
    got = engine.create_context().run(feeds)
    want = _reference(model, feeds)
    for name, expected in want.items():
        assert got[name].dtype == torch.float32
        error = relative_error(got[name].cpu().numpy(), expected)
        assert error <= bound, f"{name}: relative error {error:.2e}"


@pytest.mark.parametrize("name", ["resnet50", "mobilenetv3", "inception", "transformer"])
def test_zoo_engines_match_the_reference_executor(name):
    model = import_model(zoo.export(name))
    engine = build_engine(model, BuildConfig(effort=0))
    feeds = {"input": torch.randn(zoo.input_shape(name), generator=torch.Generator().manual_seed(1))}
    _check_matches(engine, model, feeds)
    assert len(engine.plans) == 1 and len(engine.plans[0].layers) == len(engine.model.graph)


def test_an_engine_saves_loads_and_runs_the_same(tmp_path):
    model = import_model(zoo.export("mobilenetv3"))
    engine = build_engine(model, BuildConfig(effort=0))
    path = tmp_path / "m.engine"
    engine.save(path)
    loaded = Engine.load(path)
    feeds = {"input": torch.randn(zoo.input_shape("mobilenetv3"))}
    before = engine.create_context().run(feeds)["output"]
    after = loaded.create_context().run(feeds)["output"]
    assert torch.equal(before, after)
    assert [(l.tactic, l.config) for l in loaded.plans[0].layers] == [
        (l.tactic, l.config) for l in engine.plans[0].layers
    ]
    assert loaded.plans[0].memory == engine.plans[0].memory
    with pytest.raises(Exception, match="refusing to overwrite"):
        engine.save(path)


def _dynamic_engine(**options):
    model = import_model(zoo.export("inception"))
    profile = Profile().add("input", (1, 64, 16, 16), (2, 64, 16, 16), (4, 64, 16, 16))
    return model, build_engine(model, BuildConfig(effort=0, profiles=(profile,), **options))


def test_any_shape_inside_the_profile_runs_and_others_are_refused():
    model, engine = _dynamic_engine()
    context = engine.create_context()
    for batch in (1, 3, 4):
        feeds = {"input": torch.randn(batch, 64, 16, 16)}
        got = context.run(feeds)["output"]
        assert relative_error(got.numpy(), _reference(model, feeds)["output"]) <= FP32_BOUND
    with pytest.raises(InputError, match=r"(?s)no optimization profile .* input 'input' has shape \[5, 64, 16, 16\]"):
        context.run({"input": torch.randn(5, 64, 16, 16)})
    with pytest.raises(InputError, match="dtype"):
        context.run({"input": torch.randn(2, 64, 16, 16, dtype=torch.float64)})
    with pytest.raises(InputError, match="missing input 'input'"):
        context.run({})


def test_the_memory_plan_is_made_at_the_profile_max():
    _, engine = _dynamic_engine()
    assert engine.plans[0].tuned_shapes == {"input": (2, 64, 16, 16)}
    memory = engine.plans[0].memory
    sizes = {**memory.sizes, **memory.outside}  # in the arena or allocated by the layer's kernel
    output_of_first = engine.model.graph.nodes[0].outputs[0]
    channels = output_of_first.shape[1]
    assert sizes[output_of_first.name] == 4 * channels * 16 * 16 * 4  # batch 4, float32


def test_profiles_that_contradict_the_model_are_refused():
    model = import_model(zoo.export("inception", dynamic_batch=False))
    profile = Profile().add("input", (1, 64, 16, 16), (2, 64, 16, 16), (4, 64, 16, 16))
    with pytest.raises(InputError, match="model fixes it at 1"):
        build_engine(model, BuildConfig(profiles=(profile,)))
    wrong_name = Profile().add("image", (1, 3), (1, 3), (1, 3))
    with pytest.raises(InputError, match=r"names \['image'\], which are not inputs"):
        build_engine(model, BuildConfig(profiles=(wrong_name,)))


def test_a_dynamic_batch_without_a_profile_is_fixed_at_one_and_said():
    model = import_model(zoo.export("inception"))
    engine = build_engine(model, BuildConfig(effort=0))
    assert any("fixed at 1" in note for note in engine.report["notes"])
    with pytest.raises(InputError, match="outside the profile"):
        engine.create_context().run({"input": torch.randn(2, 64, 16, 16)})


def test_a_warm_timing_cache_rebuild_times_nothing_and_chooses_the_same(tmp_path):
    cache_path = tmp_path / "timing.json"
    model = import_model(zoo.export("mobilenetv3"))
    config = BuildConfig(effort=0, timing_cache=str(cache_path))
    first = build_engine(model, config)
    keys = set(TimingCache.load(cache_path).keys())
    assert keys
    second = build_engine(model, config)
    warm = TimingCache.load(cache_path)
    assert set(warm.keys()) == keys, [warm.description(key) for key in set(warm.keys()) - keys]
    assert all(layer.from_cache for layer in second.plans[0].layers)
    assert all(
        c.note.startswith("cached") or "unsupported" in c.note for l in second.plans[0].layers for c in l.candidates
    )
    assert [(l.tactic, l.config) for l in second.plans[0].layers] == [
        (l.tactic, l.config) for l in first.plans[0].layers
    ]


def test_the_original_model_is_left_untouched():
    model = import_model(zoo.export("inception"))
    before = [(n.op_type, n.name) for n in model.graph.nodes]
    build_engine(model, BuildConfig(effort=0))
    assert [(n.op_type, n.name) for n in model.graph.nodes] == before


def test_half_precision_is_not_tried_on_the_cpu_and_the_report_says_so():
    model = import_model(zoo.export("inception"))
    engine = build_engine(model, BuildConfig(effort=0, precisions=("fp32", "fp16")))
    assert {layer.precision for layer in engine.plans[0].layers} == {"fp32"}
    assert any("not tried on the CPU" in note for note in engine.report["notes"])


def test_control_flow_is_refused_with_a_clear_error():
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y_branch"])], "b", [], [tensor_info("y_branch", [2])]
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    proto = make_model([node], [tensor_info("c", [], 9), tensor_info("x", [2])], [tensor_info("y", [2])])
    with pytest.raises(UnsupportedError, match="control flow"):
        build_engine(import_model(proto), BuildConfig())


def test_multi_output_and_integer_graphs_build():
    """Shape arithmetic, integer outputs and a graph output that is a graph input all survive the engine."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("ArgMax", ["r"], ["index"], axis=1),
        helper.make_node("Mul", ["r", "s"], ["scaled"]),
    ]
    proto = make_model(
        nodes,
        [tensor_info("x", [2, 5])],
        [tensor_info("index", None, 7), tensor_info("scaled", None), tensor_info("x", [2, 5])],
        initializers=[numpy_helper.from_array(np.float32(3.0).reshape(()), "s")],
    )
    model = import_model(proto)
    engine = build_engine(model, BuildConfig(effort=0))
    feeds = {"x": torch.randn(2, 5)}
    got = engine.create_context().run(feeds)
    want = Executor(model).run(feeds)
    for name in ("index", "scaled", "x"):
        assert torch.equal(got[name], want[name])


def test_the_builder_reports_each_layer_as_it_is_tuned():
    seen = []
    model = import_model(zoo.export("inception"))
    Builder(BuildConfig(effort=0), on_layer=lambda i, n, node, choice: seen.append((i, n, choice.tactic))).build(model)
    assert [i for i, _, _ in seen] == list(range(seen[0][1]))


@pytest.mark.parametrize("device", DEVICES)
def test_the_real_orientation_model_engine_agrees_with_onnx_runtime(device):
    path = rd.orientation_model()
    engine = build_engine(path, BuildConfig(device=device, effort=0))
    context = engine.create_context()
    for item in rd.rotated_pages()[::3]:
        x = rd.orientation_input(item.image)
        ours = context.run({"x": x})["fetch_name_0"].cpu().numpy()
        theirs = run_onnxruntime(str(path), {"x": x})["fetch_name_0"]
        assert relative_error(ours, theirs) <= FP32_BOUND, item.name
        assert ours.argmax() == theirs.argmax(), item.name


def test_a_uniform_plan_takes_any_precision_for_a_layer_without_float_activations():
    """An int8 → int8 layer's candidates differ in precision only by the float fallback's: a uniform fp16 plan
    takes its fastest candidate whatever its variant, a float layer's the fastest in fp16."""
    candidates = (
        Candidate("triton.conv-tma-quantized", {"precision": "fp32", "layout": "NHWC"}, 0.104),
        Candidate("fallback.float-conv", {"precision": "fp16", "layout": "NHWC"}, 0.2),
        Candidate("triton.conv-igemm-quantized", {"precision": "fp16", "layout": "NHWC"}, 0.106),
    )
    layer = Layer(3, "triton.conv-igemm-quantized", dict(candidates[2].config), 0.106, candidates)
    assert _uniform(layer, "fp16", "NHWC", floats=False).tactic == "triton.conv-tma-quantized"
    assert _uniform(layer, "fp16", "NHWC", floats=True).tactic == "triton.conv-igemm-quantized"


def test_a_uniform_plan_takes_either_layout_for_a_layer_on_one_by_one_maps():
    """A classifier's convolution after a global pool: its NCHW candidate is the same memory as NHWC, so the NHWC
    plan may take it; a layer on larger maps keeps to the plan's layout."""
    candidates = (
        Candidate("vendor.onednn-fused", {"precision": "fp32", "layout": "NCHW"}, 0.117),
        Candidate("vendor.torch-direct", {"precision": "fp32", "layout": "NHWC"}, 0.152),
    )
    layer = Layer(30, "vendor.torch-direct", dict(candidates[1].config), 0.152, candidates)
    assert _uniform(layer, "fp32", "NHWC", any_layout=True).tactic == "vendor.onednn-fused"
    assert _uniform(layer, "fp32", "NHWC", any_layout=False).tactic == "vendor.torch-direct"


def test_plans_within_reach_of_the_fastest_are_timed_again_interleaved_on_the_cpu(monkeypatch):
    """Timed one after another, a plan can look fastest through a quiet moment of a shared CPU: the contenders are
    timed again in interleaved rounds and those times decide (and stay in the timing cache)."""
    from tensorforge.build import builder
    from tensorforge.tactics.timing import Timing

    timed = []  # the sequential medians handed out, in call order: the first plan timed looks fastest

    def sequential(schedule, feeds, device, budget):
        timed.append([1.0, 1.1, 1.15, 3.0, 3.1, 3.2][len(timed)])
        return Timing.from_samples([timed[-1]] * 5)

    rounds = []

    def interleaved(calls, **options):
        rounds.append(len(calls))
        return [Timing.from_samples([ms] * 30) for ms in (1.4, 1.05, 1.2)[: len(calls)]]

    monkeypatch.setattr(builder, "_time_schedule", sequential)
    monkeypatch.setattr(builder, "measure_interleaved", interleaved)
    model = import_model(zoo.export("inception", dynamic_batch=False))
    cache = TimingCache()
    engine = build_engine(model, BuildConfig(effort=0, precisions=("fp32", "bf16")), cache=cache)
    selection = engine.report["plan_selection"][0]
    assert rounds == [min(3, len(selection["ms"]))] and len(selection["confirmed"]) == rounds[0]
    fastest = min(selection["confirmed"], key=selection["ms"].get)
    assert selection["chosen"] == fastest and selection["ms"][fastest] == 1.05  # the interleaved times decided
    from tensorforge.runtime.inspect import plan_selection_line

    assert f"{fastest} 1.050 ms (interleaved)" in plan_selection_line(engine.report, 0)
