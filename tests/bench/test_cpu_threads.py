"""bench/cpu_threads.py: each form runs in its own process on an engine built in another, and reports its time."""

import json

from bench import cpu_threads


def test_every_form_reports_a_time(tmp_path):
    cpu_threads.main(["--model", "inception", "--size", "16", "--requests", "2", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "cpu-threads.json").read_text())["rows"]
    assert [row["form"] for row in rows] == list(cpu_threads.FORMS)
    assert all(row["ms_per_request"] > 0 for row in rows)
