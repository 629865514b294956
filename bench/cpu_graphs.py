"""What CPU graphs buy an engine: one engine, a context that replays recorded CPU graphs and one that runs every
layer from Python (`cpu_graphs=False`), timed together in the suite's interleaved rounds (`suite.interleaved_ms`: on
these shared machines only figures taken side by side mean anything), medians of each. Zoo models are exported as
the suite exports them, with a dynamic batch, so a model whose reshapes read shapes computed at run time is measured
as users run it.

    python bench/cpu_graphs.py --models vit_s16 bert_base --runs 30 --out DIR   (writes DIR/cpu-graphs.json)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import suite
from tensorforge import zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.frontend import import_model


def compare(name: str, size: int, runs: int, warmup: int) -> dict:
    """Build `name` at `size` (batch 1, dynamic batch axis) and time its two contexts in interleaved rounds."""
    engine = build_engine(import_model(zoo.export(name, size=size)), BuildConfig(device="cpu", effort=0))
    graphs, eager = engine.create_context(), engine.create_context(cpu_graphs=False)
    feeds = zoo.example_inputs(name, 1, size)
    calls = {"graphs": lambda: graphs.run(feeds), "eager": lambda: eager.run(feeds)}
    ms = suite.interleaved_ms(calls, engine.device, runs, warmup)
    for error in (value for value in ms.values() if isinstance(value, Exception)):
        raise error
    refused = "; ".join(graphs.eager_shapes.values())
    return {"model": name, "size": size, "ms": ms, "graphs_over_eager": ms["graphs"] / ms["eager"],
            "replayed": not refused, "refused": refused}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["vit_s16", "bert_base"], choices=sorted(zoo.MODELS))
    parser.add_argument("--size", type=int, help="image side / sequence length (default: the suite's)")
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each context")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for name in args.models:
        size = args.size or suite.BENCH_SIZES.get(name, zoo.MODELS[name].default_size)
        row = compare(name, size, args.runs, args.warmup)
        rows.append(row)
        status = "replayed" if row["replayed"] else f"not replayed ({row['refused']})"
        print(f"{name} ({size}): CPU graphs {row['ms']['graphs']:.3f} ms, eager {row['ms']['eager']:.3f} ms, "
              f"{row['graphs_over_eager']:.3f}× ({status})")  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cpu-graphs.json").write_text(json.dumps({"invocation": sys.argv, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
