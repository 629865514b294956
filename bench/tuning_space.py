"""Which candidates of the tuning space earn their place: wins and near-wins of every (tactic, config) over builds.

Reads timing caches (files, or folders of `*.timing.json` as `bench/suite.py --engines DIR` keeps them) and, for
every layer signature in them, ranks what was timed. A configuration that never wins nor comes within
`--within` of the winner on any layer is compile and timing time a build could skip at that effort.

    python bench/tuning_space.py OUT/engines [--within 0.05] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tensorforge.tactics.timing_cache import TimingCache


@dataclass
class Standing:
    """How one (tactic, config) fared over the layers that timed it."""

    timed: int = 0
    wins: int = 0
    near: int = 0  # within the tolerance of the layer's winner, wins included
    ratios: list[float] = field(default_factory=list)  # its time over the winner's, per layer

    def as_json(self) -> dict[str, float | int]:
        return {
            "timed": self.timed,
            "wins": self.wins,
            "near": self.near,
            "median_ratio": statistics.median(self.ratios) if self.ratios else math.inf,
        }


def cache_paths(paths: Sequence[Path]) -> list[Path]:
    """The timing cache files named, and those inside the folders named."""
    found = []
    for path in paths:
        found += sorted(path.glob("*.timing.json")) if path.is_dir() else [path]
    if not found:
        raise SystemExit(f"no timing caches in {', '.join(map(str, paths))}")
    return found


def standings(caches: Sequence[TimingCache], within: float) -> dict[tuple[str, str], Standing]:
    """(tactic, config as JSON) → its standing over every layer signature of `caches`."""
    table: dict[tuple[str, str], Standing] = {}
    for cache in caches:
        for key in cache.keys():
            timed = [(t, m) for t, m in cache.measurements(key) if m.error is None and math.isfinite(m.median_ms)]
            if not timed:
                continue
            best = timed[0][1].median_ms
            for tactic, measurement in timed:
                standing = table.setdefault((tactic, json.dumps(measurement.config, sort_keys=True)), Standing())
                ratio = measurement.median_ms / best if best > 0 else 1.0
                standing.timed += 1
                standing.wins += measurement.median_ms == best
                standing.near += ratio <= 1.0 + within
                standing.ratios.append(ratio)
    return table


def report(table: dict[tuple[str, str], Standing], within: float) -> str:
    """A markdown table, by tactic, the most useful configurations first, then the never-useful count."""
    lines = [
        f"| tactic | config | layers timed | wins | within {within:.0%} | median time / winner's |",
        "|---|---|---|---|---|---|",
    ]
    ranked = sorted(table.items(), key=lambda item: (item[0][0], -item[1].near, -item[1].wins))
    for (tactic, config), s in ranked:
        ratio = statistics.median(s.ratios)
        lines.append(f"| {tactic} | `{config}` | {s.timed} | {s.wins} | {s.near} | {ratio:.2f} |")
    useless = [name for name, s in table.items() if s.near == 0]
    lines.append("")
    lines.append(
        f"{len(useless)} of {len(table)} (tactic, config) pairs never won nor came within {within:.0%} of a winner."
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="timing cache files or folders of *.timing.json")
    parser.add_argument("--within", type=float, default=0.05, help="a near-win: at most this much slower (0.05)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the standings as JSON")
    args = parser.parse_args(argv)
    caches = [TimingCache.load(path) for path in cache_paths(args.paths)]
    table = standings(caches, args.within)
    print(report(table, args.within))
    if args.json:
        rows = [{"tactic": t, "config": json.loads(c), **s.as_json()} for (t, c), s in table.items()]
        args.json.write_text(json.dumps({"within": args.within, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
