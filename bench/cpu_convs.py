"""Every distinct convolution layer of zoo models on the CPU: each CPU tactic's best time, layer by layer, one run.

For each model and batch size the model is exported, imported and optimized (as `conv_sweep.py` does for the GPU);
every distinct `FusedConv` is autotuned on the CPU over every tactic that takes it (oneDNN through torch, our
`cpu.*` kernels, the reference), every configuration, on the same random float32 input, and the best time of
each tactic is reported beside the winner — which shows what each kernel is worth where the engine would choose
(e.g. `cpu.winograd` against `cpu.conv` and oneDNN on the 3×3 layers). Every candidate is checked against the
reference by the autotuner before it is timed; wrong or failing ones are listed. JSON and markdown.

    python bench/cpu_convs.py --model resnet50 --batch 1 --threads 1 --threads 2 --out results/
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.conv_sweep import describe, distinct_convs
from tensorforge.ir import Node
from tensorforge.tactics.autotune import autotune

CPU = torch.device("cpu")


def _inputs(node: Node) -> list[torch.Tensor | None]:
    """Random float32 activations (the layer's non-constant inputs); constants come from the graph."""
    return [None if v is None or v.is_const else torch.randn(list(v.shape)) for v in node.inputs]


def time_layer(node: Node, opset: int, effort: int) -> dict:
    """The best time of each tactic on `node` (ms), the winner, and the candidates that were wrong or failed."""
    choice = autotune(node, opset, _inputs(node), CPU, effort=effort, precisions=("fp32",), exhaustive=True)
    best: dict[str, tuple[float, dict]] = {}
    wrong = []
    for c in choice.candidates:
        if not math.isfinite(c.median_ms):
            if c.note and not c.note.startswith("unsup"):
                wrong.append(f"{c.tactic} {c.config}: {c.note}")
            continue
        if c.tactic not in best or c.median_ms < best[c.tactic][0]:
            best[c.tactic] = (c.median_ms, {k: v for k, v in c.config.items() if k != "precision"})
    winner = min(best, key=lambda t: best[t][0]) if best else None
    return {
        "layer": describe(node),
        "tactics": {t: {"ms": ms, "config": config} for t, (ms, config) in best.items()},
        "winner": winner,
        "wrong": wrong,
    }


def markdown(results: dict) -> str:
    lines = [f"# CPU convolutions, layer by layer ({results['device']}, {results['date']}, torch {results['torch']})"]
    for run in results["runs"]:
        tactics = sorted({t for row in run["rows"] for t in row["tactics"]})
        lines += [
            "",
            f"## {run['model']}, batch {run['batch']}, {run['threads']} thread(s)",
            "",
            "| layer | " + " | ".join(tactics) + " | winner |",
            "|---" * (len(tactics) + 2) + "|",
        ]
        for row in run["rows"]:
            cells = [f"{row['tactics'][t]['ms']:.3f}" if t in row["tactics"] else "-" for t in tactics]
            lines.append(f"| {row['layer']} | " + " | ".join(cells) + f" | {row['winner']} |")
        wrong = [w for row in run["rows"] for w in row["wrong"]]
        if wrong:
            lines += ["", "Wrong or failing candidates:", *(f"- {w}" for w in wrong)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="zoo model (repeatable; default resnet50)")
    parser.add_argument("--batch", action="append", type=int, help="batch size (repeatable; default 1)")
    parser.add_argument("--threads", action="append", type=int, help="CPU threads (repeatable; default torch's)")
    parser.add_argument("--size", type=int, default=224, help="image side")
    parser.add_argument("--window", help="only layers of this window, e.g. 3x3")
    parser.add_argument("--effort", type=int, default=0, help="tuning effort (0-2)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="output directory")
    args = parser.parse_args(argv)
    results = {"device": "cpu", "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "runs": []}
    for name in args.model or ["resnet50"]:
        for batch in args.batch or [1]:
            nodes, opset = distinct_convs(name, batch, args.size)
            if args.window:
                nodes = [n for n in nodes if "x".join(map(str, n.inputs[1].shape[2:])) == args.window]
            for threads in args.threads or [torch.get_num_threads()]:
                torch.set_num_threads(threads)
                rows = []
                for node in nodes:
                    rows.append(time_layer(node, opset, args.effort))
                    times = ", ".join(f"{t} {v['ms']:.3f}" for t, v in sorted(rows[-1]["tactics"].items()))
                    print(f"{name} b{batch} {threads}t {rows[-1]['layer']:<36} {times}", flush=True)
                results["runs"].append({"model": name, "batch": batch, "threads": threads, "rows": rows})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_convs.json").write_text(json.dumps(results, indent=1, default=str))
    (args.out / "cpu_convs.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
