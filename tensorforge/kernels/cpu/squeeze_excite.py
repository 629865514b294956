"""Squeeze-and-excitation (`ops/squeeze_excite.py`) in one C++ call on the CPU, float32, channels_last:

    s = mean of x over H×W   →   h = act1(W1·s + b1)   →   g = act2(W2·h + b2)   →   y = x · g

each step an `at::parallel_for` (the mean over chunks of pixels, then the hidden units, the channels, the pixels),
vectorized over a pixel's channels. Through
torch the block is seven ops, and on the CPU each op's fixed cost (dispatch, allocation, a parallel region, caches
cold after the convolution before it) outweighs its few thousand multiply-adds: MobileNetV3's eight blocks took
1.1 ms more that way in a run of the whole network (docs/design.md, "The CPU at batch 1").
"""

from __future__ import annotations

import torch

from ..activations import ACTIVATION_CODES
from .extension import load

# The activations the kernel evaluates (by `kernels.activations` code): the rest decline.
ACTIVATIONS = ("", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "SiLU", "Tanh", "Elu")

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>

// `kernels.activations` codes; comparisons written so that a NaN passes through, as in the reference.
static inline float activate(float v, int64_t code, float p0, float p1) {
  switch (code) {
    case 1: return v < 0.f ? 0.f : v;                                          // Relu
    case 2: return v < p0 ? p0 : (v > p1 ? p1 : v);                            // Clip
    case 3: return v < 0.f ? v * p0 : v;                                       // LeakyRelu
    case 4: return 1.f / (1.f + std::exp(-v));                                 // Sigmoid
    case 5: { float r = v * p0 + p1; return r < 0.f ? 0.f : (r > 1.f ? 1.f : r); }  // HardSigmoid
    case 6: { float r = v / 6.f + 0.5f; r = r < 0.f ? 0.f : (r > 1.f ? 1.f : r); return v * r; }  // HardSwish
    case 7: return v / (1.f + std::exp(-v));                                   // SiLU
    case 10: return std::tanh(v);                                              // Tanh
    case 12: return v < 0.f ? p0 * std::expm1(v) : v;                          // Elu
    default: return v;
  }
}

// Σ a[j]·b[j]. A function of its own: the same `omp simd` reduction written inside the `at::parallel_for` lambda
// ran 4× slower under -fopenmp, even on the calling thread.
static float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float s = 0.f;
  #pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

// out[i] = act(w[i, :] · in + b[i]) for the `rows` rows of w [rows, cols] (b may be null).
static void matvec(const float* w, const float* b, const float* in, float* out, int64_t rows, int64_t cols,
                   int64_t act, float p0, float p1) {
  at::parallel_for(0, rows, 16, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      out[i] = activate(dot(w + i * cols, in, cols) + (b ? b[i] : 0.f), act, p0, p1);
    }
  });
}

static inline float value(float v) { return v; }
static inline float value(uint16_t v) {  // a bf16 value: the upper half of a float32
  float f;
  const uint32_t bits = uint32_t(v) << 16;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The sums of x's pixels [first, last) (C channels each, contiguous) added to acc.
template <typename T>
static void add_pixels(const T* __restrict x, float* __restrict acc, int64_t first, int64_t last, int64_t C) {
  for (int64_t p = first; p < last; ++p) {
    const T* row = x + p * C;
    #pragma omp simd
    for (int64_t c = 0; c < C; ++c) acc[c] += value(row[c]);
  }
}

// The gate [N, C] float32 of x: [N, C, H, W] channels_last, float32 or bf16; w1 [R, C]; w2 [C, R]; b1 [R] and b2
// [C] or empty, float32.
torch::Tensor squeeze_excite_gate(torch::Tensor x, torch::Tensor w1, torch::Tensor b1, torch::Tensor w2,
                                  torch::Tensor b2, int64_t act1, double p10, double p11, int64_t act2, double p20,
                                  double p21) {
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3), R = w1.size(0);
  const auto options = x.options().dtype(torch::kFloat32);
  auto pooled = torch::empty({N, C}, options);
  auto hidden = torch::empty({N, R}, options);
  auto gate = torch::empty({N, C}, options);
  const bool half = x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(half || x.scalar_type() == at::kFloat, "squeeze_excite_gate: x float32 or bf16, not ", x.scalar_type());
  float* sp = pooled.data_ptr<float>();
  float* hp = hidden.data_ptr<float>();
  float* gp = gate.data_ptr<float>();
  const float* w1p = w1.data_ptr<float>();
  const float* w2p = w2.data_ptr<float>();
  const float* b1p = b1.numel() ? b1.data_ptr<float>() : nullptr;
  const float* b2p = b2.numel() ? b2.data_ptr<float>() : nullptr;
  const float inv = 1.f / static_cast<float>(HW);
  // the mean: pixel chunks summed in parallel (one a thread), then the chunks' sums added in order
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(HW / 16, at::get_num_threads()));
  auto partial = torch::zeros({chunks, C}, options);
  float* pp = partial.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    float* sn = sp + n * C;
    if (n > 0) partial.zero_();
    at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
      for (int64_t chunk = first; chunk < last; ++chunk) {
        const int64_t begin = chunk * HW / chunks, end = (chunk + 1) * HW / chunks;
        float* acc = pp + chunk * C;
        if (half) add_pixels(reinterpret_cast<const uint16_t*>(x.data_ptr()) + n * HW * C, acc, begin, end, C);
        else add_pixels(x.data_ptr<float>() + n * HW * C, acc, begin, end, C);
      }
    });
    for (int64_t c = 0; c < C; ++c) {
      float total = 0.f;
      for (int64_t chunk = 0; chunk < chunks; ++chunk) total += pp[chunk * C + c];
      sn[c] = total * inv;
    }
    float* hn = hp + n * R;
    matvec(w1p, b1p, sn, hn, R, C, act1, p10, p11);
    matvec(w2p, b2p, hn, gp + n * C, C, R, act2, p20, p21);
  }
  return gate;
}

// y = x · gate, like x (see `squeeze_excite_gate`).
torch::Tensor squeeze_excite(torch::Tensor x, torch::Tensor w1, torch::Tensor b1, torch::Tensor w2,
                             torch::Tensor b2, int64_t act1, double p10, double p11, int64_t act2, double p20,
                             double p21) {
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  auto gate = squeeze_excite_gate(x, w1, b1, w2, b2, act1, p10, p11, act2, p20, p21);
  auto y = torch::empty_like(x, at::MemoryFormat::ChannelsLast);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = xp + n * HW * C;
    const float* gn = gate.data_ptr<float>() + n * C;
    float* yn = yp + n * HW * C;
    at::parallel_for(0, HW, 8, [&](int64_t first, int64_t last) {
      for (int64_t p = first; p < last; ++p) {
        const float* in = xn + p * C;
        float* out = yn + p * C;
        #pragma omp simd
        for (int64_t c = 0; c < C; ++c) out[c] = in[c] * gn[c];
      }
    });
  }
  return y;
}
"""


def squeeze_excite(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    act1: str = "",
    act1_params: tuple[float, float] = (0.0, 0.0),
    act2: str = "",
    act2_params: tuple[float, float] = (0.0, 0.0),
) -> torch.Tensor:
    """y = x · act2(W2 · act1(W1 · mean_hw(x) + b1) + b2) for float32 x [N, C, H, W] (made channels_last), W1 [R, C]
    and W2 [C, R] (contiguous float32), biases [R] / [C] or None; activations by name (`ACTIVATIONS`), their two
    parameters as `kernels.activations.activation_args` gives them. The output is channels_last."""
    return module().squeeze_excite(*_arguments(x, w1, b1, w2, b2, act1, act1_params, act2, act2_params))


def gate(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    act1: str = "",
    act1_params: tuple[float, float] = (0.0, 0.0),
    act2: str = "",
    act2_params: tuple[float, float] = (0.0, 0.0),
) -> torch.Tensor:
    """The gate act2(W2 · act1(W1 · mean_hw(x) + b1) + b2) alone, [N, C] float32 (arguments as `squeeze_excite`, x
    float32 or bf16): for a layer that applies it itself (`pointwise.PointwiseConv`'s scale)."""
    return module().squeeze_excite_gate(*_arguments(x, w1, b1, w2, b2, act1, act1_params, act2, act2_params))


def _arguments(x, w1, b1, w2, b2, act1, act1_params, act2, act2_params) -> tuple:
    for name in (act1, act2):
        if name not in ACTIVATIONS:
            raise ValueError(f"the CPU squeeze-excite kernel has no activation {name!r}; it has {ACTIVATIONS}")
    empty = x.new_empty(0)
    return (
        x.contiguous(memory_format=torch.channels_last), w1, empty if b1 is None else b1.contiguous(), w2,
        empty if b2 is None else b2.contiguous(), ACTIVATION_CODES[act1], *act1_params, ACTIVATION_CODES[act2],
        *act2_params,
    )  # fmt: skip


def module():
    """The compiled extension (built on first use, then loaded from the cache)."""
    return load("squeeze_excite", SOURCE, ("squeeze_excite", "squeeze_excite_gate"))
