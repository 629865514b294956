"""Device code shared by our CUDA C kernels: storage types, conversions, vector loads and the activations.

A kernel source starts with `PRELUDE`, compiled with `-D` definitions:
- `DT`: storage type of activations and weights, 0 float32, 1 float16, 2 bfloat16 (math is float32);
- `PRE`, `POST`: activation codes of `kernels.activations` (the epilogue `post(pre(acc + bias) + z)`);
- `VEC`: channels a thread loads at once (1, 2 or 4, and 8 for 16-bit types: 16 bytes at most; the caller
  guarantees alignment).
`load_vec` / `store_vec` move VEC channels in one access. Half and bfloat16 conversions are inline PTX, so no
CUDA header is needed. The host-side checks of the
kernels' operands are here too.
"""

from __future__ import annotations

import torch

from ..activations import GELU_SQUARE, GELU_T, GELU_TAIL

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

# GELU as `kernels.activations` computes it (|x| bounded by 20, past which the tail term is below 1e-80).
_HORNER = "".join(f"{c!r}f + t * (" for c in GELU_TAIL[:-1]) + f"{GELU_TAIL[-1]!r}f" + ")" * (len(GELU_TAIL) - 1)
GELU = f"""
__device__ __forceinline__ float gelu_f(float x) {{
  const float a = fminf(fabsf(x), 20.f);
  const float t = rcp_approx(1.f + {GELU_T!r}f * a);
  const float p = {_HORNER};
  return (x < 0.f ? 0.f : x) - a * t * exp2_approx(p - {GELU_SQUARE!r}f * a * a);
}}
"""

PRELUDE = (
    r"""
#if DT == 0
typedef float store_t;
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_store(float v) { return v; }
#else
typedef unsigned short store_t;
#if DT == 1
__device__ __forceinline__ float to_f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short to_store(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
#else
__device__ __forceinline__ float to_f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short to_store(float f) {
  unsigned short b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f)); return b;
}
#endif
#endif

// VEC consecutive elements of p (aligned to VEC elements) as floats.
__device__ __forceinline__ void load_vec(const store_t* p, float* out) {
#if VEC == 1
  out[0] = to_f(p[0]);
#elif DT == 0 && VEC == 2
  float2 v = *reinterpret_cast<const float2*>(p); out[0] = v.x; out[1] = v.y;
#elif DT == 0 && VEC == 4
  float4 v = *reinterpret_cast<const float4*>(p); out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
#elif VEC == 2
  unsigned int v = *reinterpret_cast<const unsigned int*>(p);
  out[0] = to_f((unsigned short)(v & 0xffffu)); out[1] = to_f((unsigned short)(v >> 16));
#elif VEC == 4
  uint2 v = *reinterpret_cast<const uint2*>(p);
  out[0] = to_f((unsigned short)(v.x & 0xffffu)); out[1] = to_f((unsigned short)(v.x >> 16));
  out[2] = to_f((unsigned short)(v.y & 0xffffu)); out[3] = to_f((unsigned short)(v.y >> 16));
#elif DT != 0 && VEC == 8
  uint4 v = *reinterpret_cast<const uint4*>(p);
  const unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = to_f((unsigned short)(words[i] & 0xffffu)); out[2 * i + 1] = to_f((unsigned short)(words[i] >> 16));
  }
#endif
}

// VEC floats stored as VEC consecutive elements of p (aligned to VEC elements), one vector store.
__device__ __forceinline__ void store_vec(store_t* p, const float* v) {
#if VEC == 1
  p[0] = to_store(v[0]);
#elif DT == 0 && VEC == 2
  float2 t; t.x = v[0]; t.y = v[1]; *reinterpret_cast<float2*>(p) = t;
#elif DT == 0 && VEC == 4
  float4 t; t.x = v[0]; t.y = v[1]; t.z = v[2]; t.w = v[3]; *reinterpret_cast<float4*>(p) = t;
#elif VEC == 2
  *reinterpret_cast<unsigned int*>(p) = (unsigned int)to_store(v[0]) | ((unsigned int)to_store(v[1]) << 16);
#elif VEC == 4
  uint2 t;
  t.x = (unsigned int)to_store(v[0]) | ((unsigned int)to_store(v[1]) << 16);
  t.y = (unsigned int)to_store(v[2]) | ((unsigned int)to_store(v[3]) << 16);
  *reinterpret_cast<uint2*>(p) = t;
#elif DT != 0 && VEC == 8
  uint4 t;
  t.x = (unsigned int)to_store(v[0]) | ((unsigned int)to_store(v[1]) << 16);
  t.y = (unsigned int)to_store(v[2]) | ((unsigned int)to_store(v[3]) << 16);
  t.z = (unsigned int)to_store(v[4]) | ((unsigned int)to_store(v[5]) << 16);
  t.w = (unsigned int)to_store(v[6]) | ((unsigned int)to_store(v[7]) << 16);
  *reinterpret_cast<uint4*>(p) = t;
#endif
}

// PTX's approximate flush-to-zero reciprocal and power of two: one MUFU each, at most 1 and 2 ulp off.
__device__ __forceinline__ float rcp_approx(float x) {
  float r; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
}
__device__ __forceinline__ float exp2_approx(float x) {
  float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
}

__device__ __forceinline__ float sigmoid_f(float x) {
  const float e = exp2_approx(-1.4426950408889634f * fabsf(x));  // never overflows
  const float r = rcp_approx(1.f + e);
  return x >= 0.f ? r : e * r;
}
"""
    + GELU
    + r"""
__device__ __forceinline__ float tanh_f(float x) { return 2.f * sigmoid_f(2.f * x) - 1.f; }

// The activations of kernels/activations.py, by code; clamps are selects so that NaN propagates.
template <int ACT>
__device__ __forceinline__ float activate(float x, float p0, float p1) {
  if constexpr (ACT == 1) return x < 0.f ? 0.f : x;
  else if constexpr (ACT == 2) return x < p0 ? p0 : (x > p1 ? p1 : x);
  else if constexpr (ACT == 3) return x >= 0.f ? x : x * p0;
  else if constexpr (ACT == 4) return sigmoid_f(x);
  else if constexpr (ACT == 5) { const float v = x * p0 + p1; return v < 0.f ? 0.f : (v > 1.f ? 1.f : v); }
  else if constexpr (ACT == 6) return x * fminf(fmaxf(x / 6.f + 0.5f, 0.f), 1.f);
  else if constexpr (ACT == 7) return x * sigmoid_f(x);
  else if constexpr (ACT == 8) return gelu_f(x);
  else if constexpr (ACT == 9) return 0.5f * x * (1.f + tanh_f(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  else if constexpr (ACT == 10) return tanh_f(x);
  else if constexpr (ACT == 11) return x * tanh_f(fmaxf(x, 0.f) + logf(1.f + expf(-fabsf(x))));
  else if constexpr (ACT == 12) return x > 0.f ? x : p0 * (expf(x) - 1.f);
  else return x;
}
"""
)


def nhwc_output(x: torch.Tensor, shape: tuple[int, ...], out: torch.Tensor | None, who: str) -> torch.Tensor:
    """`out`, checked to be a channels_last tensor of `shape` in `x`'s dtype, or a new one."""
    if out is None:
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    if tuple(out.shape) != shape or out.dtype != x.dtype or not out.is_contiguous(memory_format=torch.channels_last):
        raise ValueError(f"{who}: out must be a channels_last {x.dtype} tensor of shape {list(shape)}")
    return out


def check_operands(x: torch.Tensor, who: str, **operands: torch.Tensor | None) -> None:
    """`x` is channels_last and every present operand has its dtype."""
    if not x.is_contiguous(memory_format=torch.channels_last):
        raise ValueError(f"{who} reads channels_last (NHWC) inputs")
    for name, tensor in operands.items():
        if tensor is not None and tensor.dtype != x.dtype:
            raise ValueError(f"{who}: the {name} is {tensor.dtype}, the input {x.dtype}")


def storage_code(dtype: torch.dtype) -> int:
    try:
        return DTYPE_CODES[dtype]
    except KeyError:
        raise ValueError(f"CUDA C kernels store float32, float16 or bfloat16, not {dtype}") from None
