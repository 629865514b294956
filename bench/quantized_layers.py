"""Where a quantized engine's convolutions and products go, layer by layer: for each QuantizedConv and
QuantizedGemm of a zoo model's int8 (or fp8) engine, the fastest quantized kernel against the fastest float
fallback, as the autotuner timed them on the layer's real inputs, and which one the build kept.

    python bench/quantized_layers.py --model resnet50 --batch 256 --precision int8 --chain always --out DIR
    python bench/quantized_layers.py --model resnet50 --device cpu --chain off always --out DIR   # side by side

Prints a table (layer, shape, what it reads and writes, quantized ms, float ms, their ratio) and the engine's
end-to-end time (with several `--chain` modes, the engines timed in alternation in one process); writes
`quantized-layers-MODEL-bBATCH-PRECISION-CHAIN.json` under DIR, which also keeps, per layer, why candidates
failed or were refused. A ratio under 1 is a layer the quantized kernels win.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.suite import BENCH_SIZES, Case, build_engine, invocation, median_ms
from tensorforge.build.config import CHAIN_MODES
from tensorforge.ir import DType
from tensorforge.runtime.plan import Layer

QUANTIZED_OPS = ("QuantizedConv", "QuantizedGemm")
QUANTIZED_DTYPES = (DType.INT8, DType.FLOAT8E4M3FN)


def _best(layer: Layer, fallback: bool) -> tuple[float, str]:
    """The fastest timed candidate among the float fallbacks (`fallback`) or the quantized kernels."""
    timed = [c for c in layer.candidates if math.isfinite(c.median_ms) and c.tactic.startswith("fallback.") == fallback]
    best = min(timed, key=lambda c: c.median_ms, default=None)
    if best is None:
        return math.inf, ""
    return best.median_ms, f"{best.tactic} {best.config.get('precision', '')} {best.config.get('inner', '')}".strip()


def layer_rows(engine) -> list[dict[str, Any]]:
    rows = []
    for layer in engine.plans[0].layers:
        node = engine.model.graph.nodes[layer.node]
        if node.op_type not in QUANTIZED_OPS:
            continue
        quantized_ms, quantized = _best(layer, fallback=False)
        failures = sorted(
            {f"{c.tactic}: {c.note[:200]}" for c in layer.candidates if c.note and not c.note.startswith("cached")}
        )
        float_ms, fallback = _best(layer, fallback=True)
        by_tactic: dict[str, float] = {}
        for c in layer.candidates:
            if math.isfinite(c.median_ms):
                by_tactic[c.tactic] = min(c.median_ms, by_tactic.get(c.tactic, math.inf))
        rows.append(
            {
                "layer": node.name,
                "op": node.op_type,
                "input": list(node.inputs[0].shape or ()),
                "weight": list(node.inputs[1].shape or ()),
                "reads": str(node.inputs[0].dtype),
                "writes": str(node.outputs[0].dtype),
                "residual": len(node.inputs) > 3 and node.inputs[3] is not None,
                "chosen": layer.tactic,
                "chosen_ms": layer.median_ms,
                "quantized_ms": quantized_ms,
                "quantized": quantized,
                "float_ms": float_ms,
                "float": fallback,
                "ratio": quantized_ms / float_ms if float_ms > 0 and math.isfinite(float_ms) else math.inf,
                "failures": failures,
                "tactics": dict(sorted(by_tactic.items(), key=lambda item: item[1])),
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'layer':<34} {'weight':<18} {'reads':<8} {'writes':<8} {'quant ms':>9} {'float ms':>9} {'q/f':>6}  "
        "each tactic's best ms"
    ]
    for row in rows:
        weight = "x".join(str(d) for d in row["weight"])
        tactics = " ".join(f"{tactic} {ms:.4f}" for tactic, ms in list(row["tactics"].items())[:3])
        lines.append(
            f"{row['layer'][-34:]:<34} {weight:<18} {row['reads'][:8]:<8} {row['writes'][:8]:<8} "
            f"{row['quantized_ms']:>9.4f} {row['float_ms']:>9.4f} {row['ratio']:>6.2f}  {tactics}"
        )
    finite = [row["ratio"] for row in rows if math.isfinite(row["ratio"]) and row["ratio"] > 0]
    wins = sum(ratio < 1 for ratio in finite)
    geomean = math.exp(sum(math.log(r) for r in finite) / len(finite)) if finite else math.nan
    quantized = sum(row["quantized_ms"] for row in rows if math.isfinite(row["quantized_ms"]))
    floats = sum(row["float_ms"] for row in rows if math.isfinite(row["float_ms"]))
    lines.append(
        f"quantized kernels win {wins} of {len(finite)} layers; geometric-mean ratio {geomean:.3f}; "
        f"sum of the layers' times: quantized {quantized:.3f} ms, float {floats:.3f} ms"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--precision", choices=("int8", "fp8"), default="int8")
    parser.add_argument("--chain", choices=CHAIN_MODES, nargs="+", default=["auto"], help="one engine per mode")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--effort", type=int, default=0)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="timings of the engines in alternation")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--families", nargs="+", metavar="FAMILY", help="tactic families (default: every one)")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    size = BENCH_SIZES.get(args.model, 224)
    families = tuple(args.families) if args.families else None
    case = Case(args.model, args.batch, size, device, args.runs, args.warmup, args.effort, families=families)
    feeds = {k: v.to(device) for k, v in case.feeds.items()}
    built = {}
    for chain in args.chain:
        engine, build_s = build_engine(case, args.precision, chain=chain)
        built[chain] = (engine, build_s, engine.create_context())
    # Engines timed in alternation, the median of the rounds' medians: a noisy machine slows them alike.
    times: dict[str, list[float]] = {chain: [] for chain in built}
    for _ in range(args.rounds):
        for chain, (_, _, context) in built.items():
            run = lambda context=context: context.run(feeds)  # noqa: E731
            times[chain].append(median_ms(run, device, args.runs, args.warmup))
    command = " ".join(["python", "bench/quantized_layers.py", *(sys.argv[1:] if argv is None else argv)])
    args.out.mkdir(parents=True, exist_ok=True)
    for chain, (engine, build_s, context) in built.items():
        ms = statistics.median(times[chain])
        rows = layer_rows(engine)
        print(table(rows))
        if not rows:
            restored = engine.report.get("quantization", {}).get("float_blocks")
            print(f"chain {chain}: no quantized layers left: the build restored every one to float ({restored})")
        print(f"{args.model} batch {args.batch} {args.precision} chain {chain}: {ms:.3f} ms, built in {build_s:.1f} s")
        path = args.out / f"quantized-layers-{args.model}-b{args.batch}-{args.precision}-{chain}.json"
        result = {
            "invocation": {**invocation(device, []), "command": command},
            "ms": ms,
            "rounds_ms": times[chain],
            "build_s": build_s,
            "error_vs_fp64": case.error(context.run(feeds)["output"]),
            "chaining": engine.report.get("quantized_activations"),
            "layers": rows,
            "date": time.strftime("%Y-%m-%d"),
        }
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"wrote {path}")
    if len(built) > 1:
        summary = ", ".join(f"chain {chain} {statistics.median(times[chain]):.3f} ms" for chain in built)
        print(f"side by side ({args.rounds} rounds in alternation): {summary}")


if __name__ == "__main__":
    main()
