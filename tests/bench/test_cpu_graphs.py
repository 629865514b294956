"""bench/cpu_graphs.py: a dynamic-batch transformer's engine replays, and both contexts are timed and written."""

import json

from bench import cpu_graphs


def test_both_contexts_are_timed_and_the_replay_is_reported(tmp_path):
    cpu_graphs.main(["--models", "transformer", "--runs", "2", "--warmup", "1", "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "cpu-graphs.json").read_text())["rows"]
    assert row["model"] == "transformer" and row["replayed"] and not row["refused"]
    assert row["ms"]["graphs"] > 0 and row["ms"]["eager"] > 0
