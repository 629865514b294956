"""What promoting E4M3 sums costs and buys: the Gluon warp-specialized GEMM (`kernels.gluon.gemm`) on E4M3 operands
with its sums promoted into float32 after every K step (`GemmConfig.promote`, the default: exact to float32, but
ptxas serializes the tensor-core pipeline) and without (the tensor cores' own accumulation over the whole K, about
14 bits: an error that grows with K), beside int8 and fp16 operands of the same product, in one run.

Operands as an engine quantizes them: activations N(0, 1) onto E4M3 with one scale (amax to 448), weights per
output row; the reference is their product in float64. For each product the error of each form (max-norm
relative, as the autotuner's check measures it, against its bound `FP8_PRODUCTS_TOLERANCE`), the error the
operands' own rounding to E4M3 makes (the float64 product of the unrounded values against the reference), and the
fastest effort-0 config's median time (16-bit outputs; the errors are taken on float32 ones).

    python bench/fp8_accumulation.py --out DIR      (writes fp8-accumulation.json, prints a table)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tensorforge.kernels.gluon.gemm import GemmConfig, gemm_ws
from tensorforge.tactics.autotune import FP8_PRODUCTS_TOLERANCE
from tensorforge.tactics.gluon_gemm import gemm_ws_configs
from tensorforge.tactics.timing import measure

# (name, M, K, N): BERT-base's products at batch 64 and sequence 128, and ResNet-50's widest 1×1 and 3×3 as
# products over pixel rows at batch 256 (a 3×3's K is 9·C).
PRODUCTS = [
    ("bert qkv", 8192, 768, 2304),
    ("bert ff1", 8192, 768, 3072),
    ("bert ff2", 8192, 3072, 768),
    ("resnet layer3 1x1", 256 * 14 * 14, 1024, 256),
    ("resnet layer3 3x3", 256 * 14 * 14, 9 * 256, 256),
    ("resnet layer4 3x3", 256 * 7 * 7, 9 * 512, 512),
]


def _onto_e4m3(x: torch.Tensor, dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` on E4M3's grid with amax scaled to 448 (per tensor, or per row along `dim`), and the scale."""
    amax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    scale = amax.float() / 448.0
    return (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def _fastest(a: torch.Tensor, b: torch.Tensor, y: torch.Tensor, configs: list[GemmConfig]) -> tuple[float, dict]:
    """The fastest of `configs` for y = a @ bᵀ: (median ms, config)."""
    best = (math.inf, {})
    for config in configs:
        ms = measure(lambda c=config: gemm_ws(a, b, y, c), device=a.device, warmup=3, repeats=20).median
        if ms < best[0]:
            best = (ms, config.__dict__)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="M multiplier (small values check the script)")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    device = torch.device("cuda")
    quantized = [GemmConfig(**row) for row in gemm_ws_configs(0, quantized=True)]
    wide = [GemmConfig(**row) for row in gemm_ws_configs(0)]
    rows = []
    header = f"{'product':<20}{'K':>6}{'err promoted':>14}{'err own':>10}{'err E4M3 in':>13}"
    print(header + f"{'ms promoted':>13}{'ms own':>9}{'ms int8':>9}{'ms fp16':>9}", flush=True)
    for name, m, k, n in PRODUCTS:
        m = max(128, int(m * args.scale))
        torch.manual_seed(0)
        a, b = torch.randn(m, k, device=device), torch.randn(n, k, device=device) / k**0.5
        a8, a_scale = _onto_e4m3(a, None)
        b8, b_scale = _onto_e4m3(b, 1)
        want = a8.double() @ b8.double().T
        rounding = _error((a.double() / a_scale.double()) @ (b.double() / b_scale.double()).T, want)
        y, y16 = torch.empty(m, n, device=device), torch.empty(m, n, device=device, dtype=torch.float16)
        errors = {}
        for promote in (True, False):
            y.fill_(float("nan"))
            gemm_ws(a8, b8, y, GemmConfig(**{**quantized[0].__dict__, "promote": promote}))
            errors[promote] = _error(y, want)
        times = {}
        for promote in (True, False):
            configs = [GemmConfig(**{**c.__dict__, "promote": promote}) for c in quantized]
            times[promote] = _fastest(a8, b8, y16, configs)
        a_i8 = torch.randint(-127, 128, (m, k), device=device, dtype=torch.int8)
        b_i8 = torch.randint(-127, 128, (n, k), device=device, dtype=torch.int8)
        int8 = _fastest(a_i8, b_i8, y16, quantized)
        fp16 = _fastest(a.half(), b.half(), y16, wide)
        row = {
            "product": name, "m": m, "k": k, "n": n, "error_promoted": errors[True], "error_own": errors[False],
            "error_e4m3_inputs": rounding, "ms_promoted": times[True][0], "config_promoted": times[True][1],
            "ms_own": times[False][0], "config_own": times[False][1], "ms_int8": int8[0], "ms_fp16": fp16[0],
        }  # fmt: skip
        rows.append(row)
        print(f"{name:<20}{k:>6}{errors[True]:>14.2e}{errors[False]:>10.2e}{rounding:>13.2e}{times[True][0]:>13.4f}"
              f"{times[False][0]:>9.4f}{int8[0]:>9.4f}{fp16[0]:>9.4f}", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "bound": FP8_PRODUCTS_TOLERANCE}
    (args.out / "fp8-accumulation.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
