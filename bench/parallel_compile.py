"""Does building candidates in worker threads pay? The autotuner on a model's distinct convolution layers with
1 worker and with N, each run in a fresh process with empty Triton and NVRTC caches (so every kernel compiles),
every candidate of the space at `--effort` tried (`exhaustive`). Reports, per worker count, the wall time spent
building, compiling and checking candidates and the time spent timing them, and whether the winners agree.

    python bench/parallel_compile.py --model resnet50 --batch 1 --layers 6 --workers 1 --workers 8 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from conv_sweep import _inputs, describe, distinct_convs

from tensorforge.tactics.autotune import autotune


def tune_layers(args: argparse.Namespace, workers: int) -> dict:
    """The autotuner over the first `args.layers` distinct convs with `workers` threads (in this process)."""
    device = torch.device("cuda")
    nodes, opset = distinct_convs(args.model, args.batch, 224)
    rows, started = [], time.perf_counter()
    for node in nodes[: args.layers]:
        choice = autotune(
            node, opset, _inputs(node, device), device, effort=args.effort, precisions=("fp32", "fp16"),
            exhaustive=True, workers=workers,
        )  # fmt: skip
        rows.append({
            "layer": describe(node), "candidates": len(choice.candidates), "winner": choice.tactic,
            "winner_ms": choice.median_ms, "prepare_s": choice.prepare_s, "timing_s": choice.timing_s,
        })  # fmt: skip
    return {
        "workers": workers,
        "wall_s": time.perf_counter() - started,
        "prepare_s": sum(r["prepare_s"] for r in rows),
        "timing_s": sum(r["timing_s"] for r in rows),
        "layers": rows,
    }


def in_fresh_process(args: argparse.Namespace, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, TRITON_CACHE_DIR=f"{scratch}/triton", TENSORFORGE_CACHE=f"{scratch}/tensorforge")
        command = [sys.executable, __file__, "--child", str(workers), "--model", args.model]
        command += ["--batch", str(args.batch), "--layers", str(args.layers), "--effort", str(args.effort)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"workers": workers, "error": done.stderr[-3000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--effort", type=int, default=0)
    parser.add_argument("--workers", type=int, action="append", help="repeatable (default 1 and 8)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(tune_layers(args, args.child)))
        return
    results = []
    for workers in args.workers or [1, 8]:
        result = in_fresh_process(args, workers)
        results.append(result)
        shown = {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items() if k != "layers"}
        print(json.dumps(shown), flush=True)
    winners = {r["workers"]: [row["winner"] for row in r.get("layers", [])] for r in results}
    print("winners agree" if len({tuple(w) for w in winners.values()}) == 1 else f"winners differ: {winners}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "parallel_compile.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
