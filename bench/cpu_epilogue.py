"""What an activation epilogue costs our CPU 1×1 / GEMM kernel (`kernels.cpu.pointwise`): the same product with no
activation, ReLU and the erf GELU, in float32 and bf16, timed in alternating rounds (a shared machine's drift
reaches every variant alike); each result checked against the float64 reference first.

The layers, batch 1: ConvNeXt-Tiny's first-stage pw1 (56×56 pixels, 96 → 384 channels), ViT-S/16's feed-forward
up-projection (197 tokens, 384 → 1536) and BERT-base's (128 tokens, 768 → 3072).

    python bench/cpu_epilogue.py --out DIR      (writes DIR/results.json and results.md, prints the table)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.quantized_cpu import write_table
from tensorforge.kernels.cpu import pointwise as pw
from tensorforge.ops.math_flags import cpu_native_precisions

LAYERS = {"convnext pw1 56²": (56 * 56, 96, 384), "vit ff1": (197, 384, 1536), "bert ff1": (128, 768, 3072)}
ACTIVATIONS = ("", "Relu", "Gelu")
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2.0**-8 + 1e-5}  # normwise; bf16: the output's rounding


def _case(pixels: int, c: int, k: int, dtype: torch.dtype):
    """A [1, C, 1, pixels] channels_last input, a [K, C, 1, 1] weight, a bias; the same values for the reference."""
    generator = torch.Generator().manual_seed(c + k)
    x = torch.randn(1, c, 1, pixels, generator=generator).contiguous(memory_format=torch.channels_last).to(dtype)
    w = (torch.randn(k, c, 1, 1, generator=generator) / math.sqrt(c)).to(dtype)
    return x, w, torch.randn(k, generator=generator)


def _reference(x, w, b, activation: str) -> torch.Tensor:
    y = F.conv2d(x.double(), w.double(), b.double())
    return {"": y, "Relu": F.relu(y), "Gelu": F.gelu(y)}[activation]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50, help="timed calls per variant and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/cpu-epilogue"))
    args = parser.parse_args(argv)
    if pw.problem():
        raise SystemExit(pw.problem())
    dtypes = [torch.float32] + ([torch.bfloat16] if "bf16" in cpu_native_precisions() else [])
    rows = []
    lines = ["| layer | type | none ms | ReLU ms | GELU ms | GELU's cost |", "|---|---|---|---|---|---|"]
    for name, (pixels, c, k) in LAYERS.items():
        for dtype in dtypes:
            x, w, b = _case(pixels, c, k, dtype)
            out = torch.empty(1, k, 1, pixels, dtype=dtype).contiguous(memory_format=torch.channels_last)
            calls = {}
            for activation in ACTIVATIONS:
                conv = pw.PointwiseConv(w, b, activation)
                out.fill_(math.nan)
                got = conv(x, None, out)
                want = _reference(x, w, b, activation)
                error = ((got.double() - want).abs().max() / want.abs().max()).item()
                if not error <= TOLERANCE[dtype]:
                    raise SystemExit(f"{name} {dtype} {activation or 'none'}: wrong result, error {error:.2e}")
                calls[activation] = lambda conv=conv, x=x, out=out: conv(x, None, out)
            samples: dict[str, list[float]] = {a: [] for a in ACTIVATIONS}
            for _ in range(args.rounds):
                for activation, call in calls.items():
                    call()
                    for _ in range(args.runs):
                        start = time.perf_counter()
                        call()
                        samples[activation].append((time.perf_counter() - start) * 1e3)
            ms = {a or "none": statistics.median(s) for a, s in samples.items()}
            kind = "bf16" if dtype == torch.bfloat16 else "fp32"
            rows.append({"layer": name, "pixels": pixels, "c": c, "k": k, "dtype": kind, "ms": ms})
            cost = ms["Gelu"] - ms["none"]
            lines.append(
                f"| {name} | {kind} | {ms['none']:.3f} | {ms['Relu']:.3f} | {ms['Gelu']:.3f} | "
                f"{cost:.3f} ms ({cost / ms['none']:.0%}) |"
            )
            print(lines[-1], flush=True)
    write_table(args.out, "bench/cpu_epilogue.py", argv, rows, lines)


if __name__ == "__main__":
    main()
