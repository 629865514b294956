"""Our CPU attention kernel (`kernels.cpu.attention`, `cpu.attention`) against the two other candidates an engine
times for an Attention layer: the reference (`reference.registry`: float32 products and softmax through torch, as
the op registry evaluates it) and torch's fused `scaled_dot_product_attention` (`vendor.torch-sdpa`), on ViT-S/16's
and BERT-base's attention at batch 1 and 8, float32 and bf16. Q, K and V are strided views of one QKV projection's
output, as an engine hands them over. Medians of rounds that alternate the three.

    python bench/attention_cpu.py --out bench/results/attention-cpu
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.quantized_cpu import median_ms, write_table
from tensorforge.kernels.cpu import attention as at
from tensorforge.ops.math_flags import cpu_native_precisions

# (name, batch, tokens, heads, head size)
SHAPES = [
    ("vit_s16", 1, 197, 6, 64),
    ("vit_s16", 8, 197, 6, 64),
    ("bert_base", 1, 128, 12, 64),
    ("bert_base", 8, 128, 12, 64),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def compare(batch: int, tokens: int, heads: int, size: int, dtype: torch.dtype, runs: int, rounds: int) -> dict:
    generator = torch.Generator().manual_seed(tokens + heads)
    qkv = torch.randn(batch, tokens, 3, heads, size, generator=generator).to(dtype)
    q, k, v = (qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))
    kt, scale = k.transpose(-1, -2), size**-0.5

    def reference():
        scores = torch.matmul(q.float(), kt.float()) * scale
        return torch.matmul(torch.softmax(scores, dim=-1), v.float()).to(dtype)

    calls = {
        "reference": reference,
        "torch sdpa": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale),
        "ours": lambda: at.attention(q, kt, v, None, scale),
    }
    want = reference().double()
    error = ((calls["ours"]().double() - want).abs().max() / want.abs().max()).item()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            times[name].append(median_ms(call, runs))
    medians = {name: statistics.median(values) for name, values in times.items()}
    macs = batch * heads * tokens * tokens * size * 2
    return {
        "ms": medians,
        "speedup": {name: medians[name] / medians["ours"] for name in ("reference", "torch sdpa")},
        "gmacs": {name: macs / ms / 1e6 for name, ms in medians.items()},
        "error_vs_reference": error,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/attention-cpu"))
    parser.add_argument("--models", nargs="+", default=sorted({s[0] for s in SHAPES}))
    parser.add_argument("--batch", type=int, action="append", help="repeatable (default 1 and 8)")
    args = parser.parse_args(argv)
    if at.problem():
        raise SystemExit(at.problem())
    precisions = [p for p in DTYPES if p == "fp32" or p in cpu_native_precisions()]
    rows = []
    lines = [
        "| model | batch | precision | reference ms | torch sdpa ms | ours ms | ours faster than reference, sdpa "
        "| GMAC/s ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, batch, tokens, heads, size in SHAPES:
        if name not in args.models or batch not in (args.batch or [1, 8]):
            continue
        for precision in precisions:
            row = {"model": name, "batch": batch, "tokens": tokens, "heads": heads, "head_size": size}
            row |= {"precision": precision, **compare(batch, tokens, heads, size, DTYPES[precision], args.runs,
                                                      args.rounds)}  # fmt: skip
            rows.append(row)
            ms, speedup = row["ms"], row["speedup"]
            lines.append(
                f"| {name} | {batch} | {precision} | {ms['reference']:.3f} | {ms['torch sdpa']:.3f} | "
                f"{ms['ours']:.3f} | {speedup['reference']:.2f}×, {speedup['torch sdpa']:.2f}× | "
                f"{row['gmacs']['ours']:.0f} |"
            )
            print(lines[-1], flush=True)
    write_table(args.out, "bench/attention_cpu.py", argv, rows, lines)


if __name__ == "__main__":
    main()
