"""bench/quantized_cpu.py end to end on the CPU: our int8 kernels beside oneDNN's on a 1×1 and a 3×3 shape,
written as JSON and markdown."""

import json

import pytest

from bench import quantized_cpu
from tensorforge.kernels.cpu import quantized_pointwise as qp
from tensorforge.kernels.cpu.extension import compiler_problem

_PROBLEM = compiler_problem() or qp.problem()


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
def test_both_kernels_are_timed_beside_onednn_and_written(tmp_path):
    quantized_cpu.main(["--layers", "layer4 conv1", "layer4 conv2", "--runs", "3", "--rounds", "1", "--out",
                        str(tmp_path)])  # fmt: skip
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [row["layer"] for row in rows] == ["resnet50 layer4 conv1", "resnet50 layer4 conv2"]
    for row in rows:
        assert row["ms"]["onednn"] > 0 and row["ms"][row["best"]] > 0 and row["best"].startswith("ours")
        assert row["max_steps_apart"] <= 1  # the same int8 outputs as oneDNN's, but for boundary roundings
    assert "| resnet50 layer4 conv2 |" in (tmp_path / "results.md").read_text()
