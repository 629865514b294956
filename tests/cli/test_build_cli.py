"""`tensorforge build` and `tensorforge run` on an engine, in-process and as a fresh process."""

import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from typer.testing import CliRunner

from tensorforge import zoo
from tensorforge.cli.main import app
from tensorforge.runtime.engine import Engine

runner = CliRunner()


@pytest.fixture(scope="module")
def inception(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "inception.onnx"
    onnx.save(zoo.export("inception"), path)
    return path


def test_build_writes_an_engine_and_says_what_it_chose(inception, tmp_path):
    engine = tmp_path / "m.engine"
    cache = tmp_path / "timing.json"
    args = ["build", str(inception), "-o", str(engine), "--effort", "0", "--timing-cache", str(cache)]
    result = runner.invoke(app, [*args, "--profile", "input=1x64x16x16:2x64x16x16:4x64x16x16", "--verbose"])
    assert result.exit_code == 0, result.output
    for expected in ("FusedConv", "memory plan", "whole plans timed", "wrote", "100.0%", "profile 0: input [1, 64"):
        assert expected in result.output
    assert engine.exists() and cache.exists()
    again = runner.invoke(app, [*args])
    assert again.exit_code == 1 and "already exists" in again.output
    assert Engine.load(engine).config.precompile  # on by default; a CPU build has nothing to precompile
    off = runner.invoke(app, [*args, "--no-precompile", "--force"])
    assert off.exit_code == 0, off.output
    assert not Engine.load(engine).config.precompile


def test_run_an_engine_in_a_fresh_process(inception, tmp_path):
    """A fresh process has loaded nothing the build loaded; the engine must run from the file alone."""
    engine = tmp_path / "m.engine"
    assert runner.invoke(app, ["build", str(inception), "-o", str(engine), "--effort", "0"]).exit_code == 0
    x = np.random.default_rng(0).standard_normal((1, 64, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    command = [sys.executable, "-m", "tensorforge.cli.main", "run", str(engine), "-i", f"input={tmp_path / 'x.npy'}"]
    result = subprocess.run([*command, "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "engine" in result.stdout
    assert np.load(tmp_path / "out" / "output.npy").shape == (1, 96, 16, 16)


def test_bad_build_options_fail_with_a_message(inception, tmp_path):
    engine = str(tmp_path / "m.engine")
    cases = [
        (["--profile", "input=1x64x16x16:8x64x16x16:4x64x16x16"], "min <= opt <= max"),
        (["--profile", "image=1x3"], "not inputs of the model"),
        (["--shape", "input=1x64x16x16", "--profile", "input=1x64x16x16"], "not both"),
        (["--device", "tpu"], "unknown device"),
        (["--calib", "data/"], "go with --int8 or --fp8"),
        (["--int8"], "needs calibration data"),
        (["--int8", "--calib", "missing/"], "does not exist"),
        (["--int8", "--calib-method", "kl"], "unknown calibration method"),
        (["--int8", "--accuracy-target", "cosine"], "METRIC=VALUE"),
        (["--int8", "--fp8"], "one quantized precision"),
        (["--int8", "--chain", "sometimes"], "unknown chaining mode"),
        (["--sparsity", "on"], "sparsity must be one of"),
    ]
    for extra, message in cases:
        result = runner.invoke(app, ["build", str(inception), "-o", engine, "--effort", "0", *extra])
        assert result.exit_code == 1 and message in result.output, (extra, result.output)


def test_an_int8_build_calibrates_on_a_directory_and_reports_its_layers(inception, tmp_path):
    data = tmp_path / "calib"
    data.mkdir()
    rng = np.random.default_rng(0)
    for index in range(3):
        np.save(data / f"batch{index}.npy", rng.standard_normal((1, 64, 16, 16)).astype(np.float32))
    engine, cache = tmp_path / "m.engine", tmp_path / "calib.json"
    args = ["build", str(inception), "-o", str(engine), "--effort", "0", "--int8", "--calib", str(data)]
    result = runner.invoke(
        app, [*args, "--calib-method", "percentile", "--percentile", "99.9", "--calib-cache", str(cache)]
    )
    assert result.exit_code == 0, result.output
    assert "int8: 4 layers quantized, 0 float" in result.output, result.output
    assert cache.exists() and '"percentile"' in cache.read_text()
    inspected = runner.invoke(app, ["inspect", str(engine)])
    assert inspected.exit_code == 0 and "layers quantized" in inspected.output, inspected.output


def test_depthwise_inputs_quantize_per_channel_unless_told_otherwise(tmp_path):
    from tensorforge.frontend.torch_import import export_onnx
    from tests.quant.support import Separable

    torch.manual_seed(0)
    model = tmp_path / "separable.onnx"
    onnx.save(export_onnx(Separable(), torch.randn(2, 3, 8, 8)), model)
    data = tmp_path / "calib.npy"
    np.save(data, np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32))
    args = ["build", str(model), "--effort", "0", "--int8", "--calib", str(data), "--calib-method", "minmax"]
    result = runner.invoke(app, [*args, "-o", str(tmp_path / "a.engine")])
    assert result.exit_code == 0 and "depthwise convolution inputs quantized per channel: 1" in result.output
    result = runner.invoke(app, [*args, "-o", str(tmp_path / "b.engine"), "--depthwise-per-tensor"])
    assert result.exit_code == 0 and "per channel" not in result.output, result.output


def test_a_forced_sparse_build_says_what_it_pruned_and_inspect_repeats_it(inception, tmp_path):
    engine = tmp_path / "m.engine"
    result = runner.invoke(app, ["build", str(inception), "-o", str(engine), "--effort", "0", "--sparsity", "force"])
    assert result.exit_code == 0, result.output
    assert "weights pruned to 2:4 by magnitude" in result.output and "2:4 sparse weights:" in result.output
    inspected = runner.invoke(app, ["inspect", str(engine)])
    assert inspected.exit_code == 0 and "sparsity force" in inspected.output
    assert "2:4 sparse weights:" in inspected.output
