"""bench/cpu_epilogue.py end to end on the CPU: the 1×1 kernel with each activation, checked, timed, written as JSON
and markdown."""

import json

import pytest

from bench import cpu_epilogue
from tensorforge.kernels.cpu import pointwise as pw
from tensorforge.kernels.cpu.extension import compiler_problem

_PROBLEM = compiler_problem() or pw.problem()


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
def test_every_layer_and_activation_is_checked_timed_and_written(tmp_path):
    cpu_epilogue.main(["--runs", "1", "--rounds", "1", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {row["layer"] for row in rows} == set(cpu_epilogue.LAYERS)
    for row in rows:
        assert set(row["ms"]) == {"none", "Relu", "Gelu"} and all(ms > 0 for ms in row["ms"].values())
    assert "| vit ff1 | fp32 |" in (tmp_path / "results.md").read_text()
