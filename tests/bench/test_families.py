"""bench/families.py: one model built with and without tactic families, both engines timed in alternation."""

import json

import onnx

from bench import families
from tests.passes.test_squeeze_excite import _se_model


def test_the_compared_families_are_every_family_but_those_named():
    every = families._families([])
    assert {"cpu", "vendor", "gluon", "reference"} <= set(every)
    assert set(families._families(["cpu", "gluon"])) == set(every) - {"cpu", "gluon"}


def test_a_model_file_without_the_cpu_kernels(tmp_path, capsys):
    """A squeeze-and-excitation block: the default engine runs it with the C++ kernel (where a compiler is found),
    the compared one with torch's ops; the JSON names the model file only, not its directory, and lists the layers
    whose tactics differ."""
    (tmp_path / "models").mkdir()
    path = tmp_path / "models" / "block.onnx"
    onnx.save(_se_model(), path)
    out = tmp_path / "out"
    families.main(["--model", str(path), "--without", "cpu", "--runs", "3", "--device", "cpu", "--out", str(out)])
    result = json.loads((out / "families-block-b1.json").read_text())
    assert result["model"] == "block.onnx" and str(path.parent) not in json.dumps(result["argv"])
    assert "cpu" not in result["compared_families"] and set(result["medians_ms"]) == {"default", "compared"}
    assert "compared/default" in capsys.readouterr().out
    # the builds share their timings: only layers the CPU kernels ran may run otherwise in the compared engine
    assert all(d["default"].startswith("cpu.") for d in result["differing_layers"]), result["differing_layers"]
