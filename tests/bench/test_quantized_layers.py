"""bench/quantized_layers.py end to end on the CPU: two chain modes built, timed in alternation, written."""

import json

import pytest

from bench import quantized_layers
from tensorforge.build.builder import Builder

pytest.importorskip("onnxruntime")


def test_the_engines_are_built_timed_and_written(tmp_path, monkeypatch):
    # the quantized layers kept: a CPU build may return them all to float where its all-float plan times faster
    monkeypatch.setattr(Builder, "_restore_float_if_faster", lambda self, model, *args: (model, *args[-2:], None))
    args = ["--model", "inception", "--device", "cpu", "--chain", "off", "always", "--runs", "2", "--warmup", "1"]
    quantized_layers.main([*args, "--rounds", "1", "--out", str(tmp_path)])
    for chain in ("off", "always"):
        result = json.loads((tmp_path / f"quantized-layers-inception-b1-int8-{chain}.json").read_text())
        assert result["ms"] > 0 and result["rounds_ms"] and result["layers"]
        assert result["error_vs_fp64"] < 0.1  # int8 against float64, really computed
