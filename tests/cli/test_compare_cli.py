"""`tensorforge compare model.onnx model.engine`: passes on a correct engine, and on a deliberately wrong one
names exactly the layer whose weight was changed as the first to exceed the tolerance."""

import json

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from tensorforge import zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.cli.main import app
from tensorforge.runtime.engine import Engine

runner = CliRunner()
PERTURBED = "/branch3/branch3.1/conv/Conv"  # the 3x3 convolution of the inception block


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compare")
    onnx.save(zoo.export("inception"), folder / "inception.onnx")
    build_engine(folder / "inception.onnx", BuildConfig(effort=0)).save(folder / "inception.engine")
    return folder / "inception.onnx", folder / "inception.engine"


def _compare(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["compare", *map(str, args), "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.output)


def _perturbed(path, tmp_path, select) -> tuple[str, str]:
    """A copy of the engine in `path` with the weight of the layer `select(node)` picks scaled by 1.01;
    returns the new file and that layer's node name."""
    engine = Engine.load(path)
    (node,) = [n for n in engine.model.graph.nodes if select(n)]
    weight = node.inputs[1]
    weight.const = weight.const * 1.01
    engine.save(tmp_path / "wrong.engine")
    return str(tmp_path / "wrong.engine"), node.name


def test_a_correct_engine_passes_layer_by_layer(built):
    model, engine = built
    code, result = _compare(model, engine, "--layerwise")
    assert code == 0 and result["ok"] and result["first_exceeding"] is None
    tensors = result["tensors"]
    # Every output of the Split and of each unmerged layer has an original: 8 values of 7 layers.
    assert len(tensors) == 8 and sum(t["is_output"] for t in tensors) == 1
    for t in tensors:
        assert t["tolerance"] == 1e-4 and t["rel"] <= 1e-4 and t["cosine"] > 0.999999, t
    renamed = [t for t in tensors if t["name"] != t["original"]]
    assert len(renamed) >= 5  # fused values compared with the ONNX values they stand for
    code, outputs_only = _compare(model, engine)
    assert code == 0 and [t["name"] for t in outputs_only["tensors"]] == ["output"]
    # --rtol replaces the precision's tolerance, tighter too: float32 rounding then exceeds it.
    code, strict = _compare(model, engine, "--rtol", "1e-12")
    assert code == 1 and strict["tensors"][0]["tolerance"] == 1e-12 and strict["tensors"][0]["rel"] > 1e-12


def test_a_wrong_weight_is_blamed_on_its_layer(built, tmp_path):
    model, engine = built
    wrong, name = _perturbed(engine, tmp_path, lambda n: n.name == PERTURBED)
    code, result = _compare(model, wrong, "--layerwise")
    assert code == 1 and not result["ok"]
    first = result["first_exceeding"]
    assert first["node"] == name == PERTURBED and first["op"] == "tensorforge::FusedConv"
    assert first["origins"][0] == PERTURBED and result["unchecked_upstream"] == []
    before = [t for t in result["tensors"] if t["layer"] < first["position"]]
    assert before and not any(t["exceeds"] for t in before)
    output = next(t for t in result["tensors"] if t["is_output"])
    assert output["exceeds"] and output["rel"] > 1e-3
    # A loose enough tolerance accepts the change; the exit code follows the outputs.
    code, loose = _compare(model, wrong, "--layerwise", "--rtol", "0.5")
    assert code == 0 and loose["ok"] and all(t["tolerance"] == 0.5 for t in loose["tensors"])


def test_a_wrong_merged_layer_is_found_through_its_split(built, tmp_path):
    """The merged 1x1 convolutions have no ONNX counterpart (their Split's outputs do): the Split is the first
    layer seen to exceed, and the merged layer is named as what fed it unchecked."""
    model, engine = built
    wrong, name = _perturbed(engine, tmp_path, lambda n: n.op_type == "FusedConv" and len(n.origins) == 9)
    code, result = _compare(model, wrong, "--layerwise")
    assert code == 1
    assert result["first_exceeding"]["op"] == "Split"
    assert [layer["node"] for layer in result["unchecked_upstream"]] == [name]


def test_given_inputs_and_text_output(built, tmp_path):
    model, engine = built
    x = np.random.default_rng(3).standard_normal((1, 64, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = runner.invoke(
        app, ["compare", str(model), str(engine), "-i", f"input={tmp_path / 'x.npy'}", "--layerwise"]
    )
    assert result.exit_code == 0, result.output
    assert "/branch3/branch3.1/Relu_output_0" in result.output and "all 8 compared tensors" in result.output
    wrong, _ = _perturbed(engine, tmp_path, lambda n: n.name == PERTURBED)
    result = runner.invoke(app, ["compare", str(model), wrong, "--layerwise"])
    assert result.exit_code == 1
    assert f"] {PERTURBED} (tensorforge::FusedConv, from {PERTURBED}," in result.output
    assert "EXCEEDS" in result.output and "1 output(s) exceed the tolerance: output" in result.output


def test_bad_arguments_fail_with_a_message(built, tmp_path):
    model, engine = built
    other = tmp_path / "other.onnx"
    onnx.save(zoo.export("mobilenetv3"), other)
    cases = [
        ([str(model), str(model)], "not a tensorforge engine file"),
        ([str(tmp_path / "missing.onnx"), str(engine)], "does not exist"),
        ([str(model), str(engine), "--shape", "image=1x3"], "has no input 'image'"),
        ([str(model), str(engine), "--shape", "input=2x64x16x16"], "no optimization profile"),
        ([str(model), str(engine), "--rtol", "-1"], "non-negative"),
        ([str(other), str(engine)], "the model the engine was built from"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["compare", *args])
        assert result.exit_code == 1 and message in result.output, (args, result.output)
        assert "Traceback" not in result.output


@pytest.mark.gpu
def test_a_half_precision_cuda_engine_passes_within_its_precision(tmp_path):
    path = tmp_path / "inception.onnx"
    onnx.save(zoo.export("inception"), path)
    engine_path = tmp_path / "inception.engine"
    build_engine(path, BuildConfig(device="cuda", precisions=("fp32", "fp16"), effort=0)).save(engine_path)
    code, result = _compare(path, engine_path, "--layerwise")
    assert code == 0 and result["ok"], result
    for t in result["tensors"]:
        assert t["rel"] <= t["tolerance"] and t["tolerance"] in (1e-4, 5e-3)
