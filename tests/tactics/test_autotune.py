import math
import threading
import time
from typing import ClassVar

import pytest
import torch
from onnx import helper, numpy_helper

from tensorforge.frontend import import_model
from tensorforge.ir import DType, Node, Value
from tensorforge.passes.pipeline import optimize
from tensorforge.tactics import autotune as autotune_module
from tensorforge.tactics import base
from tensorforge.tactics.autotune import autotune
from tensorforge.tactics.base import Tactic
from tensorforge.tactics.timing import ContextLost, Timing, measure
from tensorforge.tactics.timing_cache import TimingCache
from tensorforge.tactics.vendor import ReferenceTactic
from tests.helpers import make_model, tensor_info


def _fused_conv_layer(residual: bool = False):
    """A Conv + bias + ReLU (+ residual) model optimized into one FusedConv node, with its inputs."""
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(8, 4, 3, 3, generator=generator)
    b = torch.randn(8, generator=generator)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])]
    inputs = [tensor_info("x", [2, 4, 16, 16])]
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        inputs.append(tensor_info("r", [2, 8, 16, 16]))
    nodes.append(helper.make_node("Relu", ["s" if residual else "c"], ["y"]))
    inits = [numpy_helper.from_array(w.numpy(), "w"), numpy_helper.from_array(b.numpy(), "b")]
    model, _ = optimize(import_model(make_model(nodes, inputs, [tensor_info("y", None)], 17, inits)))
    (node,) = model.graph.nodes
    assert node.op_type == "FusedConv"
    x = torch.randn(2, 4, 16, 16, generator=generator)
    feeds = [x, w, b] + ([torch.randn(2, 8, 16, 16, generator=generator)] if residual else [])
    return node, feeds


def test_every_supported_candidate_is_timed_and_the_fastest_wins():
    node, inputs = _fused_conv_layer()
    choice = autotune(node, 1, inputs, "cpu", effort=0)
    timed = {c.tactic: c for c in choice.candidates}
    assert math.isfinite(timed["reference.registry"].median_ms)
    assert math.isfinite(timed["vendor.torch-direct"].median_ms)
    assert timed["vendor.cudnn-fused"].note == "unsupported: needs CUDA"
    assert choice.median_ms == min(c.median_ms for c in choice.candidates)
    table = choice.table("conv")
    assert "*" in table and "100.0%" in table


def test_on_the_cpu_the_fastest_candidates_are_timed_again_against_one_another():
    node, inputs = _fused_conv_layer()
    cache = TimingCache()
    # torch's kernels only: our stem kernel is over twice as fast on this 4-channel layer, leaving none to compare
    choice = autotune(node, 1, inputs, "cpu", effort=0, cache=cache, families=("vendor", "reference"))
    finite = sorted((c for c in choice.candidates if math.isfinite(c.median_ms)), key=lambda c: c.median_ms)
    confirmed = [c for c in finite if c.note == "confirmed in 3 interleaved rounds"]
    assert len(confirmed) >= 2 and finite[0] in confirmed  # the winner is among those timed again
    assert choice.median_ms == finite[0].median_ms
    for candidate in confirmed:  # the pooled rounds replace the first timing in the cache (more samples)
        held = cache.get(choice_key(node, inputs), candidate.tactic, candidate.config)
        assert held.samples == 30 and held.median_ms == candidate.median_ms


def test_when_the_load_rises_during_the_rounds_they_run_again_with_the_candidate_left_out(monkeypatch):
    """The first interleaved rounds come out slower than a candidate left out of them (stood in for here: their
    times are multiplied by 100, as a machine's load rising would): the rounds run again with it, and the winner is
    one timed against its rivals."""
    real = autotune_module.measure_interleaved
    passes = []

    def slow_first_pass(calls, **kwargs):
        timings = real(calls, **kwargs)
        passes.append(len(calls))
        if len(passes) > 1:
            return timings
        return [Timing.from_samples([100 * t for t in timing.samples]) for timing in timings]

    monkeypatch.setattr(autotune_module, "measure_interleaved", slow_first_pass)
    node, inputs = _fused_conv_layer()
    choice = autotune(node, 1, inputs, "cpu", effort=0, families=("vendor", "reference"))
    finite = sorted((c for c in choice.candidates if math.isfinite(c.median_ms)), key=lambda c: c.median_ms)
    assert len(finite) > autotune_module.CONFIRM_TOP and len(passes) >= 2
    assert finite[0].note == "confirmed in 3 interleaved rounds" and choice.median_ms == finite[0].median_ms


def choice_key(node, inputs):
    return autotune_module.layer_signature(node, autotune_module._with_constants(node, inputs, torch.device("cpu")),
                                           torch.device("cpu"))[0]  # fmt: skip


class _WrongTactic(Tactic):
    family, name, op_types = "test", "wrong", ("tensorforge::FusedConv",)

    def build(self, node, opset, device, config):
        return lambda inputs: (torch.zeros(2, 8, 16, 16),)


class _RaisingTactic(Tactic):
    family, name, op_types = "test", "raising", ("tensorforge::FusedConv",)

    def build(self, node, opset, device, config):
        raise RuntimeError("cannot compile")


@pytest.fixture
def broken_tactics(monkeypatch):
    monkeypatch.setattr(base, "_TACTICS", [*base._TACTICS, _WrongTactic(), _RaisingTactic()])


def test_wrong_and_failing_candidates_score_inf_and_the_build_goes_on(broken_tactics):
    node, inputs = _fused_conv_layer(residual=True)
    choice = autotune(node, 1, inputs, "cpu", effort=0)
    notes = {c.tactic: c for c in choice.candidates}
    assert notes["test.wrong"].median_ms == math.inf and "wrong result" in notes["test.wrong"].note
    assert notes["test.raising"].median_ms == math.inf and "cannot compile" in notes["test.raising"].note
    assert not choice.tactic.startswith("test.") and math.isfinite(choice.median_ms)  # a correct tactic won


class _SpacelessTactic(Tactic):
    """A tactic none of whose configurations fits the layer (as a ring too large for shared memory)."""

    family, name, op_types = "test", "spaceless", ("tensorforge::FusedConv",)

    def space_for(self, node, effort):
        return []


def test_a_tactic_with_no_configuration_for_the_layer_is_declined_with_the_reason(monkeypatch):
    monkeypatch.setattr(base, "_TACTICS", [*base._TACTICS, _SpacelessTactic()])
    node, inputs = _fused_conv_layer()
    choice = autotune(node, 1, inputs, "cpu", effort=0)
    (spaceless,) = [c for c in choice.candidates if c.tactic == "test.spaceless"]
    assert spaceless.median_ms == math.inf and "no configuration" in spaceless.note
    assert math.isfinite(choice.median_ms)


def test_a_warm_timing_cache_re_times_nothing(monkeypatch):
    node, inputs = _fused_conv_layer()
    cache = TimingCache()
    first = autotune(node, 1, inputs, "cpu", effort=0, cache=cache)
    calls = []
    monkeypatch.setattr(autotune_module, "measure", lambda *a, **k: calls.append(1))
    second = autotune(node, 1, inputs, "cpu", effort=0, cache=cache)
    assert calls == []
    assert second.from_cache and (second.tactic, second.median_ms) == (first.tactic, first.median_ms)


class _TunedTactic(Tactic):
    """Correct results after a configured delay: a first configuration of `sleep_s` then a fast one; a None
    delay fails to build. Records the threads that built it."""

    family, name, op_types = "test", "tuned", ("tensorforge::FusedConv",)
    first_sleep_s: float | None = 0.0
    threads: ClassVar[set[str]] = set()

    def space(self, effort):
        return [{"sleep_s": self.first_sleep_s}, {"sleep_s": 0.0}]

    def build(self, node, opset, device, config):
        type(self).threads.add(threading.current_thread().name)
        if config["sleep_s"] is None:
            raise RuntimeError("this configuration does not compile")
        reference = ReferenceTactic().build(node, opset, device, {})

        def kernel(inputs):
            time.sleep(config["sleep_s"])
            return reference(inputs)

        return kernel


@pytest.fixture
def tuned_tactic(monkeypatch):
    _TunedTactic.threads = set()
    monkeypatch.setattr(base, "_TACTICS", [*base._TACTICS, _TunedTactic()])
    return _TunedTactic


def _tuned(choice):
    return [c for c in choice.candidates if c.tactic == "test.tuned"]


def test_a_tactic_slow_in_its_first_configuration_is_not_tuned_further(tuned_tactic, monkeypatch):
    monkeypatch.setattr(tuned_tactic, "first_sleep_s", 0.05)
    node, inputs = _fused_conv_layer()
    choice = autotune(node, 1, inputs, "cpu", effort=0)
    assert [c.config["sleep_s"] for c in _tuned(choice)] == [0.05]  # its second configuration was not tried
    # (the count also holds other tactics' configurations where a loaded machine timed their first one slow)
    assert choice.skipped >= 1
    assert f"{choice.skipped} configurations of slower tactics not tried" in choice.table("conv")
    every = autotune(node, 1, inputs, "cpu", effort=0, exhaustive=True)
    assert sorted(c.config["sleep_s"] for c in _tuned(every)) == [0.0, 0.05] and every.skipped == 0
    assert all(math.isfinite(c.median_ms) for c in _tuned(every))


def test_a_candidate_far_slower_than_the_fastest_so_far_is_timed_once(tuned_tactic, monkeypatch):
    monkeypatch.setattr(tuned_tactic, "first_sleep_s", 0.05)
    node, inputs = _fused_conv_layer()
    choice = autotune(node, 1, inputs, "cpu", effort=0)
    (slow,) = _tuned(choice)  # timed after the vendor and reference tactics, each well under 12 ms here
    assert slow.note.startswith("timed once: over 4x the fastest so far") and slow.median_ms >= 50
    careful = autotune(node, 1, inputs, "cpu", effort=2)
    assert all(not c.note.startswith("timed once") for c in careful.candidates)


def test_a_tactic_whose_first_configuration_fails_tries_the_others(tuned_tactic, monkeypatch):
    monkeypatch.setattr(tuned_tactic, "first_sleep_s", None)
    node, inputs = _fused_conv_layer()
    first, second = sorted(_tuned(autotune(node, 1, inputs, "cpu", effort=0)), key=lambda c: c.median_ms)
    assert math.isfinite(first.median_ms) and first.config["sleep_s"] == 0.0
    assert second.median_ms == math.inf and "does not compile" in second.note


class _TwinTactic(Tactic):
    """Tiles 1 and 2, each with its sums left to the tensor cores (`promote` False, listed first) and promoted;
    tile 2 unpromoted gives a wrong result (as a deep E4M3 layer's sums past the bound)."""

    family, name, op_types = "test", "twins", ("tensorforge::FusedConv",)
    built: ClassVar[list[tuple[int, bool]]] = []

    def space(self, effort):
        tiles = [{"tile": 1}, {"tile": 2}]
        return [{**c, "promote": False} for c in tiles] + tiles

    def build(self, node, opset, device, config):
        type(self).built.append((config["tile"], config.get("promote", True)))
        reference = ReferenceTactic().build(node, opset, device, {})
        wrong = config["tile"] == 2 and not config.get("promote", True)
        return lambda inputs: tuple(y + 1 if wrong else y for y in reference(inputs))


def test_a_promoted_twin_is_tried_only_where_its_unpromoted_form_fails_the_check(monkeypatch):
    monkeypatch.setattr(base, "_TACTICS", [*base._TACTICS, _TwinTactic()])
    _TwinTactic.built = []
    node, inputs = _fused_conv_layer()
    choice = autotune(node, 1, inputs, "cpu", effort=2)  # (every configuration in the running at effort 2)
    assert sorted(_TwinTactic.built) == [(1, False), (2, False), (2, True)]  # tile 1 promoted: never built
    ours = [c for c in choice.candidates if c.tactic == "test.twins"]
    twins = {(c.config["tile"], c.config.get("promote", True)): c for c in ours}
    assert math.isfinite(twins[1, False].median_ms) and math.isfinite(twins[2, True].median_ms)
    assert "wrong result" in twins[2, False].note and (1, True) not in twins
    _TwinTactic.built = []
    autotune(node, 1, inputs, "cpu", effort=2, exhaustive=True)
    assert len(_TwinTactic.built) == 4
    assert not autotune_module.unpromoted_twin({"tile": 1, "promote": False}, _TwinTactic().space(0))
    assert not autotune_module.unpromoted_twin({"tile": 3}, _TwinTactic().space(0))  # no twin to stand for it


def test_worker_threads_prepare_candidates_and_score_them_as_one_thread_does(tuned_tactic, broken_tactics):
    node, inputs = _fused_conv_layer(residual=True)
    serial = autotune(node, 1, inputs, "cpu", effort=0, exhaustive=True, workers=1)
    assert tuned_tactic.threads == {threading.current_thread().name}
    threaded = autotune(node, 1, inputs, "cpu", effort=0, exhaustive=True, workers=4)
    assert any(name.startswith("tensorforge-tune") for name in tuned_tactic.threads)

    def scored(choice):  # which candidates are timed again, or only once, depends on the times: not compared
        def note(c):
            return "" if c.note.startswith(("confirmed", "timed once")) else c.note

        return sorted((c.tactic, str(c.config), math.isfinite(c.median_ms), note(c)) for c in choice.candidates)

    assert scored(threaded) == scored(serial)
    assert threaded.prepare_s > 0 and threaded.timing_s > 0
    # the candidates' own preparation times, and their first runs within them, summed across the threads
    assert threaded.candidate_s >= threaded.first_run_s > 0 and serial.candidate_s >= serial.first_run_s > 0


@pytest.mark.gpu
def test_cudnn_fused_convolution_is_a_correct_candidate_on_cuda():
    for residual in (False, True):
        node, inputs = _fused_conv_layer(residual)
        inputs = [t.cuda() for t in inputs]
        choice = autotune(node, 1, inputs, "cuda", effort=0)
        cudnn = next(c for c in choice.candidates if c.tactic == "vendor.cudnn-fused")
        assert math.isfinite(cudnn.median_ms), cudnn.note


def test_strided_inputs_are_timed_apart_from_contiguous_ones():
    """A Concat of transposed views (a detector's reshaped channels_last heads) and one of contiguous tensors of
    the same shapes get different timing-cache keys: the kernels' speed differs by the strides."""
    inputs = [Value(n, DType.FLOAT, (2, 6, 9)) for n in "ab"]
    node = Node("Concat", inputs, [Value("y", DType.FLOAT, (2, 6, 18))], {"axis": 2})
    contiguous = [torch.randn(2, 6, 9) for _ in range(2)]
    views = [torch.randn(2, 9, 6).transpose(1, 2) for _ in range(2)]
    cpu = torch.device("cpu")
    keys = [autotune_module.layer_signature(node, tensors, cpu)[0] for tensors in (contiguous, views)]
    assert keys[0] != keys[1]


def test_e4m3_products_are_held_to_the_fp8_accumulation_bound_in_float_and_quantized_outputs():
    """A float32 output 3e-3 off its reference (E4M3 sums over a K of 3072 left to the tensor cores) fails an fp32
    candidate of a float layer and passes one of E4M3 products; an E4M3 output that rounds a value 3e-3 off
    likewise; 1e-2 off fails both."""
    from tensorforge.tactics.autotune import _mismatch
    from tensorforge.tactics.variant import Variant

    torch.manual_seed(0)
    want = torch.randn(64, 64)
    fp32 = Variant("fp32", "NCHW")
    for offset, products_pass in ((3e-3, True), (1e-2, False)):
        got = want + offset * want.abs().max()
        assert "relative error" in _mismatch([got], [want], [None], fp32)
        assert (_mismatch([got], [want], [None], fp32, fp8_products=True) == "") is products_pass
        scale = want.abs().max().item() / 448 * 8  # values up to 56 on the grid: steps of 4 near the largest
        quantized = {0: (scale, "fp8e4m3")}
        got_q = (got / scale).to(torch.float8_e4m3fn)
        near_steps = (want / scale).to(torch.float8_e4m3fn).double() != got_q.double()
        assert near_steps.any()  # some values round to another step than the reference's
        assert "no rounding" in _mismatch([got_q], [want], [torch.float8_e4m3fn], fp32, quantized)
        result = _mismatch([got_q], [want], [torch.float8_e4m3fn], fp32, quantized, fp8_products=True)
        assert (result == "") is products_pass


class _PoisoningTactic(Tactic):
    """A kernel that fails as a CUDA kernel does when it leaves the context unusable."""

    family, name, op_types = "test", "poisoning", ("tensorforge::FusedConv",)

    def build(self, node, opset, device, config):
        def kernel(inputs):
            raise RuntimeError("CUDA error: an illegal instruction was encountered\nCompile with TORCH_USE_CUDA_DSA")

        return kernel


def test_a_candidate_that_loses_the_cuda_context_stops_the_build_and_is_named(monkeypatch):
    monkeypatch.setattr(base, "_TACTICS", [*base._TACTICS, _PoisoningTactic()])
    node, inputs = _fused_conv_layer()
    with pytest.raises(ContextLost) as caught:
        autotune(node, 1, inputs, "cpu", effort=0, workers=2)
    message = str(caught.value)
    assert node.label in message and "test.poisoning" in message and "'test' left out" in message
    assert "illegal instruction was encountered" in message and "TORCH_USE_CUDA_DSA" not in message


def test_measure_raises_when_the_context_is_lost_and_scores_other_failures():
    def poisoned():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def failing():
        raise RuntimeError("out of resource: shared memory")

    with pytest.raises(ContextLost, match="illegal memory access"):
        measure(poisoned, device="cpu")
    assert not measure(failing, device="cpu").ok


def test_a_cached_failure_from_a_lost_context_is_timed_again_and_other_failures_are_not():
    node, inputs = _fused_conv_layer()
    cache = TimingCache()
    key = choice_key(node, inputs)
    lost = Timing.failed("AcceleratorError: CUDA error: an illegal instruction was encountered")
    cache.record(key, "vendor.torch-direct", {"precision": "fp32", "layout": "NCHW"}, lost)
    failed = Timing.failed("RuntimeError: out of resource")
    cache.record(key, "reference.registry", {"precision": "fp32", "layout": "any"}, failed)
    choice = autotune(node, 1, inputs, "cpu", effort=0, cache=cache, families=("vendor", "reference"))
    notes = {(c.tactic, c.config.get("layout")): c for c in choice.candidates}
    assert math.isfinite(notes["vendor.torch-direct", "NCHW"].median_ms)
    assert notes["reference.registry", "any"].note.startswith("cached failure")
