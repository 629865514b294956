"""A 2-D MaxPool on the CPU in C++, channels_last, float32, bf16, int8 or uint8 (a quantized activation's codes):

    y[n, oh, ow, c] = max over (kh, kw) of x[n, oh·s_h − p_h + kh·d_h, ow·s_w − p_w + kw·d_w, c]

taps in the padding left out (ONNX pads with −∞); a NaN in a window makes its maximum NaN, as the reference's.
Each output pixel takes its channels in chunks of 256 bytes held in registers across the window's taps, each tap
a contiguous run of the chunk's channels; threads take output rows. Plain C++ that the compiler vectorizes for the
host (`-march=native`): the maximum is a compare and a blend.

Why our own: torch's channels_last pooling took 2.9× ONNX Runtime's time on ResNet-50's max pool at batch 1 on two
AVX2 cores (`bench/layers_vs_ort.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .extension import load

DTYPES = (torch.float32, torch.bfloat16, torch.int8, torch.uint8)

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <limits>

namespace {

// The larger of a running maximum `a` and a value `b`; a NaN, once met, stays (float types only).
template <typename T>
inline T larger(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) return (b > a || b != b) ? b : a;
  else return b > a ? b : a;
}

template <typename T>
inline T lowest() {
  if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::lowest();
}

// bf16 is compared as the float32 it is the upper half of (c10::BFloat16 converts both ways exactly).
template <typename T> struct Compute { using type = T; };
template <> struct Compute<c10::BFloat16> { using type = float; };

struct Window {
  int64_t C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw;
  int64_t xN, xH, xW;  // the input's element strides (channels contiguous); the output is dense
};

// Channels [c0, c0 + WIDTH) of output pixel (n, oh, ow) (WIDTH ≥ count; the first `count` stored): a full chunk's
// WIDTH is a compile-time constant, its maxima held in registers across the window's taps.
template <typename T, int64_t WIDTH, bool FULL>
inline void pool_chunk(const Window& q, const T* x, T* y, int64_t n, int64_t oh, int64_t ow, int64_t c0,
                       int64_t count) {
  using U = typename Compute<T>::type;
  const int64_t width = FULL ? WIDTH : count;
  U acc[WIDTH];
  for (int64_t c = 0; c < WIDTH; ++c) acc[c] = lowest<U>();
  for (int64_t kh = 0; kh < q.KH; ++kh) {
    const int64_t ih = oh * q.sh - q.ph + kh * q.dh;
    if (ih < 0 || ih >= q.H) continue;
    for (int64_t kw = 0; kw < q.KW; ++kw) {
      const int64_t iw = ow * q.sw - q.pw + kw * q.dw;
      if (iw < 0 || iw >= q.W) continue;
      const T* in = x + n * q.xN + ih * q.xH + iw * q.xW + c0;
      for (int64_t c = 0; c < width; ++c) acc[c] = larger<U>(acc[c], U(in[c]));
    }
  }
  T* out = y + ((n * q.OH + oh) * q.OW + ow) * q.C + c0;
  for (int64_t c = 0; c < width; ++c) out[c] = T(acc[c]);
}

template <typename T>
void pool(const Window& q, const T* x, T* y, int64_t N) {
  constexpr int64_t CHUNK = 256 / sizeof(typename Compute<T>::type);
  const int64_t rows = N * q.OH, work = std::max<int64_t>(1, q.OW * q.C * q.KH * q.KW);
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / work), [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t n = r / q.OH, oh = r % q.OH;
      for (int64_t ow = 0; ow < q.OW; ++ow)
      {
        int64_t c0 = 0;
        for (; c0 + CHUNK <= q.C; c0 += CHUNK) pool_chunk<T, CHUNK, true>(q, x, y, n, oh, ow, c0, CHUNK);
        if (c0 < q.C) pool_chunk<T, CHUNK, false>(q, x, y, n, oh, ow, c0, q.C - c0);
      }
    }
  });
}

}  // namespace

// y [N, C, OH, OW] channels_last = the max pool of x [N, C, H, W] (channels contiguous: channels_last, or a channel
// slice of such a tensor) over windows of `kernel` taps by `strides` and `dilations`, `begin` its leading padding.
torch::Tensor max_pool(torch::Tensor x, std::vector<int64_t> kernel, std::vector<int64_t> strides,
                       std::vector<int64_t> dilations, std::vector<int64_t> begin, std::vector<int64_t> out) {
  TORCH_CHECK(x.dim() == 4 && x.stride(1) == 1, "max_pool: a 4-D input with its channels contiguous (channels_last)");
  TORCH_CHECK(kernel.size() == 2 && strides.size() == 2 && dilations.size() == 2 && begin.size() == 2 &&
              out.size() == 2, "max_pool: 2-D windows");
  const Window q{x.size(1), x.size(2), x.size(3), out[0], out[1], kernel[0], kernel[1], strides[0], strides[1],
                 begin[0], begin[1], dilations[0], dilations[1], x.stride(0), x.stride(2), x.stride(3)};
  auto y = torch::empty({x.size(0), q.C, q.OH, q.OW}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  switch (x.scalar_type()) {
    case at::kFloat: pool(q, x.data_ptr<float>(), y.data_ptr<float>(), x.size(0)); break;
    case at::kBFloat16: pool(q, x.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>(), x.size(0)); break;
    case at::kChar: pool(q, x.data_ptr<int8_t>(), y.data_ptr<int8_t>(), x.size(0)); break;
    case at::kByte: pool(q, x.data_ptr<uint8_t>(), y.data_ptr<uint8_t>(), x.size(0)); break;
    default: TORCH_CHECK(false, "max_pool: float32, bf16, int8 or uint8, not ", x.scalar_type());
  }
  return y;
}
"""


def module():
    """The compiled extension (built on first use, then loaded from the cache)."""
    return load("max_pool", SOURCE, ("max_pool",))


def max_pool2d(
    x: torch.Tensor,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    begin: Sequence[int],
    out: Sequence[int],
) -> torch.Tensor:
    """The 2-D max pool of `x` ([N, C, H, W], channels contiguous) into `out` windows, `begin` its leading padding
    (`ops.pool.PoolWindows.at`); channels_last, x's type."""
    return module().max_pool(x, list(kernel), list(strides), list(dilations), list(begin), list(out))
