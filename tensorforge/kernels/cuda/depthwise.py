"""Depthwise 2-D convolution on channels_last tensors in CUDA C, with the fused-conv epilogue.

`y = post(pre(depthwise(x, w) + bias) + z)`, one filter per channel (group == C == output channels). A thread
owns `VEC` consecutive channels (one vector load per input cell) and `PX` consecutive output pixels of a row,
accumulated in float32: for each window row it loads the row's input cells those pixels share once
((PX - 1)·SW + (KW - 1)·DW + 1 of them, against KW·PX loads tap by tap: 14 against 56 for a 7×7 filter and 8
pixels) and its channels' KW taps, then makes every product from registers. Threads of a block side by side in
channels make every load and store coalesced; `rows` threads per block stack along pixels.

Two kernels share that scheme: `depthwise_nhwc` reads its cells from global memory (L1/L2 serve the overlap
between threads), `depthwise_tiled_nhwc` first stages its block's input patch in shared memory. On the H200
the first ran ConvNeXt's 56×56 7×7 layer at batch 64 no faster than cuDNN (0.18-0.24 ms for 77 MB: latency
bound, every thread waiting on its window rows' loads), which is what the second is for.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .nvrtc import cuda_kernel
from .source import PRELUDE, check_operands, nhwc_output, storage_code

# The part both kernels share: a thread's PX outputs × VEC channels from a window row's cells, and their epilogue.
_RUN = r"""
constexpr int SPAN = (PX - 1) * SW + (KW - 1) * DW + 1;  // input cells of a window row that PX outputs read

// acc[p] += cells[p·SW + kw·DW] · taps[kw] for one window row, its KW taps loaded from `taps_row` (C apart).
__device__ __forceinline__ void accumulate_row(float (&acc)[PX][VEC], const float (&cells)[SPAN][VEC],
                                               const store_t* __restrict__ taps_row, int C) {
  float taps[KW][VEC];
#pragma unroll
  for (int kw = 0; kw < KW; ++kw) load_vec(taps_row + (long long)kw * C, taps[kw]);
#pragma unroll
  for (int kw = 0; kw < KW; ++kw)
#pragma unroll
    for (int p = 0; p < PX; ++p)
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[p][v] = fmaf(cells[p * SW + kw * DW][v], taps[kw][v], acc[p][v]);
}

// post(pre(acc + bias) + z) for the first `valid` of a thread's PX outputs, output p at out + p·C (one vector
// store each); `bias` points at the thread's channels.
__device__ __forceinline__ void finish_run(const float (&acc)[PX][VEC], const store_t* __restrict__ bias,
                                           const store_t* __restrict__ z, store_t* __restrict__ y, long long out,
                                           int valid, int C, float pre0, float pre1, float post0, float post1) {
  float b[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) b[v] = 0.f;
#if HAS_BIAS
  load_vec(bias, b);
#endif
#pragma unroll
  for (int p = 0; p < PX; ++p) {
    if (p >= valid) break;
    const long long at = out + (long long)p * C;
    float r[VEC];
#if HAS_RES
    load_vec(z + at, r);
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
    store_vec(y + at, result);
  }
}
"""

SOURCE = (
    PRELUDE
    + _RUN
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
    accumulate_row(acc, cells, w + (long long)kh * KW * C + c0, C);
  }
  finish_run(acc, bias + c0, z, y, (((long long)n * OH + oh) * OW + ow0) * C + c0, OW - ow0, C, pre0, pre1, post0,
             post1);
}
"""
)


# The tiled variant: a block stages the input patch of a TH×TW tile of output pixels × CB channels (with its halo,
# zero outside the image) in shared memory as float32, once, then each thread makes PX pixels × VEC channels of
# the tile from there, with the same row-of-cells reuse as above. Each input cell crosses from L2 once per tile
# (1 + halo) instead of once per window row of every thread, and converts to float32 once.
TILED_SOURCE = (
    PRELUDE
    + _RUN
    + r"""
#define PTH ((TH - 1) * SH + (KH - 1) * DH + 1)
#define PTW ((TW - 1) * SW + (KW - 1) * DW + 1)
#define LANES (CB / VEC)

__device__ __forceinline__ void put_shared(float* s, const float* v) {
#if VEC == 4
  float4 t; t.x = v[0]; t.y = v[1]; t.z = v[2]; t.w = v[3]; *reinterpret_cast<float4*>(s) = t;
#elif VEC == 2
  float2 t; t.x = v[0]; t.y = v[1]; *reinterpret_cast<float2*>(s) = t;
#else
  s[0] = v[0];
#endif
}

__device__ __forceinline__ void get_shared(const float* s, float* v) {
#if VEC == 4
  const float4 t = *reinterpret_cast<const float4*>(s); v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
#elif VEC == 2
  const float2 t = *reinterpret_cast<const float2*>(s); v[0] = t.x; v[1] = t.y;
#else
  v[0] = s[0];
#endif
}

extern "C" __global__ void depthwise_tiled_nhwc(
    const store_t* __restrict__ x, const store_t* __restrict__ w, const store_t* __restrict__ bias,
    const store_t* __restrict__ z, store_t* __restrict__ y,
    int N, int H, int W, int C, int OH, int OW, int PH, int PW, int tiles_h, int tiles_w,
    float pre0, float pre1, float post0, float post1) {
  extern __shared__ float patch[];  // [PTH][PTW][CB]
  const int tile = blockIdx.x;
  const int tw = tile % tiles_w, th = (tile / tiles_w) % tiles_h, n = tile / (tiles_w * tiles_h);
  const int c0 = blockIdx.y * CB;
  const int ih0 = th * TH * SH - PH, iw0 = tw * TW * SW - PW;
  for (int e = threadIdx.x; e < PTH * PTW * LANES; e += blockDim.x) {
    const int lane = e % LANES, cell = e / LANES, r = cell / PTW, q = cell % PTW;
    const int ih = ih0 + r, iw = iw0 + q, c = c0 + lane * VEC;
    float v[VEC];
    if (c < C && ih >= 0 && ih < H && iw >= 0 && iw < W) {
      load_vec(x + (((long long)n * H + ih) * W + iw) * C + c, v);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = 0.f;
    }
    put_shared(patch + cell * CB + lane * VEC, v);
  }
  __syncthreads();
  const int lane = threadIdx.x % LANES, run = threadIdx.x / LANES;
  const int ty = run / (TW / PX), tx0 = (run % (TW / PX)) * PX;
  const int oh = th * TH + ty, ow0 = tw * TW + tx0, c = c0 + lane * VEC;
  if (c >= C || oh >= OH || ow0 >= OW) return;
  float acc[PX][VEC];
#pragma unroll
  for (int p = 0; p < PX; ++p)
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[p][v] = 0.f;
#pragma unroll
  for (int kh = 0; kh < KH; ++kh) {
    const float* row = patch + ((ty * SH + kh * DH) * PTW + tx0 * SW) * CB + lane * VEC;
    float cells[SPAN][VEC];
#pragma unroll
    for (int s = 0; s < SPAN; ++s) get_shared(row + s * CB, cells[s]);
    accumulate_row(acc, cells, w + (long long)kh * KW * C + c, C);
  }
  finish_run(acc, bias + c, z, y, (((long long)n * OH + oh) * OW + ow0) * C + c, OW - ow0, C, pre0, pre1, post0,
             post1);
}
"""
)


def depthwise_configs(effort: int) -> list[dict[str, int]]:
    """Two kernels' configurations. Per thread rows (`depthwise_nhwc`): px output pixels per thread, lanes of
    channel vectors per block, rows of threads per block. Tiled (`depthwise_tiled_nhwc`): a th×tw output tile
    × cb channels per block, px pixels per thread (tw a multiple of px)."""
    configs = [
        {"px": 4, "lanes": 32, "rows": 4},
        {"th": 8, "tw": 8, "px": 4, "cb": 32},
        {"th": 8, "tw": 16, "px": 8, "cb": 32},
    ]
    if effort >= 1:
        configs += [{"px": px, "lanes": lanes, "rows": 128 // lanes} for px in (2, 8) for lanes in (8, 32)]
        configs += [
            {"th": 4, "tw": 16, "px": 4, "cb": 32},
            {"th": 8, "tw": 8, "px": 8, "cb": 64},
            {"th": 16, "tw": 8, "px": 4, "cb": 16},
            {"th": 4, "tw": 8, "px": 2, "cb": 32},
        ]
    if effort >= 2:
        configs += [{"px": 1, "lanes": 32, "rows": 8}, {"px": 16, "lanes": 8, "rows": 16}]
        configs += [{"th": 8, "tw": 16, "px": 4, "cb": 16}, {"th": 2, "tw": 8, "px": 1, "cb": 64}]
    return configs


def tiled_shared_bytes(kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], config: dict) -> int:
    """Shared memory of a tiled block: the float32 patch of its output tile with the halo, cb channels deep."""
    patch_h = (config["th"] - 1) * strides[0] + (kernel[0] - 1) * dilations[0] + 1
    patch_w = (config["tw"] - 1) * strides[1] + (kernel[1] - 1) * dilations[1] + 1
    return 4 * patch_h * patch_w * config["cb"]


def pack_depthwise_weight(w: torch.Tensor) -> torch.Tensor:
    """W (C, 1, KH, KW) as (KH·KW, C), channels contiguous."""
    if w.dim() != 4 or w.shape[1] != 1:
        raise ValueError(f"a depthwise weight is (C, 1, KH, KW), got {list(w.shape)}")
    return w.reshape(w.shape[0], -1).t().contiguous()


def vector_width(channels: int, dtype: torch.dtype) -> int:
    """Channels per load: 16 bytes' worth at most (4 floats or 4 halves), dividing C."""
    return next(v for v in (4, 2, 1) if channels % v == 0)


_SHARED_LIMIT = 96 * 1024


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
    defines = {
        "DT": storage_code(x.dtype), "VEC": vec, "PX": config["px"], "PRE": pre[0], "POST": post[0],
        "KH": kernel[0], "KW": kernel[1], "SH": strides[0], "SW": strides[1], "DH": dilations[0], "DW": dilations[1],
        "HAS_BIAS": int(bias is not None), "HAS_RES": int(residual is not None),
    }  # fmt: skip
    args = [x, w_packed, bias, residual, y, n, h, w, c, oh, ow, pads_begin[0], pads_begin[1]]
    activations = [pre[1], pre[2], post[1], post[2]]
    if "th" in config:
        th, tw, px, cb = config["th"], config["tw"], config["px"], config["cb"]
        threads = (cb // vec) * th * (tw // px)
        smem = tiled_shared_bytes(kernel, strides, dilations, config)
        if tw % px or cb % vec or threads > 1024 or smem > _SHARED_LIMIT:
            raise ValueError(
                f"depthwise_conv2d: tile {config} does not fit ({threads} threads of {vec} channels, {smem} B of "
                f"shared memory for a {list(kernel)} filter; tw must be a multiple of px)"
            )
        tiled = {**defines, "TH": th, "TW": tw, "CB": cb}
        compiled = cuda_kernel(TILED_SOURCE, "depthwise_tiled_nhwc", tiled, x.device, smem)
        tiles_h, tiles_w = -(-oh // th), -(-ow // tw)
        grid = (n * tiles_h * tiles_w, -(-c // cb))
        compiled.launch(grid, (threads,), [*args, tiles_h, tiles_w, *activations], x.device)
        return y
    compiled = cuda_kernel(SOURCE, "depthwise_nhwc", defines, x.device)
    lanes, rows, px = config["lanes"], config["rows"], config["px"]
    runs = n * oh * -(-ow // px)
    grid = (-(-runs // rows), -(-(c // vec) // lanes))
    compiled.launch(grid, (lanes, rows), [*args, *activations], x.device)
    return y
