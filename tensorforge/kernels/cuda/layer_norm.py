"""Layer normalization of rows in CUDA C: one warp a row, the row in registers, reductions by warp shuffles.

`layer_norm_rows` reads a row of N (a compile-time constant) once, VEC elements a lane per 16-byte load, keeps it
in registers, takes the mean and then the variance of x − mean (no cancellation) with warp shuffles only (no
shared memory, no block barrier), and writes `(x − mean)·rsqrt(var + ε)·scale + bias` in one pass: a row crosses
memory once each way. A block holds `warps` rows; each row is independent, so many blocks are resident and the
loads of many rows are in flight at once. Statistics are float32 (ONNX's stash type 1); scale and bias are read
as float32 vectors (float4 loads, from L1 after the first rows).
"""

from __future__ import annotations

import torch

from .nvrtc import cuda_kernel
from .source import PRELUDE, storage_code

SOURCE = (
    PRELUDE
    + r"""
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// VEC floats from p (aligned to VEC floats): float4 or float2 loads.
__device__ __forceinline__ void load_floats(const float* __restrict__ p, float* out) {
#if VEC % 4 == 0
#pragma unroll
  for (int k = 0; k < VEC; k += 4) {
    const float4 t = *reinterpret_cast<const float4*>(p + k);
    out[k] = t.x; out[k + 1] = t.y; out[k + 2] = t.z; out[k + 3] = t.w;
  }
#elif VEC == 2
  const float2 t = *reinterpret_cast<const float2*>(p);
  out[0] = t.x; out[1] = t.y;
#else
  out[0] = p[0];
#endif
}

// ITEMS vectors of VEC elements a lane: column (i·32 + lane)·VEC of the row for item i.
extern "C" __global__ void layer_norm_rows(
    const store_t* __restrict__ x, const float* __restrict__ scale, const float* __restrict__ bias,
    store_t* __restrict__ y, int rows, float epsilon) {
  const int lane = threadIdx.x & 31;
  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const store_t* in = x + row * N;
  float v[ITEMS][VEC];
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int col = (i * 32 + lane) * VEC;
    if (col < N) {
      load_vec(in + col, v[i]);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[i][k] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) total += v[i][k];
  }
  const float mean = warp_sum(total) * (1.f / N);
  float squares = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if ((i * 32 + lane) * VEC < N) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float d = v[i][k] - mean;
        squares += d * d;
      }
    }
  }
  const float inv_std = rsqrtf(warp_sum(squares) * (1.f / N) + epsilon);
  store_t* out = y + row * N;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int col = (i * 32 + lane) * VEC;
    if (col < N) {
      float r[VEC], g[VEC];
      load_floats(scale + col, g);
#if HAS_BIAS
      float b[VEC];
      load_floats(bias + col, b);
#endif
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
#if HAS_BIAS
        r[k] = (v[i][k] - mean) * inv_std * g[k] + b[k];
#else
        r[k] = (v[i][k] - mean) * inv_std * g[k];
#endif
      }
      store_vec(out + col, r);
    }
  }
}
"""
)

LONGEST_ROW = 2048  # 64 floats a lane in registers


def layer_norm_configs(effort: int) -> list[dict[str, int]]:
    """Rows (warps) a block."""
    levels = [[4, 8], [2, 16], [1]]
    chosen = levels[: max(0, min(effort, len(levels) - 1)) + 1]
    return [{"warps": warps} for level in chosen for warps in level]


def vector_width(n: int, *tensors: torch.Tensor) -> int:
    """Elements a lane loads at once: 16 bytes' worth at most, dividing the row, every tensor aligned to it."""
    widest = 16 // tensors[0].element_size()
    return next(
        v
        for v in (8, 4, 2, 1)
        if v <= widest and n % v == 0 and all(t.data_ptr() % (v * t.element_size()) == 0 for t in tensors)
    )


def layer_norm_rows(
    x: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    epsilon: float = 1e-5,
    config: dict[str, int] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """LayerNormalization of contiguous `x` viewed as [rows, N] over its last N = scale.numel() elements, with
    float32 `scale` and `bias` of N elements, into `out` (x's shape and dtype) or a new tensor."""
    config = config or layer_norm_configs(0)[0]
    n = scale.numel()
    if not x.is_contiguous() or x.numel() % max(n, 1):
        raise ValueError(f"layer_norm_rows: x must be contiguous rows of {n} elements, got {list(x.shape)}")
    if scale.dtype != torch.float32 or (bias is not None and (bias.dtype != torch.float32 or bias.numel() != n)):
        raise ValueError("layer_norm_rows: scale and bias are float32 vectors of the row's length")
    if n > LONGEST_ROW:
        raise ValueError(f"layer_norm_rows: rows of {n} elements do not fit in registers (at most {LONGEST_ROW})")
    y = torch.empty_like(x) if out is None else out
    if y.shape != x.shape or y.dtype != x.dtype or not y.is_contiguous():
        raise ValueError(f"layer_norm_rows: out must be a contiguous {x.dtype} tensor of shape {list(x.shape)}")
    rows = x.numel() // n if n else 0
    if rows == 0:
        return y
    vec = vector_width(n, x, y)
    defines = {
        "DT": storage_code(x.dtype),
        "VEC": vec,
        "N": n,
        "ITEMS": -(-n // (32 * vec)),
        "HAS_BIAS": int(bias is not None),
    }
    kernel = cuda_kernel(SOURCE, "layer_norm_rows", defines, x.device)
    warps = config["warps"]
    kernel.launch((-(-rows // warps),), (32 * warps,), [x, scale, bias, y, rows, float(epsilon)], x.device)
    return y
