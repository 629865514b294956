"""bench/cpu_convs.py end to end on the CPU: a zoo model's 3×3 layers autotuned, every tactic's best time written."""

import json

from bench import cpu_convs


def test_every_tactic_is_timed_and_written(tmp_path):
    args = ["--model", "inception", "--size", "32", "--window", "3x3", "--threads", "1"]
    cpu_convs.main([*args, "--out", str(tmp_path)])
    result = json.loads((tmp_path / "cpu_convs.json").read_text())
    rows = result["runs"][0]["rows"]
    assert rows and all("3x3" in row["layer"] for row in rows)
    for row in rows:
        assert row["winner"] in row["tactics"] and not row["wrong"]
        assert all(t["ms"] > 0 for t in row["tactics"].values())
        assert "reference.registry" in row["tactics"]
    assert "| winner |" in (tmp_path / "cpu_convs.md").read_text()
