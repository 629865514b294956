"""Does a tactic family pay end to end? One model built twice — with every tactic family and without the given
ones — and both engines timed in alternation in one process (call by call, so that a noisy machine slows both alike).

    python bench/families.py --model mobilenetv3 --without cpu --out DIR                 # the CPU kernels' worth
    python bench/families.py --model bert_base --size 128 --batch 64 --without gluon --out DIR
    python bench/families.py --model mobilenetv3 --unfused --out DIR              # the CPU block fusions' worth
    python bench/families.py --model mobilenetv3 --unfused pooled-gemm --out DIR  # one of them
    python bench/families.py --model mobilenetv3 --without cpu.gemm --out DIR           # one tactic's worth
    python bench/families.py --model bert_base --size 128 --batch 64 --sparsity force --without sparse --out DIR
                                               # the 2:4 sparse kernels' worth, both engines on the same pruned weights

`--without F ...` builds the second engine from every registered family but those (a name with a dot, a tactic's key
such as `cpu.gemm`, leaves out that tactic alone: it declines every layer in that build); `--unfused [RULE ...]`
builds it without the CPU's block fusions (`passes.cpu_blocks`, which need the "cpu" family), or without the rules
named. The two builds share one timing cache, so that the second reuses the first's timings and the engines differ
only in the layers the compared families decide (on a noisy machine, two builds timed apart pick different tactics
for unrelated layers, a larger difference than the one measured). A model is a zoo name or an ONNX file. Prints each
engine's median, their ratio, and which layers ran in the families compared; writes
`families-MODEL-bBATCH-COMPARISON.json` (COMPARISON e.g. `without-cpu`, `unfused-pooled-gemm`) under DIR.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge import zoo
from tensorforge.build.builder import Builder
from tensorforge.build.config import SPARSITY_MODES, BuildConfig, QuantizationConfig
from tensorforge.frontend import import_model
from tensorforge.passes import cpu_blocks
from tensorforge.tactics import autotune  # noqa: F401 - registers every tactic family
from tensorforge.tactics.base import all_tactics, tactic_by_key


def _families(without: list[str]) -> tuple[str, ...]:
    """The tactic families of the compared build: every family less those named in `without` (tactics, with a dot,
    aside)."""
    return tuple(sorted({t.family for t in all_tactics()} - {name for name in without if "." not in name}))


def _left_out(stack: ExitStack, keys: list[str]) -> None:
    """The tactics of `keys` decline every layer until `stack` closes."""
    for key in keys:
        stack.enter_context(
            mock.patch.object(tactic_by_key(key), "supports", return_value="left out by the comparison")
        )


def _unfused(stack: ExitStack, rules: list[str] | None) -> None:
    """Until `stack` closes: no CPU block fusion (`rules` empty), or none of `rules` (by name); None: all as usual."""
    if rules == []:
        stack.enter_context(mock.patch.object(Builder, "_cpu_kernels", return_value=None))
    for rule in cpu_blocks.RULES if rules else ():
        if rule.name in rules:
            stack.enter_context(mock.patch.object(rule, "check", return_value="left out by the comparison"))


def _comparison(without: list[str], unfused: list[str] | None) -> str:
    """The compared build in a file name: "without-cpu", "unfused", "unfused-pooled-gemm", ..."""
    parts = [f"without-{name}" for name in without]
    if unfused is not None:
        parts.append("-".join(["unfused", *unfused]))
    return "-".join(parts)


def _differing_layers(default, compared) -> list[dict[str, str]]:
    """The layers (by node name) that run another tactic in the compared engine than in the default one."""

    def tactics(engine):
        nodes = engine.model.graph.nodes
        return {nodes[layer.node].name: layer.tactic for layer in engine.plans[0].layers}

    ours, theirs = tactics(default), tactics(compared)
    return [
        {"layer": name, "default": tactic, "compared": theirs.get(name, "(fused otherwise)")}
        for name, tactic in ours.items()
        if theirs.get(name) != tactic
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a zoo model name or an ONNX file")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--precision", action="append", help="allowed precisions (default fp32, and fp16 on CUDA); int8 / fp8 take "
        "their scales from the benchmark's own inputs",
    )  # fmt: skip
    parser.add_argument("--effort", type=int, default=0)
    parser.add_argument("--without", nargs="+", default=[], metavar="FAMILY_OR_TACTIC")
    parser.add_argument(
        "--unfused", nargs="*", metavar="RULE", choices=[rule.name for rule in cpu_blocks.RULES],
        help="the compared engine without the CPU block fusions (all, or those named)",
    )  # fmt: skip
    parser.add_argument(
        "--sparsity", choices=SPARSITY_MODES, default="auto", help="both builds' (force: both prune alike)"
    )
    parser.add_argument("--runs", type=int, default=300, help="calls of each engine, alternating")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    if not args.without and args.unfused is None:
        parser.error("name the families or tactics to leave out (--without) or compare without the fusion (--unfused)")
    device = torch.device(args.device)
    path = Path(args.model)
    if path.suffix == ".onnx":
        proto = onnx.load(path)
        constants = {init.name for init in proto.graph.initializer}
        feeds = {  # random inputs of the declared shapes, a symbolic dimension taken as --batch
            i.name: torch.rand(*[d.dim_value or args.batch for d in i.type.tensor_type.shape.dim], device=device)
            for i in proto.graph.input
            if i.name not in constants
        }
    else:
        proto = zoo.export(args.model, batch=args.batch, size=args.size, dynamic_batch=False)
        feeds = {k: v.to(device) for k, v in zoo.example_inputs(args.model, args.batch, args.size, seed=1).items()}
    precisions = tuple(args.precision or (["fp32", "fp16"] if device.type == "cuda" else ["fp32"]))
    compared = _families(args.without)
    engines = {}
    quantized = any(p in ("int8", "fp8") for p in precisions)
    # int8 / fp8: scales from the benchmark's own inputs (minmax), as bench/suite.py: a speed measurement
    calibration = [{k: v.cpu().numpy() for k, v in feeds.items()}] if quantized else None
    timing_cache = Path(tempfile.mkdtemp()) / "timing.json"
    for label, families in (("default", None), ("compared", compared)):
        config = BuildConfig(
            device=str(device), precisions=precisions, effort=args.effort, tactic_families=families,
            quantization=QuantizationConfig(method="minmax") if quantized else None, timing_cache=str(timing_cache),
            sparsity=args.sparsity,
        )  # fmt: skip
        started = time.perf_counter()
        with ExitStack() as stack:
            if label == "compared":
                _left_out(stack, [name for name in args.without if "." in name])
                _unfused(stack, args.unfused)
            engines[label] = Builder(config, calibration_data=calibration).build(import_model(proto))
        print(f"{label} engine ({families or 'default families'}) built in {time.perf_counter() - started:.1f} s")
    contexts = {label: engine.create_context() for label, engine in engines.items()}
    samples: dict[str, list[float]] = {label: [] for label in contexts}
    for _ in range(10):
        for context in contexts.values():
            context.run(feeds)
    for _ in range(args.runs):
        for label, context in contexts.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            context.run(feeds)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            samples[label].append((time.perf_counter() - started) * 1e3)
    medians = {label: statistics.median(values) for label, values in samples.items()}
    changed = sorted({f"{layer.tactic}" for layer in engines["compared"].plans[0].layers} ^ {
        f"{layer.tactic}" for layer in engines["default"].plans[0].layers})  # fmt: skip
    differing = _differing_layers(engines["default"], engines["compared"])
    ratio = medians["compared"] / medians["default"]
    print(f"default {medians['default']:.3f} ms, compared {medians['compared']:.3f} ms: compared/default {ratio:.3f}")
    print(f"tactics in one engine only: {', '.join(changed) or 'none'}; layers with other tactics: {len(differing)}")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "model": path.name if path.suffix == ".onnx" else args.model,
        "batch": args.batch,
        "device": str(device),
        "precisions": precisions,
        "sparsity": args.sparsity,
        "compared_families": compared,
        "compared_without_tactics": [name for name in args.without if "." in name],
        "compared_unfused": args.unfused if args.unfused is None else args.unfused or ["all"],
        "compared_tactics": sorted({layer.tactic for layer in engines["compared"].plans[0].layers}),
        "medians_ms": medians,
        "ratio": ratio,
        "tactics_in_one_engine_only": changed,
        "differing_layers": differing,
        "runs": args.runs,
        "date": time.strftime("%Y-%m-%d"),
        "argv": [Path(a).name if a == args.model else a for a in (sys.argv[1:] if argv is None else argv)],
    }
    (args.out / f"families-{path.stem}-b{args.batch}-{_comparison(args.without, args.unfused)}.json").write_text(
        json.dumps(result, indent=1)
    )


if __name__ == "__main__":
    main()
