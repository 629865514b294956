"""A network's stem: a one-group convolution of few input channels (an image's three), on the CPU in C++ with
AVX-512, float32, with its bias and activation, read straight from the input as it comes (NCHW or channels_last,
through its strides) and written channels_last:

    y[n, oh, ow, k] = act(b[k] + Σ_(c,kh,kw) w[c, kh, kw, k] · x[n, c, oh·s_h − p_h + kh·d_h, ow·s_w − p_w + kw·d_w])

A tile is `PIXELS` output pixels of a row × up to `VECTORS` vectors of 16 output channels (8 × 3 on AVX-512, 24
accumulators of its 32 registers; 6 × 1 on AVX2, 12 of its 16: a vector of 16 is two of them there): each of the
KH·C·KW taps loads its weight row once and broadcasts each pixel's input value into the multiply-adds. Tiles whose
taps all fall inside the input along W run their taps in one loop, each tap's input found by its offset from the
window's corner (tap rows above or below the input left out); the others read zeros for the padding. The weight is
packed once in column blocks of the tile's width, each [KH·C·KW, 16·VECTORS] contiguous, and an output row runs
block by block, so that a block stays in cache from tile to tile. (ResNet's 7×7 stem on two AVX2 cores: 3.84 ms
with the taps in three nested loops and the weight as one [C·KH·KW, K] matrix, 3.01 so; ONNX Runtime's 2.38.)

Why our own: a stem has too few input channels for a product over them (27 multiply-adds a pixel for a 3×3 RGB
stem), and oneDNN through torch first reorders the NCHW network input to channels_last, a copy of the image.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from ..activations import ACTIVATION_CODES
from .avx512 import ACTIVATIONS as ACTIVATIONS  # the epilogues this kernel evaluates, for its tactic
from .avx512 import (
    VECTOR_MATH,
    check_activations,
    load_vector,
    pack_bias,
    register_tiles,
    rounded,
    vector_problem,
)

((PIXELS, VECTORS),) = register_tiles([(8, 3)], [(6, 1)])  # this CPU's register tile: output pixels × vectors
MAX_CHANNELS = 4  # the most input channels the kernel takes

SOURCE = (
    VECTOR_MATH
    + f"constexpr int PIXELS = {PIXELS}, VECTORS = {VECTORS};\n"
    + r"""
namespace {

struct Stem {
  int64_t C, H, W, K, Kp, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW;
  int64_t xN, xC, xH, xW, yN, yH, yW;  // element strides (y's channels are contiguous)
  const float* x;
  const float* w;  // column blocks of 16·VECTORS output channels (the last narrower), each [KH·C·KW, its width]
                   // contiguous, taps in (kh, c, kw) order
  const float* b;  // [Kp]
  float* y;
  const int64_t* offsets;  // [KH·C·KW]: each tap's input element from its window's corner
  int64_t step;            // elements from one output pixel's window to the next's
  int64_t act;
  __m512 p0, p1;
};

// Pixels ow0 .. ow0+count-1 of output row oh of image n × the NV output vectors from k0, whose weight block is
// `block` ([KH·C·KW, 16·NV]). BORDER: some taps of these pixels fall outside the input along W (they read zeros);
// otherwise count == T.
template <int T, int NV, bool BORDER>
inline void tile(const Stem& q, int64_t n, int64_t oh, int64_t ow0, int count, int64_t k0, const float* block) {
  __m512 acc[T * NV];
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const __m512 bias = _mm512_loadu_ps(q.b + k0 + 16 * v);
    #pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[t * NV + v] = bias;
  }
  const int64_t top = oh * q.sh - q.ph, left = ow0 * q.sw - q.pw;
  int64_t kh0 = 0, kh1 = q.KH;  // the tap rows inside the input
  while (kh0 < q.KH && top + kh0 * q.dh < 0) ++kh0;
  while (kh1 > kh0 && top + (kh1 - 1) * q.dh >= q.H) --kh1;
  if constexpr (!BORDER) {  // one loop over the taps of those rows: each its input's offset from the window's corner
    const int64_t corner = n * q.xN + top * q.xH + left * q.xW;  // (outside the input where kh0 > 0)
    const int64_t first = kh0 * q.C * q.KW, taps = (kh1 - kh0) * q.C * q.KW;
    const int64_t* offsets = q.offsets + first;
    const float* weights = block + first * 16 * NV;
    for (int64_t i = 0; i < taps; ++i) {
      __m512 wv[NV];
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_ps(weights + i * 16 * NV + 16 * v);
      const float* at = q.x + corner + offsets[i];
      #pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_set1_ps(at[t * q.step]);
        #pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[t * NV + v] = _mm512_fmadd_ps(xv, wv[v], acc[t * NV + v]);
      }
    }
  } else {
    for (int64_t kh = kh0; kh < kh1; ++kh) {
      for (int64_t c = 0; c < q.C; ++c) {
        const float* row = q.x + n * q.xN + c * q.xC + (top + kh * q.dh) * q.xH;
        const float* taps = block + (kh * q.C + c) * q.KW * 16 * NV;
        for (int64_t kw = 0; kw < q.KW; ++kw) {
          __m512 wv[NV];
          #pragma GCC unroll 8
          for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_ps(taps + kw * 16 * NV + 16 * v);
          const int64_t iw0 = left + kw * q.dw;
          #pragma GCC unroll 16
          for (int t = 0; t < T; ++t) {
            const int64_t iw = iw0 + t * q.sw;
            const __m512 xv = _mm512_set1_ps(t < count && iw >= 0 && iw < q.W ? row[iw * q.xW] : 0.f);
            #pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) acc[t * NV + v] = _mm512_fmadd_ps(xv, wv[v], acc[t * NV + v]);
          }
        }
      }
    }
  }
  activate_tile<T * NV>(acc, T * NV, q.act, q.p0, q.p1);
  float* out = q.y + n * q.yN + oh * q.yH + ow0 * q.yW + k0;
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const int64_t lanes = q.K - k0 - 16 * v;
    const __mmask16 m = lanes >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << lanes) - 1);
    #pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      if (t < count) _mm512_mask_storeu_ps(out + t * q.yW + 16 * v, m, acc[t * NV + v]);
  }
}

// Output row oh of image n for the NV output vectors from k0: its left border tiles, the tiles inside, the right
// border tiles (the columns [lo, hi) read no padding along W). One block of the weight for the whole row, so that
// it stays in cache from tile to tile.
template <int NV>
inline void row(const Stem& q, int64_t n, int64_t oh, int64_t lo, int64_t hi, int64_t k0) {
  const float* block = q.w + q.C * q.KH * q.KW * k0;
  int64_t ow = 0;
  for (int count; ow < lo; ow += count) {
    count = int(std::min<int64_t>(PIXELS, lo - ow));
    tile<PIXELS, NV, true>(q, n, oh, ow, count, k0, block);
  }
  for (; ow + PIXELS <= hi; ow += PIXELS) tile<PIXELS, NV, false>(q, n, oh, ow, PIXELS, k0, block);
  for (int count; ow < q.OW; ow += count) {
    count = int(std::min<int64_t>(PIXELS, q.OW - ow));
    tile<PIXELS, NV, true>(q, n, oh, ow, count, k0, block);
  }
}

}  // namespace

// x [N, C, H, W] float32, any strides; y [N, K, OH, OW] with contiguous channels; w the column blocks (Stem::w),
// flat; b [Kp].
void stem_conv(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor y, int64_t KH, int64_t KW,
               int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t act, double p0,
               double p1) {
  std::vector<int64_t> offsets;
  for (int64_t kh = 0; kh < KH; ++kh)
    for (int64_t c = 0; c < x.size(1); ++c)
      for (int64_t kw = 0; kw < KW; ++kw)
        offsets.push_back(kh * dh * x.stride(2) + c * x.stride(1) + kw * dw * x.stride(3));
  const Stem q{x.size(1), x.size(2), x.size(3), y.size(1), b.size(0), KH, KW, sh, sw, ph, pw, dh, dw, y.size(2),
               y.size(3), x.stride(0), x.stride(1), x.stride(2), x.stride(3), y.stride(0), y.stride(2),
               y.stride(3), x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(),
               offsets.data(), sw * x.stride(3), act, _mm512_set1_ps(float(p0)), _mm512_set1_ps(float(p1))};
  // output columns whose taps along W are all inside the input: [lo, hi)
  const int64_t lo = std::min<int64_t>(q.OW, (q.pw + q.sw - 1) / q.sw);
  const int64_t reach = q.W - 1 + q.pw - (q.KW - 1) * q.dw;
  const int64_t hi = reach < 0 ? lo : std::max<int64_t>(lo, std::min<int64_t>(q.OW, reach / q.sw + 1));
  const int64_t rows = x.size(0) * q.OH;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, q.OW * q.C * KH * KW * q.Kp));
  at::parallel_for(0, rows, grain, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t n = r / q.OH, oh = r % q.OH;
      for (int64_t v = 0; v < q.Kp / 16; v += VECTORS) {
        const int64_t left = q.Kp / 16 - v;  // a last block narrower than VECTORS (AVX-512's 3): 2 or 1
        if (left >= VECTORS) row<VECTORS>(q, n, oh, lo, hi, 16 * v);
        else if constexpr (VECTORS == 3) {
          if (left == 2) row<2>(q, n, oh, lo, hi, 16 * v);
          else row<1>(q, n, oh, lo, hi, 16 * v);
        }
      }
    }
  });
}
"""
)


def problem() -> str | None:
    """Why the kernel cannot run on this CPU, or None."""
    return vector_problem("stem convolution")


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """A weight [K, C, KH, KW] as float32 column blocks of `VECTORS` × 16 output channels (the last narrower; zeros
    past K), each [KH·C·KW, its width] contiguous (taps in (kh, c, kw) order), one after the other: flat, KH·C·KW · K
    rounded up to 16."""
    k = w.shape[0]
    columns = torch.zeros(w[0].numel(), rounded(k), dtype=torch.float32)
    columns[:, :k] = w.detach().float().permute(2, 1, 3, 0).reshape(-1, k)
    return torch.cat([block.reshape(-1) for block in columns.split(16 * VECTORS, dim=1)])


class StemConv:
    """A stem convolution ready to run: its weight [K, C, KH, KW] (C at most `MAX_CHANNELS`) and bias packed, its
    strides, dilations and activation (by name, `ACTIVATIONS`, with its two parameters as
    `kernels.activations.activation_args` gives them) checked, once; calls give the input and its padding."""

    __slots__ = ("_bias", "_epilogue", "_module", "_strides", "_weight", "channels", "kernel")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        strides: Sequence[int] = (1, 1),
        dilations: Sequence[int] = (1, 1),
        act: str = "",
        act_params: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        check_activations("stem", act)
        if weight.shape[1] > MAX_CHANNELS:
            raise ValueError(f"the CPU stem kernel takes at most {MAX_CHANNELS} input channels, not {weight.shape[1]}")
        self.channels, self.kernel = weight.shape[0], tuple(weight.shape[2:])
        self._weight, self._bias = pack_weight(weight), pack_bias(bias, self.channels)
        self._strides = (tuple(strides), tuple(dilations))
        self._epilogue = (ACTIVATION_CODES[act], *act_params)
        self._module = module()

    def __call__(self, x: torch.Tensor, pads: Sequence[int], out_hw: Sequence[int]) -> torch.Tensor:
        """act(conv(x) + bias) for x [N, C, H, W] of floats in any layout (another type than float32 converted
        first), `pads` the leading (top, left) padding and `out_hw` the output's size, which fixes the trailing
        padding; a new channels_last float32 tensor."""
        if not x.is_floating_point() or x.dim() != 4:
            raise ValueError(f"x must be a 4-D tensor of floats, not {x.dtype} {tuple(x.shape)}")
        x = x.float()
        out = torch.empty((x.shape[0], self.channels, *out_hw), memory_format=torch.channels_last)
        (sh, sw), (dh, dw) = self._strides
        self._module.stem_conv(x, self._weight, self._bias, out, *self.kernel, sh, sw, *pads, dh, dw, *self._epilogue)
        return out


@functools.cache
def module():
    """The compiled extension (built on first use, then loaded from the cache)."""
    return load_vector("stem_conv", SOURCE, "stem convolution")
