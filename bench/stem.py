"""ResNet-50's stem (7×7 stride 2, 3 → 64 channels, + bias + ReLU, from the float32 NCHW input an engine gets)
in its parts, each timed on its own beside cuDNN's fused fp16 convolution in the same run:

- cuDNN: the cast of the input to fp16 channels_last, then `cudnn_convolution_relu`;
- space to depth (`kernels.space_to_depth`): the blocking pass, then the blocked layer's convolution in two forms,
  per tap (4×4 taps of 16 channels) and per row of taps (`column_taps`: 4 × 1 taps of 64 channels), over the
  effort-0 configurations of `triton.conv-s2d`; in fp16, and int8 (quantized by the blocking pass, int8 out, as
  a chained int8 stem writes), the int8 one also on the warp-specialized Gluon kernel (`gluon.conv-s2d-quantized`'s
  `conv_ws`) over its effort-1 tiles fitted to the stem, and probes of what bounds it: its input as a dense copy of
  the overlapping view, its output in fp16, its tiles computed transposed (`swap`: the pixels as the products' N);
- the blocking pass's tiles (pixels a program × warps), fp16 and int8;
- the 3×3 stride-2 max pool that reads the stem's output: torch's in fp16, ours (`kernels.triton.pool`) over its
  effort-1 tiles in fp16 and int8.

Every result is checked against the float32 reference before it is timed.

    python bench/stem.py --batch 256 --out DIR      (writes stem-bBATCH.json, prints a table)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.conv_configs import describe
from tensorforge.kernels.quantize import quantize_activation, quantize_weight
from tensorforge.kernels.space_to_depth import (
    blocked_input,
    blocked_pads,
    blocked_taps,
    blocked_weight,
    column_tap_weight,
    column_taps,
)
from tensorforge.kernels.triton.conv import (
    conv2d_nhwc,
    conv2d_nhwc_quantized,
    conv_configs,
    fit_configs,
    pack_weight,
    quantized_conv_configs,
    tma_configs,
)
from tensorforge.kernels.triton.copy import space_to_depth
from tensorforge.kernels.triton.epilogue import activation_args
from tensorforge.kernels.triton.pool import max_pool2d, pool_configs
from tensorforge.tactics.gluon_gemm import GemmConfig, conv_ws, gemm_ws_configs, pack_conv_weight
from tensorforge.tactics.timing import measure

KERNEL, PAD, COUT = 7, 3, 64
BLOCKING_TILES = [(j, w) for j in (32, 64, 128, 256) for w in (2, 4, 8)]  # (pixels a program, warps)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    return measure(fn, device=device, warmup=3, repeats=20).median


def best(
    run: Callable, error: Callable[[torch.Tensor], float], tolerance: float, configs, device, named: Callable = describe
):
    """The fastest correct configuration (`named` names it): (ms, description, rows of every configuration)."""
    rows = []
    for cfg in configs:
        row = {"config": named(cfg)}
        rows.append(row)
        try:
            row["error"] = err = error(run(cfg))
        except Exception as exc:  # a configuration that fails is recorded, not fatal
            row["note"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            continue
        if err <= tolerance:
            row["ms"] = timed(lambda cfg=cfg: run(cfg), device)
        else:
            row["note"] = f"wrong: {err:.3g}"
    timed_rows = [r for r in rows if "ms" in r]
    top = min(timed_rows, key=lambda r: r["ms"], default={"ms": float("inf"), "config": "none ran"})
    return top["ms"], top["config"], rows


def exact_best(run: Callable, want: torch.Tensor, choices, named: Callable, device):
    """`best` among `choices` whose `run(choice)` equals `want` exactly."""
    return best(run, lambda y: 0.0 if torch.equal(y, want) else 1.0, 0.0, choices, device, named)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--device", default="cuda", help="cuda; cpu checks the script under the Triton interpreter")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    w = torch.randn(COUT, 3, KERNEL, KERNEL, device=device) / (3 * KERNEL * KERNEL) ** 0.5
    bias = torch.randn(COUT, device=device) * 0.1
    side = (args.size + 2 * PAD - KERNEL) // 2 + 1
    relu = activation_args("Relu")
    results: dict[str, dict] = {}

    def record(name: str, ms: float, note: str = "", rows=None) -> None:
        results[name] = {"ms": ms, "note": note, **({"configs": rows} if rows else {})}
        print(f"{name:<44} {ms:8.4f} ms  {note}", flush=True)

    xh, wh, bh = x.half(), w.half(), bias.half()
    ref = torch.relu(F.conv2d(xh.float(), wh.float(), bias, stride=2, padding=PAD))

    def error16(y: torch.Tensor) -> float:
        return ((y.float() - ref).abs().max() / ref.abs().max()).item()

    x_nhwc = xh.contiguous(memory_format=torch.channels_last)
    record("cast fp32 NCHW -> fp16 NHWC", timed(lambda: x.to(torch.float16, memory_format=torch.channels_last), device))
    if device.type == "cuda":
        cudnn = lambda: torch.cudnn_convolution_relu(x_nhwc, wh, bh, (2, 2), (PAD, PAD), (1, 1), 1)  # noqa: E731
    else:
        cudnn = lambda: torch.relu(F.conv2d(x_nhwc.float(), w, bias, stride=2, padding=PAD)).half()  # noqa: E731
    assert error16(cudnn()) < 2e-3
    record("cuDNN fused fp16 conv", timed(cudnn, device))

    begin, taps = blocked_pads([PAD, PAD]), blocked_taps((KERNEL, KERNEL), [PAD, PAD])[1]
    after = max(0, side + taps - 1 - begin[1] - args.size // 2)
    columns = (begin[1], after)
    record("blocking pass fp16", timed(lambda: blocked_input(x, torch.float16, columns=columns), device))
    xb = blocked_input(x, torch.float16)
    xbc = blocked_input(x, torch.float16, columns=columns)
    view = column_taps(xbc, taps, side)
    wb = blocked_weight(wh, [PAD, PAD])
    out = torch.empty(
        args.batch, COUT, side, side, dtype=torch.float16, device=device, memory_format=torch.channels_last
    )
    space = tma_configs(0) + conv_configs(0)
    forms = {
        "per tap (16 ch)": (xb, pack_weight(wb, 1), begin, 16),
        "per row of taps (64 ch)": (view, pack_weight(column_tap_weight(wb), 1), [begin[0], 0], 16 * taps),
    }
    for form, (xin, packed, pads, channels) in forms.items():

        def run(cfg, xin=xin, packed=packed, pads=pads):
            out.fill_(float("nan"))
            return conv2d_nhwc(
                xin, packed, bh, None, out=out, out_hw=(side, side), pads_begin=pads, post=relu, config=cfg
            )

        ms, cfg, rows = best(run, error16, 2e-3, fit_configs(space, channels, COUT), device)
        record(f"s2d conv fp16, {form}", ms, cfg, rows)

    # int8: the input quantized by the blocking pass, an int8 output (a chained stem)
    sx = x.abs().amax().item() / 127
    sy = ref.abs().amax().item() / 127
    record("blocking pass int8", timed(lambda: blocked_input(x, torch.int8, columns=columns, scale=sx), device))
    view8 = column_taps(blocked_input(x, torch.int8, columns=columns, scale=sx), taps, side)
    wq, ws = quantize_weight(wb.float(), "int8")  # the same per-channel scales as the 7×7 weight's
    w_steps, _ = quantize_weight(wh.float(), "int8")
    ws = ws.to(device)
    x_steps = quantize_activation(x, sx, "int8").float()
    qref = torch.relu(F.conv2d(x_steps * sx, w_steps.float() * ws[:, None, None, None], bias, stride=2, padding=PAD))
    qref = qref.clamp(max=127 * sy)
    out8 = torch.empty(args.batch, COUT, side, side, dtype=torch.int8, device=device, memory_format=torch.channels_last)
    packed8 = pack_weight(column_tap_weight(wq), 1, k_major=True)

    def run8(cfg, source=view8, out=out8):
        """The int8 products over `source` into `out`: requantized when it is int8, else written in float."""
        out.fill_(-7 if out.dtype == torch.int8 else float("nan"))
        return conv2d_nhwc_quantized(
            source, packed8, ws, sx, bias, None, out=out, out_hw=(side, side), pads_begin=[begin[0], 0],
            post=relu, config=cfg, y_scale=sy if out.dtype == torch.int8 else 0.0,
        )  # fmt: skip

    def error8(y: torch.Tensor) -> float:  # in output steps, against the same quantized operands
        return ((y.float() * sy - qref).abs().max() / sy).item()

    quantized = tma_configs(0, quantized=True) + quantized_conv_configs(0)
    fitted8 = fit_configs(quantized, 16 * taps, COUT, 32)
    ms, cfg, rows = best(run8, error8, 1.01, fitted8, device)
    record("s2d conv int8 -> int8, per row of taps", ms, cfg, rows)

    # Probes of what bounds that layer: the same values from a dense copy of the overlapping view (4x the bytes,
    # but rows the loads do not share), and the same product written in fp16 (2x the bytes out, no requantizing)
    dense8 = view8.contiguous(memory_format=torch.channels_last)
    out16 = torch.empty_like(out8, dtype=torch.float16)

    def error8_fp16(y: torch.Tensor) -> float:
        return ((y.float() - qref).abs().max() / sy).item()

    ms, cfg, rows = best(lambda c: run8(c, source=dense8), error8, 1.01, fitted8, device)
    record("probe: int8 -> int8 from a dense copy of the view", ms, cfg, rows)
    ms, cfg, rows = best(lambda c: run8(c, out=out16), error8_fp16, 1.01, fitted8, device)
    record("probe: int8 -> fp16 (no requantizing)", ms, cfg, rows)
    swapped = [c for c in fit_configs(tma_configs(1, quantized=True), 16 * taps, COUT, 32) if c["swap"]]
    swapped += [{**c, "num_stages": 4} for c in swapped]
    ms, cfg, rows = best(run8, error8, 1.01, swapped, device)
    record("probe: int8 -> int8, tiles computed transposed", ms, cfg, rows)
    if device.type == "cuda" and GemmConfig is not None:
        packed_ws = pack_conv_weight(column_tap_weight(wq))
        rows_of_taps = blocked_taps((KERNEL, KERNEL), [PAD, PAD])[0]

        def run_ws(cfg):
            out8.fill_(-7)
            return conv_ws(
                view8, packed_ws, out8, GemmConfig(**cfg), kernel=(rows_of_taps, 1), pads=(begin[0], 0),
                scale=(ws.double() * sx).float(), bias=bias, post=relu, quant_y=1, y_inv_scale=1 / sy,
            )  # fmt: skip

        gluon = fit_configs(gemm_ws_configs(1, quantized=True), 16 * taps, COUT, 32)
        named = "{block_m}x{block_n}x{block_k} s{stages} c{consumers} w{num_warps}".format_map
        ms, cfg, rows = best(run_ws, error8, 1.01, gluon, device, named)
        record("s2d conv int8 -> int8, Gluon warp-specialized", ms, cfg, rows)

    for name, dtype, scale in (("fp16", torch.float16, None), ("int8", torch.int8, sx)):
        want = blocked_input(x, dtype, columns=columns, scale=scale)
        got = torch.empty_like(want)

        def block(tile, got=got, scale=scale):
            got.fill_(-7)
            return space_to_depth(x, got, columns, scale, block_j=tile[0], num_warps=tile[1])

        ms, tile, rows = exact_best(block, want, BLOCKING_TILES, lambda t: f"{t[0]} pixels, {t[1]} warps", device)
        record(f"blocking pass {name}, best tile", ms, tile, rows)

    stem = cudnn()
    record("max pool 3x3/2 fp16 (torch)", timed(lambda: F.max_pool2d(stem, 3, 2, 1), device))
    stem8 = quantize_activation(stem.float(), sy, "int8").contiguous(memory_format=torch.channels_last)
    for name, source in (("fp16", stem), ("int8", stem8)):
        want = F.max_pool2d(source.float(), 3, 2, 1).to(source.dtype)

        def pool(cfg, source=source, side=want.shape[2:]):
            return max_pool2d(source, (3, 3), (2, 2), (1, 1), (1, 1), side, **cfg)

        describe_pool = "{block_p}x{block_c}, {num_warps} warps".format_map
        ms, tile, rows = exact_best(pool, want, pool_configs(1), describe_pool, device)
        record(f"max pool 3x3/2 {name} (ours), best tile", ms, tile, rows)

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "batch": args.batch,
        "size": args.size,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "date": time.strftime("%Y-%m-%d"),
    }
    (args.out / f"stem-b{args.batch}.json").write_text(json.dumps({**meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
