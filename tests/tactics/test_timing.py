import inspect
import itertools
import math
import time

import pytest
import torch

from tensorforge.tactics.timing import Timing, TimingBudget, context_lost, measure, measure_interleaved


def counting(fail_on: int | None = None, sleep_s: float = 0.0):
    """A callable that counts its calls, sleeps, and raises on call number `fail_on` (1-based)."""
    calls = []

    def fn():
        calls.append(None)
        if len(calls) == fail_on:
            raise RuntimeError(f"kernel launch failed on call {len(calls)}")
        if sleep_s:
            time.sleep(sleep_s)

    return fn, calls


def test_statistics_from_samples():
    timing = Timing.from_samples([4.0, 1.0, 3.0, 2.0])
    assert timing.median == 2.5
    assert timing.min == 1.0
    assert timing.mean == 2.5
    assert timing.samples == (4.0, 1.0, 3.0, 2.0)
    assert timing.ok and timing.error is None
    tenth = Timing.from_samples([float(i) for i in range(1, 11)])
    assert tenth.p90 == pytest.approx(9.1)
    assert tenth.median == 5.5
    single = Timing.from_samples([7.0])
    assert single.median == single.p90 == single.min == single.mean == 7.0


def test_statistics_need_samples():
    with pytest.raises(ValueError, match="at least one sample"):
        Timing.from_samples([])


def test_failed_timing_scores_inf():
    timing = Timing.failed("boom")
    assert not timing.ok
    assert timing.error == "boom"
    assert timing.samples == ()
    assert all(math.isinf(x) for x in (timing.median, timing.min, timing.mean, timing.p90))


def test_sleep_gives_a_plausible_median_on_cpu():
    fn, calls = counting(sleep_s=0.005)
    timing = measure(fn, device="cpu", warmup=2, repeats=10, min_time_s=0.0)
    assert timing.ok
    assert len(timing.samples) == 10
    assert len(calls) == 12
    assert min(timing.samples) >= 5.0  # sleep never returns early
    assert 5.0 <= timing.median < 30.0
    assert timing.min <= timing.median <= timing.p90 <= max(timing.samples)


def test_min_time_adds_samples_until_reached():
    fn, _ = counting(sleep_s=0.001)
    timing = measure(fn, device="cpu", warmup=0, repeats=3, min_time_s=0.015)
    assert len(timing.samples) > 3
    assert sum(timing.samples) >= 15.0


def test_min_time_is_capped_at_ten_times_repeats():
    fn, calls = counting()
    timing = measure(fn, device="cpu", warmup=1, repeats=4, min_time_s=100.0)
    assert len(timing.samples) == 40
    assert len(calls) == 41


@pytest.mark.parametrize("fail_on", [1, 3, 6])  # during warm-up, at the first timed call, later
def test_failing_callable_scores_inf_and_keeps_the_error(fail_on):
    fn, calls = counting(fail_on=fail_on)
    timing = measure(fn, device="cpu", warmup=2, repeats=5, min_time_s=0.0)
    assert not timing.ok
    assert math.isinf(timing.median)
    assert timing.samples == ()
    assert timing.error == f"RuntimeError: kernel launch failed on call {fail_on}"
    assert len(calls) == fail_on  # stops at the failure


def test_keyboard_interrupt_is_not_swallowed():
    def fn():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        measure(fn, device="cpu", warmup=0, repeats=1)


def test_budget_presets_grow_with_effort():
    budgets = [TimingBudget.for_effort(level) for level in (0, 1, 2)]
    for low, high in itertools.pairwise(budgets):
        assert low.repeats < high.repeats
        assert low.warmup < high.warmup
        assert low.min_time_s <= high.min_time_s


def test_measure_defaults_are_effort_one():
    params = inspect.signature(measure).parameters
    defaults = {name: params[name].default for name in ("warmup", "repeats", "min_time_s")}
    assert defaults == TimingBudget.for_effort(1).as_kwargs()


def test_budget_drives_measure():
    budget = TimingBudget(warmup=3, repeats=7, min_time_s=0.0)
    fn, calls = counting()
    timing = measure(fn, device="cpu", **budget.as_kwargs())
    assert len(timing.samples) == 7
    assert len(calls) == 10


def test_a_first_call_over_the_give_up_time_is_the_only_timed_one():
    fn, calls = counting(sleep_s=0.002)
    slow = measure(fn, device="cpu", warmup=1, repeats=5, min_time_s=0.0, give_up_ms=0.5)
    assert len(slow.samples) == 1 and slow.median > 0.5 and len(calls) == 2  # one warm-up, one timed call
    quick = measure(fn, device="cpu", warmup=1, repeats=5, min_time_s=0.0, give_up_ms=1000.0)
    assert len(quick.samples) == 5  # under it, the budget as usual


def test_efforts_below_two_give_up_on_hopeless_candidates_and_two_never():
    assert TimingBudget.for_effort(0).give_up_ratio == TimingBudget.for_effort(1).give_up_ratio == 4.0
    assert TimingBudget.for_effort(2).give_up_ratio == float("inf")
    with pytest.raises(ValueError, match="give_up_ratio"):
        TimingBudget(warmup=1, repeats=1, min_time_s=0.0, give_up_ratio=1.0)


@pytest.mark.parametrize("effort", [-1, 3, True, "1", 1.0])
def test_unknown_effort(effort):
    with pytest.raises(ValueError, match="effort must be 0, 1 or 2"):
        TimingBudget.for_effort(effort)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"warmup": -1}, "warmup"),
        ({"repeats": 0}, "repeats"),
        ({"repeats": 2.5}, "repeats"),
        ({"min_time_s": -0.1}, "min_time_s"),
        ({"min_time_s": float("nan")}, "min_time_s"),
        ({"min_time_s": float("inf")}, "min_time_s"),
    ],
)
def test_bad_budget(kwargs, match):
    with pytest.raises(ValueError, match=match):
        measure(lambda: None, device="cpu", **kwargs)
    full = {"warmup": 1, "repeats": 1, "min_time_s": 0.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        TimingBudget(**full)


def test_unsupported_device():
    with pytest.raises(ValueError, match="'meta'"):
        measure(lambda: None, device="meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_without_cuda_says_so():
    with pytest.raises(ValueError, match="CUDA is not available"):
        measure(lambda: None, device="cuda")


@pytest.mark.gpu
def test_cuda_events_time_gpu_work():
    short, long = 1_000_000, 4_000_000  # clock cycles of a spinning kernel
    fast = measure(lambda: torch.cuda._sleep(short), device="cuda", warmup=3, repeats=20, min_time_s=0.0)
    slow = measure(lambda: torch.cuda._sleep(long), device="cuda", warmup=3, repeats=20, min_time_s=0.0)
    assert fast.ok and slow.ok
    assert len(fast.samples) == 20
    assert 0.0 < fast.median < slow.median
    # events time the GPU work itself: four times the cycles take about four times as long
    assert slow.median / fast.median == pytest.approx(4.0, rel=0.25)


@pytest.mark.gpu
def test_cuda_flush_buffer_is_twice_the_l2():
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    x = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.max_memory_allocated()
    timing = measure(lambda: x @ x, device="cuda:0", warmup=1, repeats=5, flush_l2=True, min_time_s=0.0)
    assert timing.ok
    assert torch.cuda.max_memory_allocated() - baseline >= 2 * l2_bytes


@pytest.mark.gpu
def test_cuda_failure_scores_inf():
    x = torch.randn(4, 5, device="cuda")
    timing = measure(lambda: x @ x, device="cuda", warmup=1, repeats=3)
    assert not timing.ok
    assert math.isinf(timing.median)
    assert "RuntimeError" in timing.error


@pytest.mark.gpu
def test_cuda_timing_replays_a_graph_so_host_overhead_does_not_count():
    x = torch.randn(1024, device="cuda")

    def slow_host():  # 5 ms of Python before one tiny kernel
        time.sleep(0.005)
        x.add_(1.0)

    timing = measure(slow_host, device="cuda", warmup=1, repeats=10, min_time_s=0.0)
    assert timing.ok and timing.median < 0.5


@pytest.mark.gpu
def test_a_call_that_cannot_be_captured_is_timed_eagerly():
    x = torch.randn(1024, device="cuda")

    def synchronizing():  # reading a value back to the host is not allowed during capture
        x.add_(1.0)
        return x[0].item()

    timing = measure(synchronizing, device="cuda", warmup=1, repeats=5, min_time_s=0.0)
    assert timing.ok and timing.median > 0.0


@pytest.mark.gpu
def test_on_cuda_a_first_replay_over_the_give_up_time_is_the_only_timed_one():
    x = torch.randn(4096, 4096, device="cuda")
    slow = measure(lambda: x @ x, device="cuda", warmup=1, repeats=10, min_time_s=0.0, give_up_ms=1e-3)
    assert slow.ok and len(slow.samples) == 1 and slow.median > 1e-3
    quick = measure(lambda: x @ x, device="cuda", warmup=1, repeats=10, min_time_s=0.0, give_up_ms=1e3)
    assert quick.ok and len(quick.samples) == 11  # the first timed call counts, then a batch of `repeats`


def test_interleaved_timing_alternates_the_functions_and_pools_their_rounds():
    calls = []
    fns = [lambda name=name: calls.append(name) for name in "abc"]
    timings = measure_interleaved(fns, device="cpu", rounds=3, warmup=2, repeats=4)
    assert [len(t.samples) for t in timings] == [12, 12, 12]
    # Round one warms each up twice, the later rounds once; within a round each function is timed in turn.
    runs = [len(list(group)) for _, group in itertools.groupby(calls)]
    assert [name for name, _ in itertools.groupby(calls)] == list("abc") * 3
    assert runs == [6, 6, 6, 5, 5, 5, 5, 5, 5]


def test_interleaved_timing_keeps_a_failure_and_checks_its_rounds():
    def flaky(state={"calls": 0}):  # noqa: B006 - the counter lives across calls on purpose
        state["calls"] += 1
        if state["calls"] > 8:
            raise RuntimeError("broke in round two")

    good, bad = measure_interleaved([lambda: None, flaky], device="cpu", rounds=3, warmup=1, repeats=5)
    assert good.ok and len(good.samples) == 15
    assert not bad.ok and "broke in round two" in bad.error and math.isinf(bad.median)
    with pytest.raises(ValueError, match="rounds >= 1"):
        measure_interleaved([lambda: None], device="cpu", rounds=0)


@pytest.mark.parametrize(
    ("err", "lost"),
    [
        (RuntimeError("CUDA error: an illegal memory access was encountered"), True),
        ("RuntimeError: CUDA error: an illegal instruction was encountered", True),
        ("AcceleratorError: CUDA error: unspecified launch failure", True),
        (RuntimeError("CUDA error: out of memory"), False),
        # a kernel's own refusal that names such an error in its advice has met none (seen on an H100: the
        # quantized TMA kernel's refusal of 256-row E4M3 tiles stopped a build)
        (
            ValueError("these tiles compile into code that stops the GPU with an illegal instruction; use smaller"),
            False,
        ),
        ("ValueError: these tiles compile into code that stops the GPU with an illegal instruction", False),
    ],
)
def test_only_cuda_errors_that_are_sticky_count_as_a_lost_context(err, lost):
    assert context_lost(err) is lost
