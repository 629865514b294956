"""Copies on the GPU: our tiled strided copy (`kernels/triton/copy.py`, every configuration) against torch, timed
against one another (CUDA-graph replays, L2 flushed, interleaved rounds), each result checked against torch's.

Concatenations (against torch's `cat` and one torch `copy_` per input into its slice, what `vendor.concat-into`
does): the YOLO-style detector's output concatenation (three channels_last head maps of 144 channels at 80², 40²
and 20², reshaped to [N, 144, H·W] and concatenated along the pixels: every input is transposed against the
output) and a C2f block's channel concatenation of channels_last maps (strides agree: a plain copy).
Layout changes with a cast (a `Reformat`, against torch's `tensor.to(dtype, memory_format=...)`): a float32 NCHW
network input to fp16 NHWC, and an fp16 NHWC map back to float32 NCHW.

    python bench/copies.py --batch 64 --out bench/results/copies-h200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge.kernels.triton.copy import concat, copy_configs, relayout
from tensorforge.tactics.timing import measure_interleaved


def _maps(batch, dtype, channels, sides):
    return [
        torch.randn(batch, c, s, s, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
        for c, s in zip(channels, sides, strict=True)
    ]


def _concatenations(batch: int, dtype: torch.dtype):
    """name -> (the systems, what they must compute, the buffer they write)."""
    heads = [m.reshape(batch, 144, -1) for m in _maps(batch, dtype, (144, 144, 144), (80, 40, 20))]
    cases = {
        "detector output (3 transposed head maps along the pixels)": (heads, 2),
        "C2f channels (4 channels_last maps of 32 at 80x80)": (_maps(batch, dtype, (32,) * 4, (80,) * 4), 1),
    }
    for case, (inputs, axis) in cases.items():
        want = torch.cat(inputs, dim=axis)
        out = torch.empty_like(want)

        def copies(inputs=inputs, axis=axis, out=out):
            start = 0
            for tensor in inputs:
                out.narrow(axis, start, tensor.shape[axis]).copy_(tensor)
                start += tensor.shape[axis]

        systems = {
            "torch.cat": lambda inputs=inputs, axis=axis, out=out: torch.cat(inputs, dim=axis, out=out),
            "torch copy_ per input": copies,
        }
        for config in copy_configs(1):
            systems[_label(config)] = lambda c=config, i=inputs, a=axis, o=out: concat(i, a, out=o, **c)
        yield case, systems, want, out, 2 * want.numel() * want.element_size()


def _reformats(batch: int, dtype: torch.dtype):
    image = torch.randn(batch * 4, 3, 224, 224, device="cuda")
    cases = {
        f"float32 NCHW input [{batch * 4}, 3, 224, 224] to {dtype} NHWC": (image, dtype, torch.channels_last),
        f"{dtype} NHWC [{batch}, 144, 80, 80] to float32 NCHW": (
            _maps(batch, dtype, (144,), (80,))[0],
            torch.float32,
            torch.contiguous_format,
        ),
    }
    for case, (x, target, memory_format) in cases.items():
        want = x.to(target, memory_format=memory_format)
        out = torch.empty_like(want)
        systems = {"torch .to(dtype, memory_format)": lambda x=x, t=target, m=memory_format: x.to(t, memory_format=m)}
        for config in copy_configs(1):
            systems[_label(config)] = lambda c=config, x=x, t=target, m=memory_format: relayout(x, t, m, **c)
        yield case, systems, want, out, x.numel() * x.element_size() + want.numel() * want.element_size()


def _label(config: dict) -> str:
    return f"ours {config['block_a']}x{config['block_b']} w{config['num_warps']}"


def run(batch: int, dtype: torch.dtype) -> list[dict]:
    rows = []
    for case, systems, want, out, moved in [*_concatenations(batch, dtype), *_reformats(batch, dtype)]:
        for name, fn in systems.items():
            out.fill_(float("nan"))
            got = fn()
            if not torch.equal(out if got is None or got is out else got, want):
                raise SystemExit(f"{case}: {name} computed a wrong result")
        timings = measure_interleaved(list(systems.values()), device="cuda", rounds=3, repeats=20)
        base = timings[0].median
        for name, timing in zip(systems, timings, strict=True):
            ms = timing.median
            rows.append({"case": case, "system": name, "ms": ms, "gb_per_s": moved / ms / 1e6, "speedup": base / ms})
    return rows


def markdown(rows: list[dict], batch: int, dtype: str) -> str:
    device = torch.cuda.get_device_name()
    lines = [f"Device: {device}; torch {torch.__version__}; batch {batch}, {dtype}", ""]
    lines += ["| case | system | ms | GB/s (read + written) | speed-up vs torch (first row) |"]
    lines += ["|---|---|---:|---:|---:|"]
    for r in rows:
        cells = (r["case"], r["system"], f"{r['ms']:.4f}", f"{r['gb_per_s']:.0f}", f"{r['speedup']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/copies.py times GPU copies: it needs a CUDA device")
    rows = run(args.batch, getattr(torch, args.dtype))
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"batch": args.batch, "dtype": args.dtype, "rows": rows}
    (args.out / "copies.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(rows, args.batch, args.dtype)
    (args.out / "copies.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
