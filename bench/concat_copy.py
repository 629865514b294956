"""Concatenations on the GPU: torch's `cat`, one torch `copy_` per input into its slice (what `vendor.concat-into`
does), and our tiled strided copy (`kernels/triton/copy.py`, every configuration), timed against one another
(CUDA-graph replays, L2 flushed, interleaved rounds), each result checked against `torch.cat`.

Cases: the YOLO-style detector's output concatenation (three channels_last head maps of 144 channels at 80², 40²
and 20², reshaped to [N, 144, H·W] and concatenated along the pixels: every input is transposed against the
output) and a C2f block's channel concatenation of channels_last maps (strides agree: a plain copy).

    python bench/concat_copy.py --batch 64 --out bench/results/concat-copy-h200
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge.kernels.triton.copy import concat, copy_configs
from tensorforge.tactics.timing import measure_interleaved


def _cases(batch: int, dtype: torch.dtype) -> dict[str, tuple[list[torch.Tensor], int]]:
    """name -> (inputs, axis)."""

    def maps(channels, sides):
        return [
            torch.randn(batch, c, s, s, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
            for c, s in zip(channels, sides, strict=True)
        ]

    heads = [m.reshape(batch, 144, -1) for m in maps((144, 144, 144), (80, 40, 20))]
    return {
        "detector output (3 transposed head maps along the pixels)": (heads, 2),
        "C2f channels (4 channels_last maps of 32 at 80x80)": (maps((32, 32, 32, 32), (80, 80, 80, 80)), 1),
    }


def _systems(inputs: list[torch.Tensor], axis: int, out: torch.Tensor) -> dict[str, Callable[[], object]]:
    def copies():
        start = 0
        for tensor in inputs:
            out.narrow(axis, start, tensor.shape[axis]).copy_(tensor)
            start += tensor.shape[axis]

    systems = {"torch.cat": lambda: torch.cat(inputs, dim=axis, out=out), "torch copy_ per input": copies}
    for config in copy_configs(1):
        label = f"ours {config['block_a']}x{config['block_b']} w{config['num_warps']}"
        systems[label] = lambda config=config: concat(inputs, axis, out=out, **config)
    return systems


def run(batch: int, dtype: torch.dtype) -> list[dict]:
    rows = []
    for case, (inputs, axis) in _cases(batch, dtype).items():
        want = torch.cat(inputs, dim=axis)
        out = torch.empty_like(want, memory_format=torch.contiguous_format if axis != 1 else torch.channels_last)
        systems = _systems(inputs, axis, out)
        for name, fn in systems.items():
            out.fill_(float("nan"))
            fn()
            if not torch.equal(out, want):
                raise SystemExit(f"{case}: {name} computed a wrong result")
        timings = measure_interleaved(list(systems.values()), device="cuda", rounds=3, repeats=20)
        moved = 2 * want.numel() * want.element_size()
        base = timings[0].median
        for name, timing in zip(systems, timings, strict=True):
            ms = timing.median
            rows.append(
                {"case": case, "system": name, "ms": ms, "gb_per_s": moved / ms / 1e6, "speedup_vs_cat": base / ms}
            )
    return rows


def markdown(rows: list[dict], batch: int, dtype: str) -> str:
    device = torch.cuda.get_device_name()
    lines = [f"Device: {device}; torch {torch.__version__}; batch {batch}, {dtype}", ""]
    lines += ["| case | system | ms | GB/s (read + written) | speed-up vs torch.cat |", "|---|---|---:|---:|---:|"]
    for r in rows:
        cells = (r["case"], r["system"], f"{r['ms']:.4f}", f"{r['gb_per_s']:.0f}", f"{r['speedup_vs_cat']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/concat_copy.py times GPU copies: it needs a CUDA device")
    rows = run(args.batch, getattr(torch, args.dtype))
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"batch": args.batch, "dtype": args.dtype, "rows": rows}
    (args.out / "concat_copy.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(rows, args.batch, args.dtype)
    (args.out / "concat_copy.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
