"""An int8 1×1 convolution (or linear layer: a product over rows) on the CPU in C++ with AVX-512 VNNI, with
QuantizedConv's and QuantizedGemm's arithmetic and whole epilogue:

    y[p, k] = out(post(pre(x_scale · Ws[k] · Σ_c Q(x)[p, c] · Wq[c, k] + b[k]) + z[p, k]))

Q(x) is the input quantized per tensor (a float32 x: x · (1 / x_scale) in float32, rounded half to even, saturated
to int8; an int8 x as it is), Wq the int8 weight with per-output-channel scales Ws, z a float32 residual or an int8
one times z_scale, and `out` float32, or int8: y quantized as x is, with y_scale.
bf16 inputs, residuals and outputs go as float32 ones do (an int8 layer between bf16 layers of a bf16 engine).

`vpdpbusd` multiplies unsigned bytes by signed ones, four a lane into int32 sums: the quantized inputs are offset
by 128 into uint8 (one pass over the input into rows of whole quads of channels, which also gathers a strided
input's pixels), and each output channel's sums start at −128 · Σ_c Wq[c, k] (worked out when the weight is
packed) so that they end exact. The weight is packed in column blocks [C/4, 16·NV, 4] (four input channels of 16
output channels a 64-byte vector); the tiles of pixels × output vectors, the blocks and the thread split are the
float 1×1 kernel's (`kernels.cpu.pointwise`). The epilogue runs in float32.

Why our own: oneDNN's int8 convolution and linear layer through torch take the input as uint8 made by a pass of
their own and cost a call's set-up each; at batch 1 on a 2-core Zen 4 they ran ResNet-50's 1×1 shapes at 240-320
GMAC/s and BERT-base's linear layers at 130-160, ours 310-400 and 370-420 (`bench/quantized_cpu.py`).
"""

from __future__ import annotations

import functools

import torch

from ..activations import ACTIVATION_CODES
from .avx512 import ABSENT, check_activations, load_avx512, module_source, pack_bias, rounded
from .avx512 import ACTIVATIONS as ACTIVATIONS  # the epilogues this kernel evaluates, for its tactic
from .extension import host_flags
from .pointwise import AVX512_TILES as TILES  # the tiles, as the float 1×1 kernel's on AVX-512

OPERAND_TYPES = (torch.float32, torch.bfloat16, torch.int8)  # of inputs and residuals (bf16: AVX512-BF16 CPUs)

CORE = r"""

enum Type { FLOAT32, INT8, BF16 };  // of a residual or an output

struct Problem {
  int64_t P, C, K, Kp, Cq;  // pixels, input channels, output channels, K rounded up to 16, C rounded up to 4
  const uint8_t* x;         // [P, Cq]: the quantized inputs offset by 128
  const int8_t* w;          // column blocks [Cq/4, 16·NV, 4], block b at Cq·16·NV·b
  const int32_t* start;     // [Kp] −128·Σ_c w[c, k]: the sums' start
  const float* scale;       // [Kp] x_scale·Ws[k]
  const float* b;           // [Kp]
  const void* z;            // the residual (pixel p's at z + p·zs), of type zt, or null
  int64_t zs;
  int zt;                   // FLOAT32, INT8 or BF16
  float z_scale;
  void* y;                  // the output, of type yt (pixel p's at y + p·ys)
  int64_t ys;
  int yt;
  float y_inverse;          // 1 / y_scale for an int8 output
  int64_t pre, post;
  __m512 pre0, pre1, post0, post1;
};

// acc + the products of x's unsigned bytes and w's signed ones, four a lane. In assembly, on values: through the
// intrinsic GCC copied every accumulator of an 8 × 3 tile to the stack and back each step (its pattern does not keep
// the sum in place), and so it did through an assembly operand that was an element of the tile's array.
[[gnu::always_inline]] inline __m512i dpbusd(__m512i acc, __m512i x, __m512i w) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));
  return acc;
}

// The step over the input channels, four a step: each pixel's quad of offset bytes (one 32-bit broadcast) times a
// block's quads of weights ([quads, 16·NV, 4]) in one `vpdpbusd` a vector.
template <int MR, int NV>
[[gnu::always_inline]] inline void accumulate_quads(__m512i* acc, const uint8_t* const* a, const int8_t* w,
                                                    int64_t quads) {
  for (int64_t c4 = 0; c4 < quads; ++c4) {
    __m512i wv[NV];
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_si512(w + (c4 * NV + v) * 64);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      int32_t quad;
      std::memcpy(&quad, a[r] + 4 * c4, 4);
      const __m512i xv = _mm512_set1_epi32(quad);
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r * NV + v] = dpbusd(acc[r * NV + v], xv, wv[v]);
    }
  }
}

// The sums of a tile of MR pixels × output vectors from k0, NV of them, at their start.
template <int MR, int NV>
[[gnu::always_inline]] inline void start_sums(const Problem& q, __m512i* acc, int64_t k0) {
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const __m512i start = _mm512_loadu_si512(q.start + k0 + 16 * v);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) acc[r * NV + v] = start;
  }
}

// A tile's activation `code`, GELU to 16-bit precision where the output is `narrow` (bf16 or int8: `activate`).
template <int T>
[[gnu::always_inline]] inline void activate_for(__m512* f, int64_t code, __m512 p0, __m512 p1, bool narrow) {
  if (narrow) activate_tile<T, true>(f, T, code, p0, p1);
  else activate_tile<T>(f, T, code, p0, p1);
}

// The epilogue of a tile's sums into output pixels p0 .. p0+rows-1 (rows apart by q.ys; the residual's by q.zs).
template <int MR, int NV>
[[gnu::always_inline]] inline void finish(const Problem& q, const __m512i* acc, int64_t p0, int rows, int64_t k0) {
  __m512 f[MR * NV];
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const __m512 scale = _mm512_loadu_ps(q.scale + k0 + 16 * v), bias = _mm512_loadu_ps(q.b + k0 + 16 * v);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) f[r * NV + v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r * NV + v]), scale, bias);
  }
  const bool narrow = q.yt != FLOAT32;
  activate_for<MR * NV>(f, q.pre, q.pre0, q.pre1, narrow);
  __mmask16 m[NV];
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) m[v] = mask_of(q.K - k0 - 16 * v);
  if (q.z) {
    const __m512 z_scale = _mm512_set1_ps(q.z_scale);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      if (r >= rows) break;
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const int64_t at = (p0 + r) * q.zs + k0 + 16 * v;
        const __m512 zv =
            q.zt == INT8 ? _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(
                                             m[v], static_cast<const int8_t*>(q.z) + at))), z_scale)
            : q.zt == BF16 ? load16(m[v], static_cast<const uint16_t*>(q.z) + at)
                           : _mm512_maskz_loadu_ps(m[v], static_cast<const float*>(q.z) + at);
        f[r * NV + v] = _mm512_add_ps(f[r * NV + v], zv);
      }
    }
  }
  activate_for<MR * NV>(f, q.post, q.post0, q.post1, narrow);
  const __m512 inverse = _mm512_set1_ps(q.y_inverse);
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (r >= rows) break;
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const int64_t at = (p0 + r) * q.ys + k0 + 16 * v;
      if (q.yt == INT8) _mm_mask_storeu_epi8(static_cast<int8_t*>(q.y) + at, m[v], quantize16(f[r * NV + v], inverse));
      else if (q.yt == BF16) store16(static_cast<uint16_t*>(q.y) + at, m[v], f[r * NV + v]);
      else _mm512_mask_storeu_ps(static_cast<float*>(q.y) + at, m[v], f[r * NV + v]);
    }
  }
}

// Pixels p0 .. p0+MR-1 (those past P read the last pixel and are not stored) × output vectors from k0, NV of them.
template <int MR, int NV>
inline void tile(const Problem& q, int64_t p0, int64_t k0) {
  const uint8_t* a[MR];
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) a[r] = q.x + std::min(p0 + r, q.P - 1) * q.Cq;
  __m512i acc[MR * NV];
  start_sums<MR, NV>(q, acc, k0);
  accumulate_quads<MR, NV>(acc, a, q.w + k0 * q.Cq, q.Cq / 4);  // this tile's weight block
  finish<MR, NV>(q, acc, p0, int(std::min<int64_t>(MR, q.P - p0)), k0);
}

template <int MR, int R>
inline void narrower(const Problem& q, int64_t p0, int64_t k0, int64_t left) {
  if constexpr (R > 0) {
    if (left == R) tile<MR, R>(q, p0, k0);
    else narrower<MR, R - 1>(q, p0, k0, left);
  }
}

// Work items: a tile of pixels × a block of NV output vectors. Where the inputs outweigh the weight (wide maps, as
// the float 1×1 kernel's items go) a tile's blocks come in turn, so that its input rows stay in cache; where the
// weight outweighs them (deep layers of few pixels, linear layers at batch 1), a block's tiles, so that each block is
// read from memory once rather than once a tile.
template <int MR, int NV>
void run(const Problem& q) {
  if (q.P == 0) return;
  const int64_t vectors = q.Kp / 16, blocks = (vectors + NV - 1) / NV, tiles = (q.P + MR - 1) / MR;
  const bool by_block = q.Kp > q.P;  // the weight's Cq·Kp bytes against the inputs' P·Cq
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, MR * q.Cq * 16 * NV));
  at::parallel_for(0, tiles * blocks, grain, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int64_t t = by_block ? i % tiles : i / blocks, v = (by_block ? i / tiles : i % blocks) * NV;
      if (vectors - v >= NV) tile<MR, NV>(q, t * MR, 16 * v);
      else narrower<MR, NV - 1>(q, t * MR, 16 * v, vectors - v);
    }
  });
}

// The offset inputs' buffer of `bytes`: up to 4 MB a calling thread's own, kept between calls (a fresh buffer of
// more than glibc's 128 KB mmap threshold is new pages, faulted in, each call), larger ones fresh. Each calling
// thread has its own, so contexts running at once do not share.
inline uint8_t* scratch(int64_t bytes, torch::Tensor& fresh) {
  constexpr int64_t KEPT = 4 << 20;
  if (bytes > KEPT) {
    fresh = torch::empty({bytes}, torch::kUInt8);
    return fresh.data_ptr<uint8_t>();
  }
  static thread_local std::vector<uint8_t> kept;
  if (int64_t(kept.size()) < bytes) kept.resize(bytes);
  return kept.data();
}

// The inputs of pixel p = (n, h, w) at x + n·sn + h·sh + w·sw (channels contiguous), float32 or int8, as rows of
// Cq uint8 values: Q(x) + 128, the channels past C 128 (their weights are zero).
// With a frame (`top` rows and `left` columns before, the rows and columns up to Hp × Wp after), the rows go inside
// it at their place in an [N, Hp, Wp, Cq] image whose frame holds 128s (quantized zeros, offset): a convolution's
// padding.
template <typename T>
void offset_rows(const T* x, int64_t N, int64_t H, int64_t W, int64_t sn, int64_t sh, int64_t sw, int64_t C,
                 int64_t Cq, float inverse_scale, uint8_t* rows, int64_t top, int64_t left, int64_t Hp, int64_t Wp) {
  const __m512 inverse = _mm512_set1_ps(inverse_scale);
  const __m128i flip = _mm_set1_epi8(char(0x80));
  const int64_t P = N * H * W;
  if (Hp != H || Wp != W) {  // the frame: whole rows above and below, columns left and right of each image row
    at::parallel_for(0, N * Hp, 64, [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) {
        uint8_t* row = rows + i * Wp * Cq;
        const int64_t h = i % Hp - top;
        if (h < 0 || h >= H) {
          std::fill(row, row + Wp * Cq, uint8_t(128));
        } else {
          std::fill(row, row + left * Cq, uint8_t(128));
          std::fill(row + (left + W) * Cq, row + Wp * Cq, uint8_t(128));
        }
      }
    });
  }
  at::parallel_for(0, P, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C)), [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const int64_t n = p / (H * W), h = p / W % H, w = p % W;
      const T* px = x + n * sn + h * sh + w * sw;
      uint8_t* out = rows + ((n * Hp + h + top) * Wp + w + left) * Cq;
      for (int64_t c = 0; c < Cq; c += 16) {
        const __mmask16 m = mask_of(C - c), stored = mask_of(Cq - c);
        __m128i q8;
        if constexpr (std::is_same_v<T, int8_t>) q8 = _mm_maskz_loadu_epi8(m, px + c);
        else q8 = quantize16(load16(m, px + c), inverse);  // float32 or bf16
        _mm_mask_storeu_epi8(out + c, stored, _mm_xor_si128(q8, flip));
      }
    }
  });
}

// The offset inputs of x [N, C, H, W] (float32 or bf16, quantized with x_inverse, or int8; pixel (n, h, w) at n·sn +
// h·sh + w·sw) in `scratch` (kept alive by `fresh` when it is not the thread's own), inside an Hp × Wp frame from
// (top, left): `offset_rows` for x's type.
inline uint8_t* offset_input(const char* kernel, const torch::Tensor& x, int64_t sn, int64_t sh, int64_t sw,
                             int64_t Cq, double x_inverse, int64_t top, int64_t left, int64_t Hp, int64_t Wp,
                             torch::Tensor& fresh) {
  const auto type = x.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kBFloat16 || type == at::kChar, kernel, ": float32, bf16 or int8 x");
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  uint8_t* offset = scratch(N * Hp * Wp * Cq, fresh);
  if (type == at::kFloat)
    offset_rows(x.data_ptr<float>(), N, H, W, sn, sh, sw, C, Cq, float(x_inverse), offset, top, left, Hp, Wp);
  else if (type == at::kBFloat16)
    offset_rows(reinterpret_cast<const uint16_t*>(x.data_ptr()), N, H, W, sn, sh, sw, C, Cq, float(x_inverse), offset,
                top, left, Hp, Wp);
  else
    offset_rows(x.data_ptr<int8_t>(), N, H, W, sn, sh, sw, C, Cq, 1.f, offset, top, left, Hp, Wp);
  return offset;
}

// The Type of a residual or output tensor, checked.
inline int type_of(const char* kernel, const char* what, const torch::Tensor& t) {
  const auto type = t.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kChar || type == at::kBFloat16, kernel, ": a float32, bf16 or int8 ",
              what, ", not ", type);
#ifndef __AVX512BF16__
  TORCH_CHECK(type != at::kBFloat16, kernel, ": a bf16 ", what, " needs AVX512-BF16, which this CPU lacks");
#endif
  return type == at::kChar ? INT8 : type == at::kBFloat16 ? BF16 : FLOAT32;
}

// A Problem of P output pixels over the offset inputs x, its residual z (float32, bf16 or int8, or empty) and output
// y (float32, bf16 or int8) checked.
inline Problem problem_of(const char* kernel, int64_t P, int64_t C, int64_t K, int64_t Cq, const uint8_t* x,
                          const torch::Tensor& w, const torch::Tensor& start, const torch::Tensor& scale,
                          const torch::Tensor& b, const torch::Tensor& z, int64_t zs, double z_scale,
                          const torch::Tensor& y, int64_t ys, double y_inverse, int64_t pre, double pre0,
                          double pre1, int64_t post, double post0, double post1) {
  const int zt = z.numel() ? type_of(kernel, "residual", z) : FLOAT32, yt = type_of(kernel, "output", y);
  return Problem{P, C, K, start.size(0), Cq, x, w.data_ptr<int8_t>(), start.data_ptr<int32_t>(),
                 scale.data_ptr<float>(), b.data_ptr<float>(), z.numel() ? z.data_ptr() : nullptr, zs, zt,
                 float(z_scale), y.data_ptr(), ys, yt, float(y_inverse), pre, post, _mm512_set1_ps(float(pre0)),
                 _mm512_set1_ps(float(pre1)), _mm512_set1_ps(float(post0)), _mm512_set1_ps(float(post1))};
}

"""

SOURCE = module_source(
    CORE,
    r"""

namespace {

void dispatch(const Problem& q, int64_t rows, int64_t vectors) {
  if (rows == 8 && vectors == 3) run<8, 3>(q);
  else if (rows == 6 && vectors == 4) run<6, 4>(q);
  else if (rows == 1 && vectors == 8) run<1, 8>(q);
  else TORCH_CHECK(false, "quantized_pointwise: no tile of ", rows, " pixels by ", vectors, " vectors");
}

}  // namespace

// x [N, C, H, W] float32, bf16 or int8 with contiguous channels (pixel (n, h, w) at n·sn + h·sh + w·sw), quantized
// with 1 / x_scale (a float x) into rows of Cq offset bytes; w packed by `pack_weight` (int8), start [Kp] int32,
// scale and b [Kp] float32; z [P, K] float32, bf16 or int8 (times z_scale; pixel stride zs) or empty; y [P, K]
// float32, bf16 or int8 (quantized with y_inverse; pixel stride ys).
void quantized_pointwise(torch::Tensor x, int64_t sn, int64_t sh, int64_t sw, double x_inverse, torch::Tensor w,
                         torch::Tensor start, torch::Tensor scale, torch::Tensor b, torch::Tensor z, int64_t zs,
                         double z_scale, torch::Tensor y, int64_t ys, double y_inverse, int64_t K, int64_t pre,
                         double pre0, double pre1, int64_t post, double post0, double post1, int64_t rows,
                         int64_t vectors) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), Cq = (C + 3) / 4 * 4;
  const int64_t Kp = start.size(0);
  TORCH_CHECK(w.scalar_type() == at::kChar && w.numel() == Cq * Kp, "quantized_pointwise: an int8 weight of ",
              Cq * Kp, " values expected, not ", w.numel(), " ", w.scalar_type());
  torch::Tensor fresh;
  const uint8_t* offset = offset_input("quantized_pointwise", x, sn, sh, sw, Cq, x_inverse, 0, 0, H, W, fresh);
  dispatch(problem_of("quantized_pointwise", N * H * W, C, K, Cq, offset, w, start, scale, b, z, zs, z_scale, y, ys,
                      y_inverse, pre, pre0, pre1, post, post0, post1),
           rows, vectors);
}
""",
)


def problem() -> str | None:
    """Why the kernel cannot run on this CPU (it needs AVX-512 VNNI), or None."""
    if "avx512_vnni" not in host_flags():
        return "the int8 1×1 convolution kernel needs AVX-512 VNNI (vpdpbusd), which this CPU lacks"
    return None


def pack_weight(wq: torch.Tensor, vectors: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An int8 weight [K, C] (output channels × input channels) as column blocks of `vectors` × 16 output channels,
    each [C/4, 16·vectors, 4] (C rounded up to 4, K up to 16, zeros past them), flat; and the sums' start
    −128·Σ_c Wq[c, k] as int32 [K rounded up to 16]."""
    k, c = wq.shape
    columns = torch.zeros(-(-c // 4) * 4, rounded(k), dtype=torch.int8)
    columns[:c, :k] = wq.detach().t()
    blocks = columns.split(16 * vectors, dim=1)
    packed = torch.cat([block.unflatten(0, (-1, 4)).transpose(1, 2).reshape(-1) for block in blocks])
    start = -128 * columns.sum(dim=0, dtype=torch.int32)
    return packed, start


class QuantizedPointwise:
    """An int8 1×1 convolution ready to run: its weight [K, C] (int8), the dequantizing factors x_scale · Ws[k]
    and the bias packed, its epilogue (activations by name, `ACTIVATIONS`) and tile checked, once."""

    __slots__ = ("_bias", "_epilogue", "_module", "_scale", "_start", "_weight", "channels", "in_channels", "x_scale")

    def __init__(
        self,
        wq: torch.Tensor,
        w_scale: torch.Tensor,
        x_scale: float,
        bias: torch.Tensor | None = None,
        pre: str = "",
        pre_params: tuple[float, float] = (0.0, 0.0),
        post: str = "",
        post_params: tuple[float, float] = (0.0, 0.0),
        tile: tuple[int, int] = (8, 3),
    ) -> None:
        check_activations("int8 1×1 convolution", pre, post)
        if tuple(tile) not in TILES:
            raise ValueError(f"the CPU int8 1×1 convolution kernel tiles {TILES} (pixels, vectors), not {tile}")
        if wq.dtype != torch.int8 or wq.dim() != 2:
            raise ValueError(f"the weight must be an int8 matrix [K, C], not {wq.dtype} {tuple(wq.shape)}")
        self.channels, self.in_channels = wq.shape
        self.x_scale = float(x_scale)
        self._weight, self._start = pack_weight(wq, tile[1])
        self._scale, self._bias = pack_factors(w_scale, self.x_scale, bias, self.channels)
        self._epilogue = (ACTIVATION_CODES[pre], *pre_params, ACTIVATION_CODES[post], *post_params, *tile)
        self._module = module()

    def __call__(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        z_scale: float = 0.0,
        y_scale: float = 0.0,
        out: torch.Tensor | None = None,
        float_type: torch.dtype | None = None,
    ) -> torch.Tensor:
        """The layer on x [N, C, H, W] (float32 or bf16, quantized here with x_scale, or int8 already quantized;
        channels contiguous, any pixel strides), with a residual [N, K, H, W] (float32 or bf16, or int8 times
        `z_scale`); int8 out quantized with `y_scale` when it is positive, else float: `float_type` (float32 or
        bf16), by default `output_type`'s. Into `out` ([N, K, H, W] of that type whose pixels are rows K apart:
        channels_last) or a new channels_last tensor, which is returned."""
        x = input_operand(x, self.in_channels, "1×1 convolution")
        n, _, h, w = x.shape
        dtype, y_inverse = output_type(y_scale, x, residual, float_type)
        shape = (n, self.channels, h, w)
        if out is None:
            out = torch.empty(shape, dtype=dtype, memory_format=torch.channels_last)
        elif (
            out.dtype != dtype or tuple(out.shape) != shape or not out.is_contiguous(memory_format=torch.channels_last)
        ):
            raise ValueError(f"out must be a channels_last {dtype} tensor of shape {shape}, not {out.dtype} "
                             f"{tuple(out.shape)} with strides {out.stride()}")  # fmt: skip
        z, z_scale = residual_operand(residual, z_scale, shape)
        self._module.quantized_pointwise(
            x, x.stride(0), x.stride(2), x.stride(3), 1.0 / self.x_scale, self._weight, self._start, self._scale,
            self._bias, z, self.channels, z_scale, out, self.channels, y_inverse, self.channels, *self._epilogue,
        )  # fmt: skip
        return out


def pack_factors(
    w_scale: torch.Tensor, x_scale: float, bias: torch.Tensor | None, channels: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sums' dequantizing factors x_scale · Ws[k] (in float32, as QuantizedConv's reference) and the bias, each
    packed as [channels rounded up to whole vectors] float32."""
    factors = w_scale.detach().float().reshape(-1) * torch.tensor(x_scale, dtype=torch.float32)
    return pack_bias(factors, channels), pack_bias(bias, channels)


def input_operand(x: torch.Tensor, channels: int, kernel: str) -> torch.Tensor:
    """x [N, C, H, W] float32, bf16 or int8 with `channels` channels, made channels_last unless its channels are
    contiguous; ValueError otherwise."""
    if x.dim() != 4 or x.dtype not in OPERAND_TYPES:
        raise ValueError(f"x must be a 4-D float32, bf16 or int8 tensor, not {x.dtype} {tuple(x.shape)}")
    if x.shape[1] != channels:
        raise ValueError(f"x has {x.shape[1]} channels; this {kernel} takes {channels}")
    if x.stride(1) != 1 and channels > 1:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def output_type(
    y_scale: float, x: torch.Tensor, residual: torch.Tensor | None = None, float_type: torch.dtype | None = None
) -> tuple[torch.dtype, float]:
    """The output's type and the factor it is quantized with: int8 and 1 / y_scale for a positive y_scale; else
    `float_type` when given, or the float type of x, or of a float residual where x is int8, else float32 (and 1,
    unused)."""
    if y_scale > 0:
        return torch.int8, 1.0 / y_scale
    if float_type is not None:
        if float_type not in (torch.float32, torch.bfloat16):
            raise ValueError(f"the int8 CPU kernels write float32 or bf16, not {float_type}")
        return float_type, 1.0
    for operand in (x, residual):
        if operand is not None and operand.is_floating_point():
            return operand.dtype, 1.0
    return torch.float32, 1.0


def residual_operand(
    residual: torch.Tensor | None, z_scale: float, shape: tuple[int, ...]
) -> tuple[torch.Tensor, float]:
    """The residual as the kernels take it (channels_last, or empty) with its scale: an int8 residual takes a positive
    z_scale, a float one none; ValueError for another type or shape."""
    if residual is None:
        return ABSENT, 0.0
    if tuple(residual.shape) != shape or residual.dtype not in OPERAND_TYPES:
        raise ValueError(
            f"the residual must be float32, bf16 or int8 of shape {shape}, not {residual.dtype} {tuple(residual.shape)}"
        )
    if (residual.dtype == torch.int8) != (z_scale > 0):
        raise ValueError("an int8 residual takes a positive z_scale, a float one none")
    return residual.contiguous(memory_format=torch.channels_last), z_scale if residual.dtype == torch.int8 else 1.0


@functools.cache
def module():
    """The compiled extension (built on first use, then loaded from the cache); RuntimeError without VNNI."""
    reason = problem()
    if reason:
        raise RuntimeError(reason)
    return load_avx512("quantized_pointwise", SOURCE, "int8 1×1 convolution")
