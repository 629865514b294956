"""Winograd F(2×2, 3×3) convolution for 3×3 stride-1 layers: CUDA C transforms around a batched GEMM.

For every 2×2 output tile, with input tile d (4×4), filter g (3×3) and
    Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
    G = [[1, 0, 0], [½, ½, ½], [½, -½, ½], [0, 0, 1]],  Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]],
the output is Y = Aᵀ [ Σ_c (G g Gᵀ) ⊙ (Bᵀ d B) ] A: 16 multiplications per tile and channel pair instead of 36.
`pack_winograd_weight` computes U = G g Gᵀ once, as 16 matrices (C, K). A run is three steps on the current
stream: the input transform (one thread per tile and channel, reads channels_last, writes V as 16 matrices
(P tiles, C)), 16 GEMMs M = V·U (cuBLAS through torch, tensor cores in half precision), and the output transform
with the fused-conv epilogue (bias, pre, residual, post), written channels_last. It trades 2.25× fewer
multiplications for V and M round trips through memory, so it pays on compute-bound layers (many channels,
few pixels) and loses on memory-bound ones; the autotuner decides.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .nvrtc import cuda_kernel
from .source import PRELUDE, check_operands, nhwc_output, storage_code

SOURCE = (
    PRELUDE
    + r"""
extern "C" __global__ void winograd_input(
    const store_t* __restrict__ x, store_t* __restrict__ v,
    int N, int H, int W, int C, int TH, int TW, int PH, int PW) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  const long long p = (long long)blockIdx.x * blockDim.y + threadIdx.y;
  const long long P = (long long)N * TH * TW;
  if (c >= C || p >= P) return;
  const int tw = (int)(p % TW), th = (int)((p / TW) % TH), n = (int)(p / ((long long)TW * TH));
  const int h0 = th * 2 - PH, w0 = tw * 2 - PW;
  float d[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int h = h0 + i, w = w0 + j;
      d[i][j] = (h >= 0 && h < H && w >= 0 && w < W) ? to_f(x[(((long long)n * H + h) * W + w) * C + c]) : 0.f;
    }
  float t[4][4];  // Bᵀ d
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    t[0][j] = d[0][j] - d[2][j];
    t[1][j] = d[1][j] + d[2][j];
    t[2][j] = d[2][j] - d[1][j];
    t[3][j] = d[1][j] - d[3][j];
  }
  const long long stride = P * C;
  store_t* out = v + p * C + c;
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // (Bᵀ d) B
    out[(i * 4 + 0) * stride] = to_store(t[i][0] - t[i][2]);
    out[(i * 4 + 1) * stride] = to_store(t[i][1] + t[i][2]);
    out[(i * 4 + 2) * stride] = to_store(t[i][2] - t[i][1]);
    out[(i * 4 + 3) * stride] = to_store(t[i][1] - t[i][3]);
  }
}

extern "C" __global__ void winograd_output(
    const store_t* __restrict__ m, const store_t* __restrict__ bias, const store_t* __restrict__ z,
    store_t* __restrict__ y, int N, int K, int OH, int OW, int TH, int TW,
    float pre0, float pre1, float post0, float post1) {
  const int k = blockIdx.y * blockDim.x + threadIdx.x;
  const long long p = (long long)blockIdx.x * blockDim.y + threadIdx.y;
  const long long P = (long long)N * TH * TW;
  if (k >= K || p >= P) return;
  const int tw = (int)(p % TW), th = (int)((p / TW) % TH), n = (int)(p / ((long long)TW * TH));
  const long long stride = P * K;
  float a[4][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) a[i / 4][i % 4] = to_f(m[i * stride + p * K + k]);
  float t[2][4];  // Aᵀ M
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    t[0][j] = a[0][j] + a[1][j] + a[2][j];
    t[1][j] = a[1][j] - a[2][j] - a[3][j];
  }
  float b = 0.f;
#if HAS_BIAS
  b = to_f(bias[k]);
#endif
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int oh = th * 2 + i;
    if (oh >= OH) break;
    const float r[2] = {t[i][0] + t[i][1] + t[i][2], t[i][1] - t[i][2] - t[i][3]};  // (Aᵀ M) A
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int ow = tw * 2 + j;
      if (ow >= OW) break;
      const long long at = (((long long)n * OH + oh) * OW + ow) * K + k;
      float value = activate<PRE>(r[j] + b, pre0, pre1);
#if HAS_RES
      value += to_f(z[at]);
#endif
      y[at] = to_store(activate<POST>(value, post0, post1));
    }
  }
}
"""
)

_G = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]], dtype=torch.float64)


def winograd_configs(effort: int) -> list[dict[str, int]]:
    """Threads per block of the transforms: `lanes` along channels × `rows` along tiles."""
    return [{"lanes": 64, "rows": 4}] if effort <= 0 else [{"lanes": 32, "rows": 8}, {"lanes": 64, "rows": 4}]


def pack_winograd_weight(w: torch.Tensor) -> torch.Tensor:
    """W (K, C, 3, 3) as U = G g Gᵀ per (k, c), arranged (16, C, K), in W's dtype (computed in float64)."""
    if w.dim() != 4 or tuple(w.shape[2:]) != (3, 3):
        raise ValueError(f"Winograd F(2x2, 3x3) takes (K, C, 3, 3) weights, got {list(w.shape)}")
    g = _G.to(w.device)
    u = torch.einsum("ai,kcij,bj->abck", g, w.double(), g)  # (4, 4, C, K)
    return u.reshape(16, w.shape[1], w.shape[0]).to(w.dtype).contiguous()


def _kernels(x: torch.Tensor, pre: int, post: int, has_bias: bool, has_residual: bool):
    defines = {"DT": storage_code(x.dtype), "VEC": 1, "PRE": pre, "POST": post, "HAS_BIAS": int(has_bias),
               "HAS_RES": int(has_residual)}  # fmt: skip
    return cuda_kernel(SOURCE, "winograd_input", defines, x.device), cuda_kernel(
        SOURCE, "winograd_output", defines, x.device
    )


def winograd_conv2d(
    x: torch.Tensor,
    u: torch.Tensor,
    kernel: Sequence[int] = (3, 3),
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
    """3×3 stride-1 convolution of channels_last `x` (N, C, H, W) with `u` from `pack_winograd_weight`."""
    if tuple(kernel) != (3, 3) or tuple(strides) != (1, 1) or tuple(dilations) != (1, 1):
        raise ValueError(f"Winograd F(2x2, 3x3) needs 3x3 stride-1 undilated filters, got {kernel} {strides}")
    config = config or winograd_configs(0)[0]
    n, c, h, w = x.shape
    oh, ow = out_hw
    k = u.shape[2]
    if tuple(u.shape[:2]) != (16, c):
        raise ValueError(f"winograd_conv2d: transformed weight {list(u.shape)} does not fit {c} input channels")
    check_operands(x, "winograd_conv2d", weight=u, bias=bias, residual=residual)
    y = nhwc_output(x, (n, k, oh, ow), out, "winograd_conv2d")
    if residual is not None:
        residual = residual.contiguous(memory_format=torch.channels_last)
    if y.numel() == 0:
        return y
    tiles_h, tiles_w = -(-oh // 2), -(-ow // 2)
    tiles = n * tiles_h * tiles_w
    forward, backward = _kernels(x, pre[0], post[0], bias is not None, residual is not None)
    lanes, rows = config["lanes"], config["rows"]
    v = torch.empty((16, tiles, c), dtype=x.dtype, device=x.device)
    forward.launch(
        (-(-tiles // rows), -(-c // lanes)), (lanes, rows),
        [x, v, n, h, w, c, tiles_h, tiles_w, pads_begin[0], pads_begin[1]], x.device,
    )  # fmt: skip
    m = torch.bmm(v, u)  # (16, P, K)
    backward.launch(
        (-(-tiles // rows), -(-k // lanes)), (lanes, rows),
        [m, bias, residual, y, n, k, oh, ow, tiles_h, tiles_w, pre[1], pre[2], post[1], post[2]], x.device,
    )  # fmt: skip
    return y
