"""LayerNormalization over each row's last `C` values on the CPU in C++ with AVX-512, float32 or bf16 in and out,
statistics and arithmetic in float32 (ONNX's stash_type 1):

    y[r, c] = (x[r, c] − mean_r) · (1 / √(var_r + ε)) · γ[c] + β[c]

or, with a `y_scale`, y quantized into int8 as a QuantizedConv quantizes its input (y · (1 / y_scale) rounded half
to even, saturated): a transformer's norm handing its int8 projections their input; with `copy` as well, y in
x's type beside it (for the norm's readers that take Y in float: a post-norm block's residual add).

A row is read three times while it sits in L1: its sum, then the sum of squared deviations from the mean (two
passes, as accurate as the reference's), then the normalized values; threads take runs of rows. Through torch a bf16
row took 2.5× the float32 one (9.6-15.6 GB/s over ConvNeXt's and ViT's shapes on two cores), and ConvNeXt-Tiny's
23 layer norms were 6% of its bf16 engine's time (docs/design.md, "Layer norm on the CPU").
"""

from __future__ import annotations

import torch

from .avx512 import ABSENT, load_vector, module_source, vector_problem

_CORE = r"""
// R rows at once: a row's passes are a chain of dependent sums and reductions (about 110 cycles at C = 96), so
// rows in step keep the vector units busy (the first form, a row at a time, ran at 9 GB/s).
// 16 results stored in the output's type: float32 or bf16, or int8 quantized by `inverse` (1 / y_scale).
inline void put16(float* p, __mmask16 m, __m512 v, __m512) { store16(p, m, v); }
inline void put16(uint16_t* p, __mmask16 m, __m512 v, __m512) { store16(p, m, v); }
inline void put16(int8_t* p, __mmask16 m, __m512 v, __m512 inverse) {
  _mm_mask_storeu_epi8(p, m, quantize16(v, inverse));
}

template <int R, typename T, typename U>
[[gnu::always_inline]] inline void normalize(const T* const* in, U* const* out, T* const* copy, const float* gamma,
                                             const float* beta, int64_t C, float epsilon, __m512 y_inverse) {
  __m512 sum[R], squares[R], mean[R], inverse[R];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) sum[r] = squares[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < C; c += 16) {
    const __mmask16 m = mask_of(C - c);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) sum[r] = _mm512_add_ps(sum[r], load16(m, in[r] + c));
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) mean[r] = _mm512_set1_ps(_mm512_reduce_add_ps(sum[r]) / float(C));
  for (int64_t c = 0; c < C; c += 16) {
    const __mmask16 m = mask_of(C - c);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_maskz_sub_ps(m, load16(m, in[r] + c), mean[r]);
      squares[r] = _mm512_fmadd_ps(d, d, squares[r]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    inverse[r] = _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(squares[r]) / float(C) + epsilon));
  for (int64_t c = 0; c < C; c += 16) {
    const __mmask16 m = mask_of(C - c);
    const __m512 g = _mm512_maskz_loadu_ps(m, gamma + c);
    const __m512 b = beta ? _mm512_maskz_loadu_ps(m, beta + c) : _mm512_setzero_ps();
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 v = _mm512_mul_ps(_mm512_sub_ps(load16(m, in[r] + c), mean[r]), inverse[r]);
      const __m512 y = _mm512_fmadd_ps(v, g, b);
      put16(out[r] + c, m, y, y_inverse);
      if (copy) store16(copy[r] + c, m, y);
    }
  }
}

template <typename T, typename U>
void normalize_rows(const T* x, int64_t stride, U* y, T* y_copy, const float* gamma, const float* beta, int64_t rows,
                    int64_t C, float epsilon, float y_inverse) {
  const __m512 inverse = _mm512_set1_ps(y_inverse);
  constexpr int R = 4;
  const int64_t groups = (rows + R - 1) / R;
  at::parallel_for(0, groups, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)), [&](int64_t first, int64_t last) {
    for (int64_t g = first; g < last; ++g) {
      const int64_t r0 = g * R, n = std::min<int64_t>(R, rows - r0);
      const T* in[R];
      U* out[R];
      T* copy[R];
      for (int r = 0; r < R; ++r) {
        in[r] = x + (r0 + std::min<int64_t>(r, n - 1)) * stride;
        out[r] = y + (r0 + std::min<int64_t>(r, n - 1)) * C;
        copy[r] = y_copy ? y_copy + (r0 + std::min<int64_t>(r, n - 1)) * C : nullptr;
      }
      T* const* copies = y_copy ? copy : nullptr;
      if (n == R) normalize<R>(in, out, copies, gamma, beta, C, epsilon, inverse);
      else for (int r = 0; r < n; ++r) normalize<1>(in + r, out + r, copies ? copies + r : nullptr, gamma, beta, C,
                                                    epsilon, inverse);
    }
  });
}
"""

_ENTRY = r"""
// y [rows, C] (contiguous, x's type; int8 for a positive y_scale) = the rows of x [rows, C] (rows of stride
// x.stride(0), values contiguous) normalized, times gamma and plus beta (float32 [C]; beta may be empty), quantized
// by y_scale when it is positive; with `copy` (and a y_scale), also unquantized in x's type: returns {y} or
// {y, copy} (tensors only: a CPU graph records calls that return nothing else).
std::vector<torch::Tensor> layer_norm(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double epsilon,
                                      double y_scale, bool copy) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "layer_norm: [rows, C] with each row's values contiguous");
  const int64_t rows = x.size(0), C = x.size(1);
  TORCH_CHECK(gamma.scalar_type() == at::kFloat && gamma.numel() == C && gamma.is_contiguous(),
              "layer_norm: a float32 scale of ", C, " values");
  TORCH_CHECK(!beta.numel() || (beta.scalar_type() == at::kFloat && beta.numel() == C && beta.is_contiguous()),
              "layer_norm: a float32 bias of ", C, " values");
  const bool quantized = y_scale > 0;
  TORCH_CHECK(quantized || !copy, "layer_norm: a copy of y is written beside a quantized y only");
  auto y = torch::empty({rows, C}, quantized ? x.options().dtype(at::kChar) : x.options());
  auto y_copy = copy ? torch::empty({rows, C}, x.options()) : torch::Tensor();
  const float* b = beta.numel() ? beta.data_ptr<float>() : nullptr;
  const float inverse = quantized ? float(1.0 / y_scale) : 1.f;
  by_type("layer_norm", x, {}, [&](auto zero) {
    using T = decltype(zero);
    const T* in = reinterpret_cast<const T*>(x.data_ptr());
    T* second = copy ? reinterpret_cast<T*>(y_copy.data_ptr()) : nullptr;
    if (quantized)
      normalize_rows(in, x.stride(0), y.data_ptr<int8_t>(), second, gamma.data_ptr<float>(), b, rows, C,
                     float(epsilon), inverse);
    else
      normalize_rows(in, x.stride(0), reinterpret_cast<T*>(y.data_ptr()), second, gamma.data_ptr<float>(), b, rows,
                     C, float(epsilon), inverse);
  });
  return copy ? std::vector<torch::Tensor>{y, y_copy} : std::vector<torch::Tensor>{y};
}
"""

SOURCE = module_source(_CORE, _ENTRY)


def problem() -> str | None:
    """Why the kernel cannot run on this CPU, or None."""
    return vector_problem("layer norm")


def module():
    """The compiled extension (built on first use, then loaded from the cache)."""
    return load_vector("layer_norm", SOURCE, "layer_norm")


def layer_norm(
    x: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor | None,
    epsilon: float,
    axis: int = -1,
    y_scale: float = 0.0,
    copy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """LayerNormalization of float32 or bf16 `x` over its axes from `axis` on, with float32 `gamma` and `beta` of
    that many values (flat, contiguous; `beta` may be None). The result has x's type (int8, quantized by `y_scale`,
    when that is positive) and shape, contiguous; with `copy` (and a `y_scale`), the pair (quantized, in x's type)."""
    begin = axis % x.dim()
    rows = x.reshape(-1, x.shape[begin:].numel())
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    beta = ABSENT if beta is None else beta
    outputs = [y.view(x.shape) for y in module().layer_norm(rows, gamma, beta, float(epsilon), float(y_scale), copy)]
    return tuple(outputs) if copy else outputs[0]
