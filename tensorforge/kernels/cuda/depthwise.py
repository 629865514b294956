"""Depthwise 2-D convolution on channels_last tensors in CUDA C, with the fused-conv epilogue.

`y = post(pre(depthwise(x, w) + bias) + z)`, one filter per channel (group == C == output channels). A thread
owns `VEC` consecutive channels (one vector load per input cell) and `PX` consecutive output pixels of a row,
accumulated in float32: for each window row it loads the row's input cells those pixels share once
((PX - 1)·SW + (KW - 1)·DW + 1 of them, against KW·PX loads tap by tap: 14 against 56 for a 7×7 filter and 8
pixels) and its channels' KW taps, then makes every product from registers. Threads of a block side by side in
channels make every load and store coalesced; `rows` threads per block stack along pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .nvrtc import CudaKernel, compile_cubin, device_arch
from .source import PRELUDE, check_operands, nhwc_output, storage_code

SOURCE = (
    PRELUDE
    + r"""
extern "C" __global__ void depthwise_nhwc(
    const store_t* __restrict__ x, const store_t* __restrict__ w, const store_t* __restrict__ bias,
    const store_t* __restrict__ z, store_t* __restrict__ y,
    int N, int H, int W, int C, int OH, int OW, int PH, int PW,
    float pre0, float pre1, float post0, float post1) {
  const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
  const int runs = (OW + PX - 1) / PX;
  const long long run = (long long)blockIdx.x * blockDim.y + threadIdx.y;
  if (c0 >= C || run >= (long long)N * OH * runs) return;
  const int ow0 = (int)(run % runs) * PX;
  const int oh = (int)((run / runs) % OH);
  const int n = (int)(run / ((long long)runs * OH));
  // The SPAN input cells of a window row feed all PX outputs: cell s is column iw0 + s, and output p's tap kw
  // is cell p * SW + kw * DW. Each cell is loaded once per row (not once per tap and output), the row's taps
  // once per thread.
  constexpr int SPAN = (PX - 1) * SW + (KW - 1) * DW + 1;
  const int iw0 = ow0 * SW - PW;
  float acc[PX][VEC];
#pragma unroll
  for (int p = 0; p < PX; ++p)
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[p][v] = 0.f;
#pragma unroll
  for (int kh = 0; kh < KH; ++kh) {
    const int ih = oh * SH - PH + kh * DH;
    if (ih < 0 || ih >= H) continue;
    const store_t* row = x + ((long long)n * H + ih) * W * C + c0;
    float taps[KW][VEC];
#pragma unroll
    for (int kw = 0; kw < KW; ++kw) load_vec(w + (long long)(kh * KW + kw) * C + c0, taps[kw]);
    float cells[SPAN][VEC];
#pragma unroll
    for (int s = 0; s < SPAN; ++s) {
      const int iw = iw0 + s;
      if (iw >= 0 && iw < W) {
        load_vec(row + (long long)iw * C, cells[s]);
      } else {
#pragma unroll
        for (int v = 0; v < VEC; ++v) cells[s][v] = 0.f;
      }
    }
#pragma unroll
    for (int kw = 0; kw < KW; ++kw)
#pragma unroll
      for (int p = 0; p < PX; ++p)
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[p][v] = fmaf(cells[p * SW + kw * DW][v], taps[kw][v], acc[p][v]);
  }
  float b[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) b[v] = 0.f;
#if HAS_BIAS
  load_vec(bias + c0, b);
#endif
#pragma unroll
  for (int p = 0; p < PX; ++p) {
    if (ow0 + p >= OW) break;
    const long long out = (((long long)n * OH + oh) * OW + ow0 + p) * C + c0;
    float r[VEC];
#if HAS_RES
    load_vec(z + out, r);
#endif
    float result[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      float a = activate<PRE>(acc[p][v] + b[v], pre0, pre1);
#if HAS_RES
      a += r[v];
#endif
      result[v] = activate<POST>(a, post0, post1);
    }
    store_vec(y + out, result);
  }
}
"""
)


def depthwise_configs(effort: int) -> list[dict[str, int]]:
    """(px output pixels per thread, lanes of channel vectors per block, rows of threads per block). Effort 0:
    4 pixels a thread in 32 lanes, and 8 pixels (more reuse of a row's cells under wide filters) in 8 lanes
    (32 channels of 4: no idle lane for 96, 480 or 672 channels)."""
    configs = [{"px": 4, "lanes": 32, "rows": 4}, {"px": 8, "lanes": 8, "rows": 16}]
    if effort >= 1:
        configs += [{"px": px, "lanes": lanes, "rows": 128 // lanes} for px in (2, 4, 8) for lanes in (16, 64)]
        configs += [{"px": 2, "lanes": 32, "rows": 4}, {"px": 8, "lanes": 32, "rows": 4}]
    if effort >= 2:
        configs += [
            {"px": 1, "lanes": 32, "rows": 8},
            {"px": 16, "lanes": 8, "rows": 16},
            {"px": 4, "lanes": 8, "rows": 32},
        ]
    return configs


def pack_depthwise_weight(w: torch.Tensor) -> torch.Tensor:
    """W (C, 1, KH, KW) as (KH·KW, C), channels contiguous."""
    if w.dim() != 4 or w.shape[1] != 1:
        raise ValueError(f"a depthwise weight is (C, 1, KH, KW), got {list(w.shape)}")
    return w.reshape(w.shape[0], -1).t().contiguous()


def vector_width(channels: int, dtype: torch.dtype) -> int:
    """Channels per load: 16 bytes' worth at most (4 floats or 4 halves), dividing C."""
    return next(v for v in (4, 2, 1) if channels % v == 0)


def compile_depthwise(
    dtype: torch.dtype, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], pre: int, post: int,
    has_bias: bool, has_residual: bool, vec: int, px: int, arch: str,
) -> CudaKernel:  # fmt: skip
    defines = {
        "DT": storage_code(dtype), "VEC": vec, "PX": px, "PRE": pre, "POST": post,
        "KH": kernel[0], "KW": kernel[1], "SH": strides[0], "SW": strides[1], "DH": dilations[0], "DW": dilations[1],
        "HAS_BIAS": int(has_bias), "HAS_RES": int(has_residual),
    }  # fmt: skip
    return CudaKernel(compile_cubin(SOURCE, "depthwise_nhwc", defines, arch), "depthwise_nhwc")


_KERNELS: dict[tuple[Any, ...], CudaKernel] = {}


def depthwise_conv2d(
    x: torch.Tensor,
    w_packed: torch.Tensor,
    kernel: Sequence[int],
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    strides: Sequence[int] = (1, 1),
    pads_begin: Sequence[int] = (0, 0),
    dilations: Sequence[int] = (1, 1),
    out_hw: Sequence[int],
    pre: tuple[int, float, float] = (0, 0.0, 0.0),
    post: tuple[int, float, float] = (0, 0.0, 0.0),
    config: dict[str, int] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Depthwise conv of channels_last `x` (N, C, H, W) with `w_packed` (KH·KW, C), into (N, C, *out_hw)."""
    config = config or depthwise_configs(0)[0]
    n, c, h, w = x.shape
    oh, ow = out_hw
    if w_packed.shape != (kernel[0] * kernel[1], c):
        raise ValueError(f"depthwise_conv2d: packed weight {list(w_packed.shape)} does not fit {c} channels")
    check_operands(x, "depthwise_conv2d", weight=w_packed, bias=bias, residual=residual)
    y = nhwc_output(x, (n, c, oh, ow), out, "depthwise_conv2d")
    if residual is not None:
        residual = residual.contiguous(memory_format=torch.channels_last)
    if y.numel() == 0:
        return y
    vec = vector_width(c, x.dtype)
    key = (x.device, x.dtype, tuple(kernel), tuple(strides), tuple(dilations), pre[0], post[0],
           bias is not None, residual is not None, vec, config["px"])  # fmt: skip
    compiled = _KERNELS.get(key)
    if compiled is None:
        compiled = compile_depthwise(
            x.dtype, kernel, strides, dilations, pre[0], post[0], bias is not None, residual is not None, vec,
            config["px"], device_arch(x.device),
        )  # fmt: skip
        _KERNELS[key] = compiled
    lanes, rows, px = config["lanes"], config["rows"], config["px"]
    runs = n * oh * -(-ow // px)
    grid = (-(-runs // rows), -(-(c // vec) // lanes))
    args = [x, w_packed, bias, residual, y,
            n, h, w, c, oh, ow, pads_begin[0], pads_begin[1], pre[1], pre[2], post[1], post[2]]  # fmt: skip
    compiled.launch(grid, (lanes, rows), args, x.device)
    return y
