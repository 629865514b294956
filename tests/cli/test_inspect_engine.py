"""`tensorforge inspect model.engine`: layers with their origins, tactics, outputs and arena slots, the build
report, JSON; and an engine built for another device is still inspectable."""

import dataclasses
import json

import onnx
import pytest
from typer.testing import CliRunner

from tensorforge import zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.cli.main import app
from tensorforge.errors import TensorforgeError
from tensorforge.runtime.engine import Engine
from tensorforge.runtime.environment import Environment

runner = CliRunner()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The inception block's ONNX file, an fp32 CPU engine of it and the engine's file."""
    folder = tmp_path_factory.mktemp("inspect")
    onnx.save(zoo.export("inception"), folder / "inception.onnx")
    engine = build_engine(folder / "inception.onnx", BuildConfig(effort=0))
    engine.save(folder / "inception.engine")
    return folder / "inception.onnx", engine, folder / "inception.engine"


def test_json_describes_every_layer_with_its_origins_tactic_outputs_and_arena_slot(built):
    _, engine, path = built
    result = runner.invoke(app, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    described = json.loads(result.output)
    assert described["runs_here"] == []
    assert described["inputs"] == [{"name": "input", "origin": "input", "dtype": "f32", "shape": [1, 64, 16, 16]}]
    (profile,) = described["profiles"]
    plan = engine.plans[0]
    assert [layer["node"] for layer in profile["layers"]] == [layer.node for layer in plan.layers]
    nodes = engine.model.graph.nodes
    for entry, layer in zip(profile["layers"], plan.layers, strict=True):
        node = nodes[layer.node]
        assert entry["origins"] == list(node.origins) and entry["tactic"] == layer.tactic
        assert (entry["precision"], entry["layout"], entry["median_ms"]) == (
            layer.precision,
            layer.layout,
            layer.median_ms,
        )
        for item, value in zip(entry["outputs"], node.outputs, strict=True):
            assert item["name"] == value.name and item["shape"] == list(value.shape) and item["stored_dtype"] == "f32"
            assert (item["arena_offset"], item["arena_bytes"], item["outside_bytes"]) == (
                plan.memory.offsets.get(value.name),
                plan.memory.sizes.get(value.name),
                plan.memory.outside.get(value.name),
            )
        timed = [c for c in layer.candidates if c.median_ms != float("inf")]
        if len(timed) > 1:
            assert entry["runner_up"]["tactic"] and entry["runner_up"]["median_ms"] > 0
            assert entry["runner_up"]["ratio"] == pytest.approx(entry["runner_up"]["median_ms"] / layer.median_ms)
    convs = [layer for layer in profile["layers"] if layer["op"] == "tensorforge::FusedConv"]
    unmerged = [layer for layer in convs if len(layer["origins"]) == 3]
    assert len(unmerged) == 3  # the pool projection and the 3x3 / 5x5 convolutions: Conv, BN, Relu each
    for layer in unmerged:
        assert [o.rsplit("/", 1)[-1] for o in layer["origins"]] == ["Conv", "BatchNormalization", "Relu"]
    merged = [layer for layer in convs if len(layer["origins"]) == 9]
    assert len(merged) == 1  # the three 1x1 convolutions reading the input, merged
    # no CPU kernel writes into given buffers yet: every layer output but the graph's is allocated by its kernel
    graph_outputs = {value.name for value in engine.model.graph.outputs}
    for entry in profile["layers"]:
        for item in entry["outputs"]:
            assert item["name"] in graph_outputs or item["outside_bytes"] > 0
    assert profile["memory"]["arena_bytes"] == plan.memory.arena_bytes
    report = described["report"]
    assert report["optimizer"]["fired"]["merge-parallel-conv"] == 1 and "build_seconds" in report


def test_text_shows_layers_fusion_and_the_build_report(built):
    _, _, path = built
    result = runner.invoke(app, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    for expected in (
        "engine built on",
        "/branch3/branch3.1/conv/Conv, /branch3/branch3.1/bn/BatchNormalization, /branch3/branch3.1/Relu",
        "tensorforge::FusedConv",
        "(= /branch3/branch3.1/Relu_output_0)",
        "f32[1, 32, 16, 16]",
        "allocated by its kernel",
        "graph: 20 -> 7 nodes",
        "memory plan:",
        "whole plans timed at opt",
        "built in",
    ):
        assert expected in result.output, expected


def test_candidates_lists_every_timed_candidate_of_the_named_layers(built):
    _, engine, path = built
    plan = engine.plans[0]
    layer = next(layer for layer in plan.layers if len(layer.candidates) > 1)
    name = engine.model.graph.nodes[layer.node].name
    result = runner.invoke(app, ["inspect", str(path), "--candidates", name, "--json"])
    assert result.exit_code == 0, result.output
    (found,) = [entry for entry in json.loads(result.output) if entry["layer"] == name]
    assert len(found["candidates"]) == len(layer.candidates)
    assert found["chosen"] == {"tactic": layer.tactic, "config": layer.config}
    times = [c["median_ms"] for c in found["candidates"] if c["median_ms"] is not None]
    assert times == sorted(times) and found["candidates"][0]["ratio"] == 1.0
    text = runner.invoke(app, ["inspect", str(path), "--candidates", name])
    assert text.exit_code == 0 and f"* {layer.tactic}" in text.output
    missing = runner.invoke(app, ["inspect", str(path), "--candidates", "no such layer"])
    assert missing.exit_code == 0 and "no layer's name contains 'no such layer'" in missing.output


def test_an_engine_built_for_a_gpu_is_inspectable_here(built, tmp_path):
    _, engine, _ = built
    h200 = dataclasses.replace(
        engine.environment, device_type="cuda", device_name="NVIDIA H200", compute_capability=(9, 0)
    )
    config = dataclasses.replace(engine.config, device="cuda")
    path = tmp_path / "gpu.engine"
    Engine(engine.model, config, engine.plans, h200, engine.report, device="cuda").save(path)
    if not _is_h200():
        with pytest.raises(TensorforgeError):  # it cannot be loaded to run here...
            Engine.load(path)
    result = runner.invoke(app, ["inspect", str(path)])  # ...but it can be inspected
    assert result.exit_code == 0, result.output
    assert "engine built on NVIDIA H200 (sm_90)" in result.output and "tensorforge::FusedConv" in result.output
    if not _is_h200():
        assert "cannot run on this machine" in result.output


def _is_h200() -> bool:
    try:
        return Environment.current("cuda").device_name == "NVIDIA H200"
    except Exception:
        return False


def test_bad_engine_files_and_options_fail_with_a_message(built, tmp_path):
    _, _, path = built
    result = runner.invoke(app, ["inspect", str(path), "--optimize"])
    assert result.exit_code == 1 and "--optimize is for ONNX models" in result.output
    onnx_path = built[0]
    result = runner.invoke(app, ["inspect", str(onnx_path), "--candidates", "conv"])
    assert result.exit_code == 1 and "--candidates is for engines" in result.output
    truncated = tmp_path / "short.engine"
    truncated.write_bytes(path.read_bytes()[:-100])
    result = runner.invoke(app, ["inspect", str(truncated)])
    assert result.exit_code == 1 and "truncated" in result.output and "Traceback" not in result.output
