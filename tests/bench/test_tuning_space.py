"""bench/tuning_space.py: wins and near-wins of every (tactic, config) over the timing caches of builds."""

import json

import pytest

from bench import tuning_space
from tensorforge.tactics.timing import Timing
from tensorforge.tactics.timing_cache import TimingCache


def _cache(times):
    """A cache of layers → {(tactic, tile): ms}; None for a candidate that failed."""
    cache = TimingCache()
    for key, candidates in times.items():
        for (tactic, tile), ms in candidates.items():
            timing = Timing.failed("no") if ms is None else Timing.from_samples([ms, ms])
            cache.record(key, tactic, {"tile": tile}, timing)
    return cache


def test_wins_near_wins_and_never_useful_configs(tmp_path, capsys):
    first = _cache({"conv-a": {("triton", 64): 1.0, ("triton", 128): 1.04, ("vendor", 0): 2.0, ("cuda", 8): None}})
    second = _cache({"conv-b": {("triton", 64): 3.0, ("triton", 128): 2.0, ("vendor", 0): 2.5}})
    first.save(tmp_path / "a-b1-fp16.timing.json")
    second.save(tmp_path / "b-b1-fp16.timing.json")
    tuning_space.main([str(tmp_path), "--within", "0.05", "--json", str(tmp_path / "standings.json")])
    rows = {
        (r["tactic"], r["config"]["tile"]): r for r in json.loads((tmp_path / "standings.json").read_text())["rows"]
    }
    assert rows[("triton", 64)] == {**rows[("triton", 64)], "timed": 2, "wins": 1, "near": 1, "median_ratio": 1.25}
    assert rows[("triton", 128)]["wins"] == 1 and rows[("triton", 128)]["near"] == 2
    assert rows[("vendor", 0)]["near"] == 0 and ("cuda", 8) not in rows  # failures are not standings
    assert "1 of 3 (tactic, config) pairs never won nor came within 5% of a winner." in capsys.readouterr().out


def test_no_caches_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no timing caches"):
        tuning_space.main([str(tmp_path)])
