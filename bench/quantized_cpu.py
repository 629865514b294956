"""Our int8 CPU kernels (AVX-512 VNNI: `kernels.cpu.quantized_pointwise` for 1×1 and linear layers,
`kernels.cpu.quantized_conv` for the others) against oneDNN's int8 convolution through torch, as
`vendor.onednn-qconv` calls it (the int8 input offset to uint8 by a pass of its own, the weight prepacked once,
bias, ReLU and the int8 output inside), on ResNet-50's shapes and BERT-base's linear layers (128 tokens) at batch 1:
int8 in, int8 out. Medians of rounds that alternate the two; every tile of ours.

    python bench/quantized_cpu.py --out bench/results/quantized-cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.suite import invocation
from tensorforge.kernels.cpu import quantized_conv as qc
from tensorforge.kernels.cpu import quantized_pointwise as qp

# (name, input channels, output channels, images, height, width, window, stride, padding)
SHAPES = [
    ("resnet50 stem", 4, 64, 1, 224, 224, 7, 2, 3),
    ("resnet50 layer1 conv1", 256, 64, 1, 56, 56, 1, 1, 0),
    ("resnet50 layer1 conv2", 64, 64, 1, 56, 56, 3, 1, 1),
    ("resnet50 layer1 conv3", 64, 256, 1, 56, 56, 1, 1, 0),
    ("resnet50 layer2 conv1", 256, 128, 1, 56, 56, 1, 1, 0),
    ("resnet50 layer2.0 conv2 (stride 2)", 128, 128, 1, 56, 56, 3, 2, 1),
    ("resnet50 layer2 conv2", 128, 128, 1, 28, 28, 3, 1, 1),
    ("resnet50 layer3 conv1", 1024, 256, 1, 14, 14, 1, 1, 0),
    ("resnet50 layer3 conv2", 256, 256, 1, 14, 14, 3, 1, 1),
    ("resnet50 layer3 conv3", 256, 1024, 1, 14, 14, 1, 1, 0),
    ("resnet50 layer4 conv1", 2048, 512, 1, 7, 7, 1, 1, 0),
    ("resnet50 layer4 conv2", 512, 512, 1, 7, 7, 3, 1, 1),
    ("resnet50 layer4 conv3", 512, 2048, 1, 7, 7, 1, 1, 0),
    ("bert-base qkv / out (128 tokens)", 768, 768, 128, 1, 1, 1, 1, 0),
    ("bert-base ff1 (128 tokens)", 768, 3072, 128, 1, 1, 1, 1, 0),
    ("bert-base ff2 (128 tokens)", 3072, 768, 128, 1, 1, 1, 1, 0),
]


def median_ms(fn, runs: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def compare(c: int, k: int, n: int, h: int, w: int, window: int, stride: int, pad: int, runs: int, rounds: int) -> dict:
    generator = torch.Generator().manual_seed(c + k)
    x = torch.randint(-128, 128, (n, c, h, w), generator=generator, dtype=torch.int8)
    x = x.contiguous(memory_format=torch.channels_last)
    wq = torch.randint(-127, 128, (k, c, window, window), generator=generator, dtype=torch.int8)
    w_scale = torch.rand(k, generator=generator) * 1e-3 + 1e-4
    bias = torch.randn(k, generator=generator)
    x_scale, y_scale = 0.02, 0.05
    out_hw = ((h + 2 * pad - window) // stride + 1, (w + 2 * pad - window) // stride + 1)
    if window == 1:
        ours = {t: qp.QuantizedPointwise(wq.flatten(1), w_scale, x_scale, bias, "Relu", tile=t) for t in qp.TILES}
        run = {t: lambda conv=conv: conv(x, y_scale=y_scale) for t, conv in ours.items()}
    else:
        ours = {t: qc.QuantizedConv(wq, w_scale, x_scale, bias, [stride] * 2, [1, 1], "Relu", tile=t) for t in qc.TILES}
        run = {t: lambda conv=conv: conv(x, [pad] * 2, out_hw, y_scale=y_scale) for t, conv in ours.items()}
    onednn = torch.ops.onednn
    strides, pads = [stride] * 2, [pad] * 2
    packed = onednn.qconv_prepack(wq, w_scale, x_scale, 128, strides, pads, [1, 1], 1, list(x.shape))
    zero = torch.zeros(k, dtype=torch.int64)

    def vendor():
        unsigned = torch.bitwise_xor(x.view(torch.uint8), 128)
        return onednn.qconv2d_pointwise(
            unsigned, x_scale, 128, packed, w_scale, zero, bias, strides, pads, [1, 1], 1, y_scale, 0, torch.int8,
            "relu", [], "",
        )  # fmt: skip

    mismatch = (next(iter(run.values()))().int() - vendor().int()).abs().max().item()
    times: dict[str, list[float]] = {"onednn": [], **{f"ours {t[0]}x{t[1]}": [] for t in run}}
    for _ in range(rounds):
        times["onednn"].append(median_ms(vendor, runs))
        for tile, call in run.items():
            times[f"ours {tile[0]}x{tile[1]}"].append(median_ms(call, runs))
    medians = {name: statistics.median(values) for name, values in times.items()}
    best = min((name for name in medians if name != "onednn"), key=medians.get)
    macs = n * out_hw[0] * out_hw[1] * c * k * window * window
    return {
        "shape": {"c": c, "k": k, "n": n, "h": h, "w": w, "window": window, "stride": stride, "pad": pad},
        "ms": medians,
        "best": best,
        "ratio": medians[best] / medians["onednn"],
        "gmacs": {name: macs / ms / 1e6 for name, ms in medians.items()},
        "max_steps_apart": mismatch,  # int8 outputs: one step where a value sits on a rounding boundary
    }


def write_table(out: Path, script: str, argv: list[str] | None, rows: list[dict], lines: list[str]) -> None:
    """A CPU kernel benchmark's rows as OUT/results.json (with the invocation) and its table as OUT/results.md."""
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", script, *(sys.argv[1:] if argv is None else argv)])
    meta = {**invocation(torch.device("cpu"), []), "command": command}
    (out / "results.json").write_text(json.dumps({"invocation": meta, "rows": rows}, indent=1) + "\n")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}/results.json and results.md")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/quantized-cpu"))
    parser.add_argument("--layers", nargs="+", metavar="TEXT", help="only the layers whose names contain one of these")
    args = parser.parse_args(argv)
    if qp.problem():
        raise SystemExit(qp.problem())
    shapes = [s for s in SHAPES if not args.layers or any(text in s[0] for text in args.layers)]
    rows = []
    lines = [
        "| layer | C → K, window / stride, input pixels | oneDNN ms | ours ms (tile) | ours / oneDNN "
        "| GMAC/s oneDNN, ours |",
        "|---|---|---|---|---|---|",
    ]
    for name, c, k, n, h, w, window, stride, pad in shapes:
        row = {"layer": name, **compare(c, k, n, h, w, window, stride, pad, args.runs, args.rounds)}
        rows.append(row)
        ms, best = row["ms"], row["best"]
        lines.append(
            f"| {name} | {c} → {k}, {window}×{window} / {stride}, {n * h * w} | {ms['onednn']:.4f} | "
            f"{ms[best]:.4f} ({best[5:]}) | {row['ratio']:.2f} | {row['gmacs']['onednn']:.0f}, "
            f"{row['gmacs'][best]:.0f} |"
        )
        print(lines[-1], flush=True)
    write_table(args.out, "bench/quantized_cpu.py", argv, rows, lines)


if __name__ == "__main__":
    main()
