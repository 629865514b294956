"""One convolution kernel, many tile configurations: which tiles, warps and pipeline depths make ResNet-50's
layers fast, against the copy bandwidth and cuDNN's fused fp16 convolution in the same run.

For each layer (ResNet-50's 1×1 and 3×3 convolutions at one batch size, channels_last) and each configuration
of a grid wider than the tuning space, `conv2d_nhwc_quantized` (int8: int8 input, output and residual, the
chained form of an int8 engine) or `conv2d_nhwc` (fp16) is checked against the float reference of the same
quantized operands, then timed (CUDA-graph replay after an L2 flush, median). Reported per layer: the best
configuration, its bandwidth against a device copy's, the best effort-0 configuration's time (what a build picks
from today), and cuDNN's fused fp16 convolution. Results as JSON (every configuration) and a short table.

    python bench/conv_configs.py --batch 256 --precision int8 --out DIR
    python bench/conv_configs.py --batch 256 --precision int8 --kernel tma --persistent 0 2 --out DIR   (`conv_tma`,
        each tiling also as a persistent walk of two programs per multiprocessor)
    python bench/conv_configs.py --kernel tma --layers final-1x1-56 --tiles 64x64 128x64 --stages 1 3 --out DIR
        (a narrower grid)

Every configuration is fitted to the layer's channels as the tactics fit it (`fit_configs`: a 64-channel layer
gets 64-wide K tiles).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge.kernels.quantize import quantize_activation, quantize_weight
from tensorforge.kernels.triton.conv import (
    ConvConfig,
    conv2d_nhwc,
    conv2d_nhwc_quantized,
    conv_configs,
    fit_configs,
    pack_weight,
    quantized_conv_configs,
    tma_configs,
)
from tensorforge.kernels.triton.epilogue import activation_args
from tensorforge.tactics.timing import measure

# (name, Cin, Cout, kernel, image side, residual): ResNet-50's bottleneck convolutions, one of each stage.
LAYERS = [
    *[(f"final-1x1-{s}", c, 4 * c, 1, s, True) for c, s in ((64, 56), (128, 28), (256, 14), (512, 7))],
    *[(f"first-1x1-{s}", 4 * c, c, 1, s, False) for c, s in ((64, 56), (128, 28), (256, 14), (512, 7))],
    *[(f"3x3-{s}", c, c, 3, s, False) for c, s in ((64, 56), (128, 28), (256, 14), (512, 7))],
]


TILES = ((64, 64), (64, 128), (128, 64), (128, 128), (64, 256), (128, 256), (256, 128))


def grid(
    tma: bool = False, tiles=TILES, block_ks=(64, 128), warps=(4, 8), stages=(1, 2, 3)
) -> list[dict]:  # fmt: skip
    """Tiles × K depth × warps × pipeline stages, wider than any effort level (`tma`: of `conv_tma`'s kernel)."""
    return [
        dict(block_m=bm, block_n=bn, block_k=bk, group_m=8, num_warps=w, num_stages=s, tma=tma)
        for (bm, bn), bk, w, s in itertools.product(tiles, block_ks, warps, stages)
    ]


def _tile(text: str) -> tuple[int, int]:
    """'128x64' as (128, 64)."""
    m, n = text.lower().split("x")
    return int(m), int(n)


def walks(configs: list[dict], persistent: list[int]) -> list[dict]:
    """Each TMA configuration once per count of `persistent` programs per multiprocessor (0: one per tile)."""
    return [
        {**c, "persistent": n} if c.get("tma") else c for c in configs for n in (persistent if c.get("tma") else [0])
    ]


def _tiling(row: dict) -> tuple:
    """A configuration's tiling, whatever its split."""
    config = ConvConfig.of({k: v for k, v in row.items() if k in ConvConfig.__dataclass_fields__})
    return config.block_m, config.block_n, config.block_k, config.num_warps, config.num_stages, config.persistent


def copy_gbps(nbytes: int, device: torch.device) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = measure(lambda: dst.copy_(src), device=device, warmup=3, repeats=20).median
    return 2 * src.numel() / ms / 1e6


@dataclass
class Case:
    """One layer at one precision: `run(config)` computes it into a poisoned output, `error(y)` measures the
    result against the float reference (int8: in output steps; fp16: normwise), `peer()` runs cuDNN's fused fp16
    convolution of the same layer, `nbytes` is what the layer must move at least."""

    run: Callable[[dict], torch.Tensor]
    error: Callable[[torch.Tensor], float]
    tolerance: float
    peer: Callable[[], torch.Tensor]
    nbytes: int


def make_case(precision: str, batch: int, cin: int, cout: int, k: int, side: int, residual: bool, device) -> Case:
    torch.manual_seed(0)
    x = torch.randn(batch, cin, side, side, device=device).to(memory_format=torch.channels_last)
    w = torch.randn(cout, cin, k, k, device=device) / (cin * k * k) ** 0.5
    bias = torch.randn(cout, device=device)
    z = torch.randn(batch, cout, side, side, device=device).to(memory_format=torch.channels_last)
    pad = (k // 2, k // 2)
    geometry = dict(out_hw=(side, side), pads_begin=pad, post=activation_args("Relu"))
    wh, xh, zh, bh = w.half(), x.half(), z.half(), bias.half()
    if residual:
        peer = lambda: torch.cudnn_convolution_add_relu(xh, wh, zh, 1.0, bh, (1, 1), pad, (1, 1), 1)  # noqa: E731
    else:
        peer = lambda: torch.cudnn_convolution_relu(xh, wh, bh, (1, 1), pad, (1, 1), 1)  # noqa: E731
    if precision == "fp16":
        packed = pack_weight(wh, 1)
        ref = F.conv2d(xh.float(), wh.float(), bias, padding=k // 2) + (zh.float() if residual else 0)
        ref = torch.relu(ref)
        out = torch.empty_like(ref, dtype=torch.float16, memory_format=torch.channels_last)

        def run(cfg: dict) -> torch.Tensor:
            out.fill_(float("nan"))
            return conv2d_nhwc(xh, packed, bh, zh if residual else None, out=out, config=cfg, **geometry)

        def error(y: torch.Tensor) -> float:
            return ((y.float() - ref).abs().max() / ref.abs().max()).item()

        nbytes = 2 * (xh.numel() + (zh.numel() if residual else 0) + out.numel() + w.numel())
        return Case(run, error, 2e-3, peer, nbytes)
    sx, sz, sy = x.abs().amax().item() / 127, z.abs().amax().item() / 127, 4.0 / 127
    xq, zq = quantize_activation(x, sx, "int8"), quantize_activation(z, sz, "int8")
    wq, ws = quantize_weight(w, "int8")
    packed, ws = pack_weight(wq, 1, k_major=True), ws.to(device)
    ref = F.conv2d(xq.float() * sx, wq.float() * ws[:, None, None, None], bias, padding=k // 2)
    ref = torch.relu(ref + (zq.float() * sz if residual else 0)).clamp(max=127 * sy)
    out = torch.empty(batch, cout, side, side, dtype=torch.int8, device=device, memory_format=torch.channels_last)

    def run(cfg: dict) -> torch.Tensor:
        out.fill_(-7)
        return conv2d_nhwc_quantized(
            xq, packed, ws, sx, bias, zq if residual else None, out=out, config=cfg, y_scale=sy,
            z_scale=sz if residual else 0.0, **geometry,
        )  # fmt: skip

    def error(y: torch.Tensor) -> float:
        return ((y.float() * sy - ref).abs().max() / sy).item()

    nbytes = xq.numel() + (zq.numel() if residual else 0) + out.numel() + wq.numel()
    return Case(run, error, 1.01, peer, nbytes)


def sweep(case: Case, configs: list[dict], device: torch.device) -> list[dict]:
    """Each configuration checked, then timed; one that fails to compile, fit or compute is recorded, not fatal."""
    rows = []
    for cfg in configs:
        row = dict(cfg)
        rows.append(row)
        try:
            err = case.error(case.run(cfg))
        except Exception as exc:
            row["note"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            continue
        row["error"] = err
        if not err <= case.tolerance:
            row["note"] = f"wrong: {err:.3g}"
            continue
        row["ms"] = measure(lambda cfg=cfg: case.run(cfg), device=device, warmup=2, repeats=15).median
    return rows


def describe(row: dict) -> str:
    walk = f" persistent {row['persistent']}" if row.get("persistent") else ""
    return (
        "{block_m}x{block_n}x{block_k} w{num_warps} s{num_stages}".format(**row)
        + (" tma" if row.get("tma") else "")
        + (" swap" if row.get("swap") else "")
        + walk
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--precision", choices=("int8", "fp16"), default="int8")
    parser.add_argument("--layers", nargs="+", help="layer names (default: all)")
    parser.add_argument("--effort0", action="store_true", help="only the effort-0 configurations (a smoke run)")
    parser.add_argument(
        "--kernel", nargs="+", choices=("gather", "tma"), default=["gather"],
        help="gather: conv's implicit GEMM; tma: conv_tma's kernel; both: side by side",
    )  # fmt: skip
    parser.add_argument(
        "--persistent", nargs="+", type=int, default=[0], metavar="N",
        help="TMA configurations also as persistent walks of N programs per multiprocessor (0: one per tile)",
    )  # fmt: skip
    parser.add_argument("--tiles", nargs="+", type=_tile, default=TILES, metavar="MxN", help="grid tiles (BMxBN)")
    parser.add_argument("--block-k", nargs="+", type=int, default=[64, 128], help="grid K depths")
    parser.add_argument("--warps", nargs="+", type=int, default=[4, 8], help="grid warp counts")
    parser.add_argument("--stages", nargs="+", type=int, default=[1, 2, 3], help="grid pipeline depths")
    parser.add_argument("--tag", default="", help="appended to the result file's name")
    parser.add_argument("--device", default="cuda", help="cuda; cpu runs the Triton interpreter (a smoke run)")
    parser.add_argument("--seconds", type=float, default=300, help="stop starting new layers after this")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    device = torch.device(args.device)
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    peak = copy_gbps(2 << 30 if device.type == "cuda" else 1 << 24, device)
    print(f"device copy {peak:.0f} GB/s", flush=True)
    quantized = args.precision == "int8"
    effort0 = {"gather": quantized_conv_configs(0) if quantized else conv_configs(0), "tma": tma_configs(0, quantized)}
    wide = dict(tiles=args.tiles, block_ks=args.block_k, warps=args.warps, stages=args.stages)
    configs = [c for k in args.kernel for c in (effort0[k] if args.effort0 else grid(k == "tma", **wide))]
    configs = walks(configs, args.persistent)
    results = []
    for name, cin, cout, k, side, residual in LAYERS:
        if args.layers and name not in args.layers:
            continue
        if time.time() - started > args.seconds:
            print(f"{name}: skipped, out of time", flush=True)
            continue
        case = make_case(args.precision, args.batch, cin, cout, k, side, residual, device)
        peer_ms = measure(case.peer, device=device, warmup=3, repeats=20).median if device.type == "cuda" else math.nan
        min_k = 32 if quantized else 16
        effort0_tilings = {
            kernel: {_tiling(c) for c in fit_configs(cs, cin, cout, min_k)} for kernel, cs in effort0.items()
        }
        rows = sweep(case, fit_configs(configs, cin, cout, min_k), device)
        by_kernel = {}
        for kernel in args.kernel:
            timed = [r for r in rows if "ms" in r and bool(r.get("tma")) == (kernel == "tma")]
            best = min(timed, key=lambda r: r["ms"], default=None)
            best0 = min(
                (r for r in timed if _tiling(r) in effort0_tilings[kernel]), key=lambda r: r["ms"], default=None
            )
            by_kernel[kernel] = dict(best=best, best_effort0=best0, ran=len(timed))
            if best is None:
                print(f"{name:<14} {kernel}: no configuration ran", flush=True)
                continue
            gbps = case.nbytes / best["ms"] / 1e6
            print(f"{name:<14} {kernel:<6} best {best['ms']:.4f} ms ({describe(best)}, {gbps:.0f} GB/s = "
                  f"{gbps / peak:.0%} of copy) effort-0 {best0['ms'] if best0 else math.nan:.4f} ms  "
                  f"cuDNN fp16 {peer_ms:.4f} ms  [{len(timed)} ran]", flush=True)  # fmt: skip
        results.append(dict(layer=name, cin=cin, cout=cout, kernel=k, side=side, residual=residual, bytes=case.nbytes,
                            by_kernel=by_kernel, cudnn_fp16_ms=peer_ms, configs=rows))  # fmt: skip
        kernels = "" if args.kernel == ["gather"] else "-" + "-".join(args.kernel)
        (args.out / f"conv-configs-{args.precision}{kernels}-b{args.batch}{args.tag}.json").write_text(
            json.dumps(dict(copy_gbps=peak, batch=args.batch, precision=args.precision, layers=results), indent=1)
        )


if __name__ == "__main__":
    main()
