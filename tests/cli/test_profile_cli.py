"""`tensorforge profile`: the sorted table, the trace and chart files, and clear refusals."""

import json

import onnx
import pytest
from typer.testing import CliRunner

from tensorforge import zoo
from tensorforge.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("profile")
    model, engine = folder / "inception.onnx", folder / "inception.engine"
    onnx.save(zoo.export("inception"), model)
    result = runner.invoke(app, ["build", str(model), "-o", str(engine), "--effort", "0"])
    assert result.exit_code == 0, result.output
    return model, engine


def test_table_is_sorted_with_shares_and_files_are_written(files, tmp_path):
    _, engine = files
    trace, plot = tmp_path / "trace.json", tmp_path / "layers.png"
    args = ["profile", str(engine), "--runs", "3", "--warmup", "1", "--trace", str(trace), "--plot", str(plot)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    for expected in ("share", "cumulative", "MaxPool", "sum of 7 layer medians", "CPU graph", f"wrote {trace}"):
        assert expected in result.output
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 7
    assert plot.read_bytes()[:4] == b"\x89PNG"
    again = runner.invoke(app, args)
    assert again.exit_code == 1 and "already exist" in again.output and "--force" in again.output
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0


def test_json_is_sorted_by_schedule_and_top_limits_the_table(files):
    _, engine = files
    result = runner.invoke(app, ["profile", str(engine), "--runs", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [layer["position"] for layer in data["layers"]] == list(range(7))
    assert sum(layer["share"] for layer in data["layers"]) == pytest.approx(1.0)
    top = runner.invoke(app, ["profile", str(engine), "--runs", "2", "--top", "2"])
    assert top.exit_code == 0 and "and 5 more layer(s)" in top.output
    rows = [line for line in top.output.splitlines() if "fp32" in line]
    times = [float(line.split()[-3]) for line in rows]
    assert len(rows) == 2 and times == sorted(times, reverse=True)


def test_bad_input_fails_with_a_message(files, tmp_path):
    model, engine = files
    cases = [
        ([str(model)], "not an engine file"),
        ([str(tmp_path / "missing.engine")], "does not exist"),
        ([str(engine), "--shape", "input=9x64x16x16"], "no optimization profile"),
        ([str(engine), "--input", f"input={tmp_path / 'none.npy'}"], "does not exist"),
        ([str(engine), "--plot", str(tmp_path / "no" / "such" / "dir.png")], "cannot write"),
        ([str(engine), "--device", "tpu"], "unknown device"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["profile", *args, "--runs", "1"])
        assert result.exit_code == 1 and message in result.output, (args, result.output)
        assert "Traceback" not in result.output
