"""bench/families.py: one model built with and without tactic families, both engines timed in alternation."""

import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from bench import families
from tensorforge.kernels.cpu import depthwise_pointwise
from tensorforge.kernels.cpu.extension import compiler_problem
from tests.helpers import make_model, tensor_info
from tests.passes.test_squeeze_excite import _se_model

_FUSION_PROBLEM = compiler_problem() or depthwise_pointwise.problem()


def _classifier() -> onnx.ModelProto:
    """A network's head: global average pool, flatten, a product with bias and ReLU, then another."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 96)).astype(np.float32) / 8, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((96, 40)).astype(np.float32) / 10, "w2")
    b1 = numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "b1")
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w1", "b1"], ["g"]),
        helper.make_node("Relu", ["g"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    return make_model(nodes, [tensor_info("x", [1, 64, 4, 4])], [tensor_info("y", None)], 17, [w1, w2, b1])


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
    result = json.loads((out / "families-block-b1-without-cpu.json").read_text())
    assert result["model"] == "block.onnx" and str(path.parent) not in json.dumps(result["argv"])
    assert "cpu" not in result["compared_families"] and set(result["medians_ms"]) == {"default", "compared"}
    assert "compared/default" in capsys.readouterr().out
    # the builds share their timings: only layers the CPU kernels ran may run otherwise in the compared engine
    assert all(d["default"].startswith("cpu.") for d in result["differing_layers"]), result["differing_layers"]


@pytest.mark.skipif(_FUSION_PROBLEM is not None, reason=str(_FUSION_PROBLEM))
def test_the_depthwise_pointwise_fusion_can_be_compared_alone(tmp_path):
    """--unfused: the compared engine is built with the builder's depthwise + 1×1 fusion off (the same families)."""
    from tests.passes.test_cpu_blocks import _block

    path = tmp_path / "block.onnx"
    onnx.save(_block(), path)
    families.main(["--model", str(path), "--unfused", "--runs", "3", "--device", "cpu", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "families-block-b1-unfused.json").read_text())
    assert result["compared_unfused"] and "cpu" in result["compared_families"]
    assert result["tactics_in_one_engine_only"] and "cpu.depthwise-pointwise" in result["tactics_in_one_engine_only"]


@pytest.mark.skipif(_FUSION_PROBLEM is not None, reason=str(_FUSION_PROBLEM))
def test_one_tactic_can_be_left_out(tmp_path):
    """--without cpu.gemm: the compared engine has every family, and the classifier's product runs another tactic."""
    path = tmp_path / "head.onnx"
    onnx.save(_classifier(), path)
    families.main(["--model", str(path), "--without", "cpu.gemm", "--runs", "3", "--device", "cpu", "--out",
                   str(tmp_path)])  # fmt: skip
    result = json.loads((tmp_path / "families-head-b1-without-cpu.gemm.json").read_text())
    assert "cpu" in result["compared_families"] and result["compared_without_tactics"] == ["cpu.gemm"]
    assert "cpu.gemm" not in result["compared_tactics"] and result["compared_tactics"]


@pytest.mark.skipif(_FUSION_PROBLEM is not None, reason=str(_FUSION_PROBLEM))
def test_one_block_fusion_can_be_left_out(tmp_path):
    """--unfused pooled-gemm: the compared engine keeps the head's pool, flattening and product apart."""
    path = tmp_path / "head.onnx"
    onnx.save(_classifier(), path)
    families.main(["--model", str(path), "--unfused", "pooled-gemm", "--runs", "3", "--device", "cpu", "--out",
                   str(tmp_path)])  # fmt: skip
    result = json.loads((tmp_path / "families-head-b1-unfused-pooled-gemm.json").read_text())
    assert result["compared_unfused"] == ["pooled-gemm"]
    assert "cpu.pooled-gemm" not in result["compared_tactics"]


def test_something_to_compare_must_be_named():
    with pytest.raises(SystemExit):
        families.main(["--model", "mobilenetv3"])
