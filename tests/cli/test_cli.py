import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from typer.testing import CliRunner

from tensorforge.cli.main import app
from tensorforge.passes import pipeline
from tests.helpers import make_model, tensor_info
from tests.passes.support import DropNegPass

runner = CliRunner()


@pytest.fixture
def model_path(tmp_path):
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["out:0"])]
    model = make_model(
        nodes, [tensor_info("x", ["batch", 4])], [tensor_info("out:0", ["batch", 3])], initializers=[weight]
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path


def test_inspect_json(model_path):
    result = runner.invoke(app, ["inspect", str(model_path), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["inputs"] == [{"name": "x", "dtype": "f32", "shape": ["batch", 4], "text": "[batch, 4]"}]
    assert summary["ops"] == {"MatMul": 1, "Relu": 1}
    assert summary["parameters"] == 12
    assert summary["opsets"] == {"ai.onnx": 17}
    assert summary["unsupported"] == []


def test_inspect_text_lists_unsupported_ops(tmp_path):
    nodes = [helper.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="com.example")]
    graph = helper.make_graph(nodes, "g", [tensor_info("x", [2])], [tensor_info("y", [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 2)])
    path = tmp_path / "u.onnx"
    onnx.save(model, path)
    result = runner.invoke(app, ["inspect", str(path)])
    assert result.exit_code == 0
    assert "com.example::Frobnicate (opset 2) not supported" in result.output


def test_run_writes_outputs_and_refuses_to_overwrite(model_path, tmp_path):
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "out"
    args = [
        "run",
        str(model_path),
        "--input",
        f"x={tmp_path / 'x.npy'}",
        "--output-dir",
        str(out_dir),
        "--device",
        "cpu",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    written = np.load(out_dir / "out_0.npy")
    weight = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    np.testing.assert_allclose(written, np.maximum(x @ weight, 0), rtol=1e-6)
    assert "median" in result.output
    again = runner.invoke(app, args)
    assert again.exit_code == 1
    assert "already exist" in again.output and "--force" in again.output
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0


def test_run_random_inputs_need_a_shape_for_dynamic_dims(model_path):
    result = runner.invoke(app, ["run", str(model_path)])
    assert result.exit_code == 1
    assert "--shape x=" in result.output
    ok = runner.invoke(app, ["run", str(model_path), "--shape", "x=3x4", "--device", "cpu"])
    assert ok.exit_code == 0, ok.output
    assert "[3, 3]" in ok.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input", "nope=a.npy"], "has no input 'nope'"),
        (["--input", "x"], "NAME=VALUE"),
        (["--shape", "x=3xq"], "cannot read shape"),
        (["--input", "x=/does/not/exist.npy"], "does not exist"),
        (["--device", "tpu"], "unknown device"),
    ],
)
def test_run_bad_options_exit_nonzero_with_a_message(model_path, args, message):
    result = runner.invoke(app, ["run", str(model_path), *args])
    assert result.exit_code == 1
    assert message in result.output


def test_commands_fail_cleanly_on_a_non_onnx_file(tmp_path):
    path = tmp_path / "x.onnx"
    path.write_text("hello")
    for command in ("inspect", "run"):
        result = runner.invoke(app, [command, str(path)])
        assert result.exit_code == 1
        assert "not" in result.output and "Traceback" not in result.output


@pytest.fixture
def neg_model_path(tmp_path, monkeypatch):
    """Neg pairs: one removable (n1, n2), one whose outer Neg writes the graph output from the input (n4)."""
    monkeypatch.setattr(pipeline, "default_passes", lambda: [DropNegPass()])
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="n1"),
        helper.make_node("Neg", ["a"], ["b"], name="n2"),
        helper.make_node("Relu", ["b"], ["y"], name="relu"),
        helper.make_node("Neg", ["x"], ["c"], name="n3"),
        helper.make_node("Neg", ["c"], ["z"], name="n4"),
    ]
    model = make_model(nodes, [tensor_info("x", [4])], [tensor_info("y", [4]), tensor_info("z", [4])])
    path = tmp_path / "neg.onnx"
    onnx.save(model, path)
    return path


def test_inspect_optimize_says_what_fired_where_and_what_declined(neg_model_path):
    result = runner.invoke(app, ["inspect", str(neg_model_path), "--optimize"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "optimization: 5 -> 3 nodes" in text
    assert "drop-neg: -2 nodes" in text
    assert "double-neg: 1x at n2" in text
    assert "declined:" in text and "'z' is a graph output" in text and "(1x at n4)" in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.split()[:1] in (["Neg"], ["Relu"])}
    assert rows == {"Neg": ["4", "2"], "Relu": ["1", "1"]}  # op, before, after


def test_inspect_optimize_json_has_the_report(neg_model_path):
    result = runner.invoke(app, ["inspect", str(neg_model_path), "--optimize", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["ops"] == {"Neg": 4, "Relu": 1}  # the summary describes the model as loaded
    report = summary["optimization"]
    assert (report["nodes_before"], report["nodes_after"]) == (5, 3)
    assert report["ops_after"] == {"Neg": 2, "Relu": 1}
    fired = [e for e in report["events"] if e["status"] == "fired"]
    assert [(e["pass_name"], e["rule"], e["node"]) for e in fired] == [("drop-neg", "double-neg", "n2")]
    assert report["passes"][0]["name"] == "drop-neg"


def test_inspect_optimize_with_the_default_pipeline(tmp_path):
    from tensorforge import zoo

    path = tmp_path / "inception.onnx"
    onnx.save(zoo.export("inception", size=8), path)
    result = runner.invoke(app, ["inspect", str(path), "--optimize", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)["optimization"]
    assert report["nodes_before"] == 20
    assert report["nodes_after"] <= report["nodes_before"]
    assert not [e for e in report["events"] if e["status"] == "failed"]
    text = runner.invoke(app, ["inspect", str(path), "--optimize"]).output
    assert f"optimization: 20 -> {report['nodes_after']} nodes" in text


def test_run_optimized_graph_gives_the_same_outputs(model_path, tmp_path):
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.save(tmp_path / "x.npy", x)
    outputs = {}
    for flag in ([], ["--optimize"]):
        out_dir = tmp_path / ("opt" if flag else "plain")
        args = ["run", str(model_path), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(out_dir), *flag]
        result = runner.invoke(app, [*args, "--device", "cpu"])
        assert result.exit_code == 0, result.output
        outputs[bool(flag)] = np.load(out_dir / "out_0.npy")
    assert "optimized: 2 -> 1 nodes" in result.output
    np.testing.assert_allclose(outputs[True], outputs[False], rtol=1e-6)
