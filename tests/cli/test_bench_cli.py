"""`tensorforge bench`: an engine, an ONNX model built on the way or run on the executor, and bad options."""

import json

import numpy as np
import onnx
import pytest
from onnx import helper
from typer.testing import CliRunner

from tensorforge import zoo
from tensorforge.cli.main import app
from tests.helpers import make_model, tensor_info

runner = CliRunner()
QUICK = ["--warmup", "0.02", "--duration", "0.2"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    model, engine = folder / "inception.onnx", folder / "inception.engine"
    onnx.save(zoo.export("inception"), model)
    profile = "input=1x64x16x16:2x64x16x16:4x64x16x16"
    result = runner.invoke(app, ["build", str(model), "-o", str(engine), "--effort", "0", "--profile", profile])
    assert result.exit_code == 0, result.output
    tiny = folder / "relu.onnx"
    node = helper.make_node("Relu", ["x"], ["y"])
    onnx.save(make_model([node], [tensor_info("x", ["N", 8])], [tensor_info("y", ["N", 8])]), tiny)
    return model, engine, tiny


def test_engine_table(files):
    _, engine, _ = files
    result = runner.invoke(app, ["bench", str(engine), *QUICK])
    assert result.exit_code == 0, result.output
    for expected in ("engine (CPU graphs) on cpu", "batch 2", "inferences/s", "samples/s", "latency", "median", "p99"):
        assert expected in result.output


def test_engine_json_with_batch_and_streams(files):
    _, engine, _ = files
    result = runner.invoke(app, ["bench", str(engine), *QUICK, "--batch", "4", "--streams", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["model"] == str(engine) and data["built"] is False and data["runner"] == "engine"
    assert data["batch"] == 4 and data["streams"] == 2 and data["shapes"] == {"input": [4, 64, 16, 16]}
    assert data["iterations"] >= 2 and data["wall_s"] >= 0.2
    throughput = data["throughput"]
    assert throughput["inferences_per_s"] == pytest.approx(data["iterations"] / data["wall_s"])
    assert throughput["samples_per_s"] == pytest.approx(4 * throughput["inferences_per_s"])
    latency = data["latency_ms"]
    assert 0 < latency["min"] <= latency["median"] <= latency["p90"] <= latency["p99"]
    assert data["h2d_ms"] is None and data["d2h_ms"] is None  # no copies on the CPU


def test_input_file_and_batch_must_agree(files, tmp_path):
    _, engine, _ = files
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(1).standard_normal((3, 64, 16, 16)).astype(np.float32))
    result = runner.invoke(app, ["bench", str(engine), *QUICK, "--input", f"input={path}", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["batch"] == 3
    clash = runner.invoke(app, ["bench", str(engine), *QUICK, "--input", f"input={path}", "--batch", "2"])
    assert clash.exit_code == 1 and "has shape [3, 64, 16, 16], but the run is for [2, 64, 16, 16]" in clash.output


def test_onnx_model_is_built_first_and_says_so(files):
    _, _, tiny = files
    result = runner.invoke(app, ["bench", str(tiny), *QUICK, "--batch", "8", "--json"])
    assert result.exit_code == 0, result.output
    assert "building an engine for cpu with default settings at x [8, 8]" in result.stderr
    data = json.loads(result.stdout)
    assert data["built"] is True and data["runner"] == "engine" and data["batch"] == 8


def test_executor(files):
    model, _, _ = files
    result = runner.invoke(app, ["bench", str(model), *QUICK, "--executor", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["runner"] == "executor" and data["built"] is False and data["iterations"] >= 1


def test_onnxruntime_beside_the_executor(files):
    _, _, tiny = files
    result = runner.invoke(app, ["bench", str(tiny), *QUICK, "--executor", "--peer", "ort"])
    assert result.exit_code == 0, result.output
    assert any(line.split()[:2] == ["tensorforge", "executor"] for line in result.stdout.splitlines())


def test_bad_options_fail_with_a_message(files, tmp_path):
    model, engine, tiny = files
    cases = [
        ([str(engine), "--batch", "8"], "--batch 8: no optimization profile"),
        ([str(engine), "--executor"], "--executor times the reference executor on an ONNX model"),
        ([str(engine), "--cuda-graph"], "CUDA graphs need an engine built for CUDA"),
        ([str(model), "--executor", "--cuda-graph"], "--cuda-graph is for engines"),
        ([str(model), "--executor", "--cpu-graph"], "--cpu-graph is for engines"),
        ([str(engine), "--duration", "0"], "duration must be"),
        ([str(engine), "--warmup", "-1"], "warm-up must be"),
        ([str(engine), "--shape", "image=1x2"], "has no input 'image'"),
        ([str(tmp_path / "missing.onnx")], "does not exist"),
        ([str(tiny), "--shape", "x=2", "--executor"], "bad inputs"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["bench", args[0], "--warmup", "0", "--duration", "0.05", *args[1:]])
        assert result.exit_code == 1 and message in result.output, (args, result.output)
        assert "Traceback" not in result.output
    usage = runner.invoke(app, ["bench", str(engine), "--streams", "0"])
    assert usage.exit_code == 2 and "streams" in usage.output


def test_onnxruntime_beside_a_model_built_on_the_way(files):
    _, _, tiny = files
    result = runner.invoke(app, ["bench", str(tiny), *QUICK, "--batch", "4", "--peer", "ort"])
    assert result.exit_code == 0, result.output
    assert "timing ONNX Runtime on CPUExecutionProvider" in result.stderr
    lines = result.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if "side by side" in line) :]
    assert any(line.split()[:2] == ["tensorforge", "engine"] for line in table)
    assert any(line.split()[:3] == ["ONNX", "Runtime", "CPU"] for line in table)
    as_json = runner.invoke(app, ["bench", str(tiny), *QUICK, "--peer", "ort:cpu", "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    (peer,) = data["peers"]
    assert peer["peer"] == "ort:cpu" and peer["provider"] == "CPUExecutionProvider" and peer["note"] is None
    assert peer["runner"] == "onnxruntime" and peer["device"] == "cpu" and peer["iterations"] >= 1
    assert peer["shapes"] == data["shapes"]
    speedup = peer["speedup"]
    assert speedup["median_latency"] == pytest.approx(peer["latency_ms"]["median"] / data["latency_ms"]["median"])
    assert speedup["throughput"] == pytest.approx(
        data["throughput"]["samples_per_s"] / peer["throughput"]["samples_per_s"]
    )


def test_onnxruntime_beside_an_engine_needs_its_model(files):
    model, engine, tiny = files
    result = runner.invoke(app, ["bench", str(engine), *QUICK, "--peer", "ort", "--onnx", str(model), "--json"])
    assert result.exit_code == 0, result.output
    (peer,) = json.loads(result.stdout)["peers"]
    assert peer["batch"] == 2 and peer["shapes"] == {"input": [2, 64, 16, 16]}
    cases = [
        ([str(engine), "--peer", "ort"], "--peer on an engine file needs the ONNX model it was built from"),
        ([str(engine), "--peer", "ort", "--onnx", str(tiny)], "is it the model the engine was built from?"),
        ([str(tiny), "--peer", "trt"], "unknown peer 'trt'"),
        ([str(tiny), "--peer", "ort", "--onnx", str(model)], "--onnx names the model of an engine file"),
        ([str(tiny), "--peer", "ort:"], "names no provider after the colon"),
        ([str(tiny), "--peer", "ort:NoSuchExecutionProvider"], "has no NoSuchExecutionProvider (it has"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["bench", args[0], "--warmup", "0", "--duration", "0.05", *args[1:]])
        assert result.exit_code == 1 and message in result.output, (args, result.output)
        assert "Traceback" not in result.output
