"""bench/attention_cpu.py end to end on the CPU: our attention kernel beside the reference and torch's SDPA,
written as JSON and markdown."""

import json

import pytest

from bench import attention_cpu
from tensorforge.kernels.cpu import attention as at
from tensorforge.kernels.cpu.extension import compiler_problem

_PROBLEM = compiler_problem() or at.problem()


@pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
def test_the_three_are_timed_and_written(tmp_path):
    attention_cpu.main(["--models", "bert_base", "--batch", "1", "--runs", "2", "--rounds", "1", "--out",
                        str(tmp_path)])  # fmt: skip
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(row["model"], row["batch"]) for row in rows] == [("bert_base", 1)] * len(rows)
    assert rows[0]["precision"] == "fp32"
    for row in rows:
        assert all(ms > 0 for ms in row["ms"].values()) and set(row["ms"]) == {"reference", "torch sdpa", "ours"}
        assert row["error_vs_reference"] <= {"fp32": 1e-5, "bf16": 1e-2}[row["precision"]]
    assert "| bert_base | 1 | fp32 |" in (tmp_path / "results.md").read_text()
