"""The side-by-side benchmark suite on the CPU: a tiny model, few runs; the files it writes, merging, failures."""

import json
import random
import time

import pytest
import torch

from bench import suite
from tensorforge.kernels.cpu import depthwise_pointwise
from tensorforge.kernels.cpu.extension import compiler_problem
from tensorforge.tactics.timing_cache import TimingCache

pytest.importorskip("onnxruntime")
pytest.importorskip("matplotlib")

TINY = ["--models", "inception", "--size", "inception=6", "--runs", "2", "--warmup", "1", "--effort", "0"]


def _rows(out):
    data = json.loads((out / suite.RESULTS_JSON).read_text())
    return data, {suite.row_key(r): r for r in data["results"]}


def test_suite_writes_json_markdown_and_plot_and_merges(tmp_path):
    suite.main(
        [*TINY, "--batch", "1", "--batch", "2", "--systems", "tensorforge", "eager", "ort", "--out", str(tmp_path)]
    )
    data, rows = _rows(tmp_path)
    assert set(rows) == {("inception", b, s, "fp32") for b in (1, 2) for s in ("tensorforge", "eager", "ort")}
    for row in rows.values():
        assert row["status"] == "ok" and row["size"] == 6 and row["runs"] == 2
        assert row["ms"] > 0 and row["throughput"] == pytest.approx(1e3 * row["batch"] / row["ms"])
        assert 0 < row["error_vs_fp64"] < 1e-5  # float32 against float64, really computed
        assert row["build_s"] >= 0
    (meta,) = data["invocations"]
    assert meta["device_type"] == "cpu" and meta["torch"] and meta["onnxruntime"] and meta["date"]
    assert meta["command"].startswith("python bench/suite.py --models inception")
    md = (tmp_path / suite.RESULTS_MD).read_text()
    assert "## inception (size 6)" in md and "| tensorforge | fp32 |" in md and "| batch 1 | batch 2 |" in md
    eager_row = next(line for line in md.splitlines() if line.startswith("| eager | fp32 |"))
    assert eager_row.count("1.00×") == 2
    png = (tmp_path / suite.RESULTS_PNG).read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000

    # a second invocation with --merge replaces the rows it measures again and keeps the others
    old_eager = rows[("inception", 1, "eager", "fp32")]
    suite.main([*TINY, "--batch", "1", "--systems", "eager", "--merge", "--out", str(tmp_path)])
    data, merged = _rows(tmp_path)
    assert len(data["invocations"]) == 2 and set(merged) == set(rows)
    assert merged[("inception", 2, "ort", "fp32")] == rows[("inception", 2, "ort", "fp32")]
    assert merged[("inception", 1, "eager", "fp32")]["ms"] != old_eager["ms"]
    # without --merge the results are replaced
    suite.main([*TINY, "--batch", "4", "--systems", "eager", "--out", str(tmp_path)])
    data, replaced = _rows(tmp_path)
    assert len(data["invocations"]) == 1 and set(replaced) == {("inception", 4, "eager", "fp32")}


def test_a_failing_system_is_recorded_and_the_suite_goes_on(tmp_path, monkeypatch):
    def broken(case, precision):
        raise RuntimeError("session creation failed: out of memory")

    monkeypatch.setitem(suite.RUNNERS, "ort", broken)
    suite.main([*TINY, "--systems", "ort", "eager", "--out", str(tmp_path)])
    _, rows = _rows(tmp_path)
    failed = rows[("inception", 1, "ort", "fp32")]
    assert failed["status"] == "error" and failed["error"] == "RuntimeError: session creation failed: out of memory"
    assert "broken" in failed["traceback"] and "ms" not in failed
    assert rows[("inception", 1, "eager", "fp32")]["status"] == "ok"
    assert "failed: RuntimeError: session creation failed" in (tmp_path / suite.RESULTS_MD).read_text()


def test_report_regenerates_markdown_and_plot(tmp_path):
    suite.main([*TINY, "--systems", "eager", "--out", str(tmp_path)])
    (tmp_path / suite.RESULTS_MD).unlink()
    (tmp_path / suite.RESULTS_PNG).unlink()
    suite.main(["report", str(tmp_path)])
    assert "## inception" in (tmp_path / suite.RESULTS_MD).read_text()
    assert (tmp_path / suite.RESULTS_PNG).read_bytes().startswith(b"\x89PNG")


def test_combinations_that_cannot_run_are_skipped_not_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(suite, "cpu_native_precisions", lambda: ())
    suite.main(
        [
            *TINY,
            "--systems",
            "eager+graph",
            "eager",
            "--precision",
            "fp16",
            "--precision",
            "fp32",
            "--out",
            str(tmp_path),
        ]
    )
    _, rows = _rows(tmp_path)
    assert set(rows) == {("inception", 1, "eager", "fp32")}
    cpu = suite.torch.device("cpu")
    assert suite.not_applicable("eager", "fp16", cpu) == "fp16 runs on CUDA only"
    assert suite.not_applicable("eager", "bf16", cpu) == "this CPU has no bf16 dot products"
    monkeypatch.setattr(suite, "cpu_native_precisions", lambda: ("bf16",))
    assert suite.not_applicable("tensorforge", "bf16", cpu) is suite.not_applicable("compile", "bf16", cpu) is None
    assert suite.not_applicable("ort", "bf16", cpu) == "ONNX Runtime's CPU provider runs fp32 only"
    assert suite.not_applicable("eager+graph", "fp32", cpu) == "CUDA graphs need CUDA"
    assert suite.not_applicable("ort", "fp16", suite.torch.device("cuda")) is not None
    assert suite.not_applicable("tensorforge", "int8", cpu) is None
    assert "compute capability 8.9" in suite.not_applicable("tensorforge", "fp8", cpu)


def test_the_engines_measured_are_kept_and_load(tmp_path):
    """`--engines DIR` keeps each tensorforge engine the suite measured (for a profile of that very engine) and
    its build's timing cache."""
    suite.main([*TINY, "--systems", "tensorforge", "--engines", str(tmp_path / "engines"), "--out", str(tmp_path)])
    engine = suite.Engine.load(tmp_path / "engines" / "inception-b1-fp32.engine")
    assert engine.plans and engine.report.get("tuning") is not None
    timings = TimingCache.load(tmp_path / "engines" / "inception-b1-fp32.timing.json")  # its build's candidates
    assert len(timings) > 0


def test_a_build_starts_from_the_timing_cache_an_earlier_one_kept(tmp_path):
    """`--timing-caches DIR` seeds each build with the cache `--engines DIR` kept: the rebuild finds every layer's
    timings there (no candidate timed again), and the table says its build time is not a cold build's."""
    engines, again = tmp_path / "engines", tmp_path / "again"
    suite.main([*TINY, "--systems", "tensorforge", "--engines", str(engines), "--out", str(tmp_path / "first")])
    suite.main(
        [*TINY, "--systems", "tensorforge", "--timing-caches", str(engines), "--engines", str(again), "--out",
         str(again)]
    )  # fmt: skip
    _, rows = _rows(again)
    (row,) = rows.values()
    assert row["timing_cache_seeded"] and "(cached timings)" in (again / suite.RESULTS_MD).read_text()
    first = TimingCache.load(engines / "inception-b1-fp32.timing.json")
    report = suite.Engine.load(again / "inception-b1-fp32.engine").report["timing_cache"]
    assert len(first) > 0 and report["entries_before"] == len(first) == report["entries"]  # nothing new to time


def test_nothing_measured_writes_a_report_without_a_plot(tmp_path):
    suite.main([*TINY, "--systems", "eager+graph", "--out", str(tmp_path)])  # CUDA graphs: nothing on the CPU
    data, rows = _rows(tmp_path)
    assert rows == {} and (tmp_path / suite.RESULTS_MD).exists() and not (tmp_path / suite.RESULTS_PNG).exists()


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="unknown model"):
        suite.main(["--models", "resnet51", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="MODEL=SIZE"):
        suite.main([*TINY, "--size", "yolo=big", "--out", str(tmp_path)])


def test_interleaved_timing_runs_the_functions_in_rounds_and_keeps_errors_apart():
    log = []

    def timed(name, seconds):
        def fn():
            log.append(name)
            time.sleep(seconds)

        return fn

    fns = {"fast": timed("fast", 0.001), "slow": timed("slow", 0.004)}
    result = suite.interleaved_ms(fns, torch.device("cpu"), runs=7, warmup=2, block=3, seed=5, settle_s=0)
    assert 1 <= result["fast"] < result["slow"]
    # 2 warm-ups each, then rounds of 3, 3 and 1 timed calls, each after an untimed one, in the seeded order
    expected, order = ["fast", "fast", "slow", "slow"], random.Random(5)
    for timed_calls in (3, 3, 1):
        keys = ["fast", "slow"]
        order.shuffle(keys)
        expected += [name for name in keys for _ in range(1 + timed_calls)]
    assert log == expected

    def broken():
        if log.count("broken") == 3:  # survives the warm-up, fails in the first round
            raise RuntimeError("lost the device")
        log.append("broken")

    result = suite.interleaved_ms({"fast": fns["fast"], "broken": broken}, torch.device("cpu"), runs=4, warmup=2)
    assert isinstance(result["broken"], RuntimeError) and result["fast"] >= 1


def test_each_rounds_median_is_kept_and_systems_are_compared_round_by_round():
    """Per-round medians (3 rounds of 2 calls); a machine that slows down 4× after the first round moves both systems'
    medians, not the ratio of their rounds, which `paired_ratios` takes and the markdown reports."""
    speed = {"factor": 1.0}

    def timed(seconds):
        return lambda: time.sleep(seconds * speed["factor"])

    calls = {"ours": timed(0.002), "peer": timed(0.004)}
    rounds: dict = {}
    suite.interleaved_ms(calls, torch.device("cpu"), runs=2, warmup=1, block=2, settle_s=0, rounds=rounds)
    speed["factor"] = 4.0
    suite.interleaved_ms(calls, torch.device("cpu"), runs=4, warmup=0, block=2, settle_s=0, rounds=rounds)
    assert [len(rounds[key]) for key in calls] == [3, 3]
    rows = [
        {"model": "m", "batch": 1, "system": system, "precision": "fp32", "status": "ok", "round_ms": rounds[key]}
        for system, key in (("tensorforge", "ours"), ("ort", "peer"))
    ]
    ((ours, theirs, ratios),) = suite.paired_ratios(rows)
    assert (ours["system"], theirs["system"]) == ("tensorforge", "ort")
    assert all(0.3 < ratio < 0.7 for ratio in ratios)  # 2 ms against 4, then 8 against 16


def test_each_round_waits_for_the_systems_before_it_to_settle(monkeypatch):
    """Another runtime's spinning threads must not run into the next system's timed calls: a pause before each
    system's round (2 systems × 3 rounds)."""
    pauses = []
    monkeypatch.setattr(suite.time, "sleep", pauses.append)
    suite.interleaved_ms({"a": lambda: None, "b": lambda: None}, torch.device("cpu"), runs=6, warmup=1, block=2,
                         settle_s=0.25)  # fmt: skip
    assert pauses == [0.25] * 6


def test_interleaved_systems_are_measured_together_and_a_failing_one_recorded(tmp_path, monkeypatch):
    def broken(case, precision):
        raise RuntimeError("session creation failed")

    monkeypatch.setitem(suite.RUNNERS, "ort", broken)
    suite.main([*TINY, "--systems", "tensorforge", "eager", "ort", "--interleave", "--out", str(tmp_path)])
    _, rows = _rows(tmp_path)
    for system in ("tensorforge", "eager"):
        row = rows[("inception", 1, system, "fp32")]
        assert row["status"] == "ok" and row["interleaved"] and row["ms"] > 0 and 0 < row["error_vs_fp64"] < 1e-5
        assert len(row["round_ms"]) == 1  # 2 runs in rounds of up to 5 calls
    assert rows[("inception", 1, "ort", "fp32")]["error"] == "RuntimeError: session creation failed"
    assert "- batch 1, tensorforge fp32 / eager fp32: " in (tmp_path / suite.RESULTS_MD).read_text()


def test_interleaving_times_a_quantized_engine_in_the_rounds_of_the_float_systems(tmp_path, monkeypatch):
    """With `--interleave` every (system, precision) pair of a model and batch shares one set of rounds, so the
    int8 row drifts with the fp32 rows it is compared with; the int8 row says what its build restored to float."""
    keys = []
    timed = suite.interleaved_ms

    def spy(calls, *args, **kwargs):
        keys.append(sorted(calls))
        return timed(calls, *args, **kwargs)

    monkeypatch.setattr(suite, "interleaved_ms", spy)
    suite.main([*TINY, "--systems", "tensorforge", "eager", "--precision", "fp32", "--precision", "int8",
                "--interleave", "--out", str(tmp_path)])  # fmt: skip
    assert keys == [[("eager", "fp32"), ("tensorforge", "fp32"), ("tensorforge", "int8")]]
    _, rows = _rows(tmp_path)
    quantized = rows[("inception", 1, "tensorforge", "int8")]
    assert quantized["status"] == "ok" and quantized["interleaved"] and quantized["ms"] > 0
    if depthwise_pointwise.problem() is None and compiler_problem() is None:  # (the restore needs our CPU kernels)
        attempts = quantized["restored"].values()
        assert attempts and all(a["restored"] > 0 and a["plan_ms"]["fused"] > 0 for a in attempts)


def test_the_engine_runs_with_and_without_its_graphs_side_by_side(tmp_path):
    """`tensorforge-eager` is the same engine through a context that replays no graph: both rows compute the model
    (their errors against float64 are the same), and only the graph row says its graph was recorded."""
    suite.main([*TINY, "--batch", "1", "--systems", "tensorforge", "tensorforge-eager", "--interleave", "--out",
                str(tmp_path)])  # fmt: skip
    _, rows = _rows(tmp_path)
    graph, eager = rows[("inception", 1, "tensorforge", "fp32")], rows[("inception", 1, "tensorforge-eager", "fp32")]
    assert graph["status"] == eager["status"] == "ok" and graph["error_vs_fp64"] == eager["error_vs_fp64"]
    assert graph["cpu_graph"] == "captured" and "cpu_graph" not in eager
