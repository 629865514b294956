"""1×1 convolution (a product of the pixels' channel vectors with a [C, K] weight) on the CPU in C++ with AVX-512,
float32, channels_last, with the whole FusedConv epilogue inside:

    y[p, k] = post(pre(b[k] + Σ_c x[p, c] · w[c, k]) + z[p, k])        (p over every pixel of every image)

A tile is `rows` pixels × `vectors` vectors of 16 output channels held in registers: each input channel adds one
weight row (`vectors` loads) times each pixel's value (a broadcast) to the tile, `rows` × `vectors` multiply-adds
a step. The weight is packed once in column blocks of the tile's width, each [C, 16·vectors] contiguous (the last
block narrower where the vectors do not divide K rounded up to 16), so that a tile reads its weights as one stream
(read as a strip of [C, K] rows they were 1.09-1.11× slower over MobileNetV3's 1×1 layers in sequence); a last
partial vector of output channels is masked when stored. Threads take runs of (pixel tile, column block) items.
Where the inputs outweigh the weight (wide maps), a pixel tile's blocks one after the other, so a tile's input rows
stay in cache (blocks outermost was slower there); where the weight outweighs the inputs (deep layers of few
pixels, a transformer's products at batch 1), a block's tiles one after the other, so each block is read from memory
once, not once a tile: 8-20% faster on ConvNeXt's and ResNet's 7×7 stages and 9% on BERT's feed-forward products
with the weights cold, as an engine meets them. A product of one pixel (a matrix-vector product: a classifier at
batch 1, run as a 1×1 convolution of a 1×1 image, with the 1×8 tile) spreads its column blocks over the threads.

Why our own: a oneDNN call through torch costs 25-45 µs of set-up (docs/design.md, "The CPU at batch 1"), and the
1×1 convolutions are half the layers of MobileNet and EfficientNet.
"""

from __future__ import annotations

import functools

import torch

from ..activations import ACTIVATION_CODES
from .avx512 import (
    ABSENT,
    DTYPE_NAMES,
    check_activations,
    kernel_dtype,
    load_vector,
    module_source,
    pack_bias,
    paired_rows,
    register_tiles,
    rounded,
    tile_dispatch,
    vector_problem,
)
from .avx512 import ACTIVATIONS as ACTIVATIONS  # the epilogues this kernel evaluates, for its tactic

# (pixels, vectors of 16 output channels) a tile, for AVX-512's 32 registers and for AVX2's 16; the C++ instantiates
# this CPU's
AVX512_TILES = ((8, 3), (6, 4), (1, 8))
TILES = register_tiles(AVX512_TILES, ((6, 1), (3, 2), (1, 6)))
# those of many pixels, which the kernels that run this one's tiles over a row of pixels take
ROW_TILES = tuple(tile for tile in TILES if tile[0] > 1)
SCALED_BYTES = 4 << 20  # with input-channel scales, the most their scaled copies (weights or inputs) take at once

# The kernel's C++ but its entry point (the module puts it in an unnamed namespace; the fused depthwise + 1×1
# kernel, `kernels.cpu.depthwise_pointwise`, in a named one).
CORE = r"""

// T: float, or uint16_t for bf16 activations and weights (sums, bias and epilogue in float32 either way).
template <typename T>
struct ProblemOf {
  int64_t P, C, K, Kp;  // pixels, input channels, output channels, K rounded up to 16
  const T* x;           // pixel p's channels at x + p·xs
  int64_t xs;
  const T* w;           // column blocks [C, 16·NV] (bf16: [C/2 rounded up, 16·NV, 2]), block b at C·16·NV·b (bf16:
                        // C rounded up to even)
  const float* b;       // [Kp]
  const T* z;           // the residual (pixel p's at z + p·zs), or null
  int64_t zs;
  T* y;
  int64_t ys;
  int64_t pre, post;
  __m512 pre0, pre1, post0, post1;
  const float* s;       // per image, a scale for each input channel ([N, C]: a squeeze-excite gate), or null
  int64_t sP;           // pixels an image
  int64_t budget;       // with scales: the most bytes their scaled copies take at once
};
using Problem = ProblemOf<float>;

// Pixels p0 .. p0+MR-1 (those past P read the last pixel and are not stored) × output vectors from k0, NV of them.
template <int MR, int NV, typename T>
inline void tile(const ProblemOf<T>& q, int64_t p0, int64_t k0) {
  const T* a[MR];
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) a[r] = q.x + std::min(p0 + r, q.P - 1) * q.xs;
  __m512 acc[MR * NV];
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const __m512 bias = _mm512_loadu_ps(q.b + k0 + 16 * v);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) acc[r * NV + v] = bias;
  }
  if constexpr (sizeof(T) == 4) accumulate<MR, NV>(acc, a, q.w + k0 * q.C, q.C);  // this tile's weight block
  else accumulate_pairs<MR, NV>(acc, a, q.w + k0 * weight_rows<T>(q.C), q.C);
  activate_tile<MR * NV, sizeof(T) == 2>(acc, MR * NV, q.pre, q.pre0, q.pre1);
  const int rows = int(std::min<int64_t>(MR, q.P - p0));
  __mmask16 m[NV];
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) m[v] = mask_of(q.K - k0 - 16 * v);
  if (q.z) {
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      if (r >= rows) break;
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const __m512 zv = load16(m[v], q.z + (p0 + r) * q.zs + k0 + 16 * v);
        acc[r * NV + v] = _mm512_add_ps(acc[r * NV + v], zv);
      }
    }
  }
  activate_tile<MR * NV, sizeof(T) == 2>(acc, MR * NV, q.post, q.post0, q.post1);
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (r >= rows) break;
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store16(q.y + (p0 + r) * q.ys + k0 + 16 * v, m[v], acc[r * NV + v]);
  }
}

// The block of output vectors from k0, `left` of them (fewer than NV: the last block): the tile of that width.
template <int MR, int R, typename T>
inline void narrower(const ProblemOf<T>& q, int64_t p0, int64_t k0, int64_t left) {
  if constexpr (R > 0) {
    if (left == R) tile<MR, R>(q, p0, k0);
    else narrower<MR, R - 1>(q, p0, k0, left);
  }
}

// The tile of pixels from p0 × the block of output vectors from v (`vectors` of them in all; the last block narrower).
template <int MR, int NV, typename T>
inline void item(const ProblemOf<T>& q, int64_t p0, int64_t v, int64_t vectors) {
  if (vectors - v >= NV) tile<MR, NV>(q, p0, 16 * v);
  else narrower<MR, NV - 1>(q, p0, 16 * v, vectors - v);
}

// Work items a parallel chunk takes at least: 64k multiply-adds.
template <int MR, int NV, typename T>
inline int64_t grain(const ProblemOf<T>& q) {
  return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, MR * q.C * 16 * NV));
}

// Work items: a tile of pixels × a block of NV output vectors (the last block narrower). Where the inputs outweigh
// the weight (wide maps) a pixel tile's blocks are consecutive, so that a thread's items share their input rows;
// where the weight outweighs them (deep layers of few pixels, a transformer's products at batch 1) a block's tiles
// are, so that each block of the weight is read from memory once rather than once a tile. A product of few pixels
// (a matrix-vector product) still spreads over every thread.
template <int MR, int NV, typename T>
void plain(const ProblemOf<T>& q) {
  const int64_t vectors = q.Kp / 16, blocks = (vectors + NV - 1) / NV, tiles = (q.P + MR - 1) / MR;
  const bool by_block = q.Kp > q.P;  // the weight's C·Kp values against the inputs' P·C
  at::parallel_for(0, tiles * blocks, grain<MR, NV>(q), [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int64_t t = by_block ? i % tiles : i / blocks, b = by_block ? i / tiles : i % blocks;
      item<MR, NV>(q, t * MR, b * NV, vectors);
    }
  });
}

// With input-channel scales (q.s, a squeeze-excite gate) each image runs the plain product on a scaled copy of one
// operand, x·diag(s_n)·w = (x·diag(s_n))·w = x·(diag(s_n)·w), whichever is smaller: its pixels' inputs (sP·C
// values, maps of fewer pixels than output channels) or the weight (C·Kp, row c of every block times s[n, c]). The
// copies are made for a group of images at a time (within q.budget bytes), then that group's tiles run, each within
// one image. (Scaling each broadcast input value inside the tile instead cost 1.2-1.45× the plain product.) In bf16
// the copies are bf16 too (rounded once more, as the gated input of the layers apart would be), the weight's rows
// scaled a pair at a time (its blocks interleave rows in pairs).
template <int MR, int NV, typename T>
void scaled(const ProblemOf<T>& q) {
  constexpr int64_t step = sizeof(T) == 2 ? 2 : 1;  // weight rows scaled together: bf16 interleaves pairs
  const int64_t vectors = q.Kp / 16, blocks = (vectors + NV - 1) / NV;
  const int64_t images = q.P / q.sP, tiles = (q.sP + MR - 1) / MR;
  const int64_t rows = weight_rows<T>(q.C);
  const bool inputs = q.sP < q.Kp;
  const int64_t size = inputs ? q.sP * q.C : rows * q.Kp;
  const int64_t group = std::clamp<int64_t>(q.budget / (int64_t(sizeof(T)) * size), 1, images);
  const auto copies = torch::empty({group, size}, sizeof(T) == 2 ? torch::kBFloat16 : torch::kFloat32);
  T* const cs = reinterpret_cast<T*>(copies.data_ptr());
  for (int64_t n0 = 0; n0 < images; n0 += group) {
    const int64_t count = std::min(group, images - n0);
    if (inputs) {  // items: pixels, each its C channels times its image's scales
      at::parallel_for(0, count * q.sP, std::max<int64_t>(1, 4096 / q.C), [&](int64_t first, int64_t last) {
        for (int64_t i = first; i < last; ++i) {
          const T* x = q.x + ((n0 * q.sP) + i) * q.xs;
          const float* scale = q.s + (n0 + i / q.sP) * q.C;
          for (int64_t c = 0; c < q.C; c += 16) {
            const __mmask16 m = mask_of(q.C - c);
            store16(cs + i * q.C + c, m, _mm512_mul_ps(load16(m, x + c), _mm512_maskz_loadu_ps(m, scale + c)));
          }
        }
      });
    } else {  // items: a step of weight rows, each times its image's scale for that input channel
      const int64_t steps = rows / step;
      at::parallel_for(0, count * steps, std::max<int64_t>(1, 4096 / q.Kp), [&](int64_t first, int64_t last) {
        for (int64_t i = first; i < last; ++i) {
          const int64_t n = i / steps, c = i % steps * step;
          const float* sn = q.s + (n0 + n) * q.C;
          __m512 scale = _mm512_set1_ps(sn[c]);
          if constexpr (step == 2) {  // lanes alternate the pair's two scales (an odd C's last pair: a zero row)
            const float second = c + 1 < q.C ? sn[c + 1] : 0.f;
            scale = _mm512_mask_mov_ps(scale, __mmask16(0xAAAA), _mm512_set1_ps(second));
          }
          for (int64_t b = 0; b < blocks; ++b) {
            const int64_t width = 16 * std::min<int64_t>(NV, vectors - b * NV);
            const int64_t at = rows * 16 * NV * b + c * width;
            for (int64_t j = 0; j < step * width; j += 16)
              store16(cs + n * size + at + j, __mmask16(0xFFFF), _mm512_mul_ps(scale, load16(0xFFFF, q.w + at + j)));
          }
        }
      });
    }
    at::parallel_for(0, count * tiles * blocks, grain<MR, NV>(q), [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) {
        const int64_t n = i / (tiles * blocks);
        ProblemOf<T> image = q;  // image n0 + n alone, with its scaled copy
        const int64_t start = (n0 + n) * q.sP;
        image.P = q.sP;
        image.x = inputs ? cs + n * size : q.x + start * q.xs;
        image.xs = inputs ? q.C : q.xs;
        image.w = inputs ? q.w : cs + n * size;
        image.z = q.z ? q.z + start * q.zs : nullptr;
        image.y = q.y + start * q.ys;
        item<MR, NV>(image, i / blocks % tiles * MR, i % blocks * NV, vectors);
      }
    });
  }
}

template <int MR, int NV, typename T>
void run(const ProblemOf<T>& q) {
  if (q.P == 0) return;
  if (q.s) return scaled<MR, NV>(q);
  plain<MR, NV>(q);
}

"""

SOURCE = module_source(
    CORE,
    r"""

namespace {

template <typename T>
void dispatch(const ProblemOf<T>& q, int64_t rows, int64_t vectors) {
  """
    + tile_dispatch(TILES, ("rows", "vectors"), "run<{tile}>(q)", "pointwise")
    + r"""
}

// The call on x, w, z and y of T (their data pointers as T).
template <typename T>
void launch(torch::Tensor x, int64_t xs, torch::Tensor w, torch::Tensor b, torch::Tensor z, int64_t zs,
            torch::Tensor y, int64_t ys, int64_t P, int64_t K, torch::Tensor s, int64_t sP, int64_t budget,
            int64_t pre, double pre0, double pre1, int64_t post, double post0, double post1, int64_t rows,
            int64_t vectors) {
  const auto data = [](const torch::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); };
  const ProblemOf<T> q{P, x.size(1), K, b.size(0), data(x), xs, data(w), b.data_ptr<float>(),
                       z.numel() ? data(z) : nullptr, zs, data(y), ys, pre, post, _mm512_set1_ps(float(pre0)),
                       _mm512_set1_ps(float(pre1)), _mm512_set1_ps(float(post0)), _mm512_set1_ps(float(post1)),
                       s.numel() ? s.data_ptr<float>() : nullptr, sP, budget};
  TORCH_CHECK(w.numel() == weight_rows<T>(q.C) * q.Kp, "pointwise: a weight of ", w.numel(), " values for ", q.C,
              " input channels");
  dispatch(q, rows, vectors);
}

}  // namespace

// x [P, C] and y [P, K] rows of pixels (row strides xs, ys), w packed in blocks of `vectors` (`pack_weight`), b [Kp],
// z [P, K] (stride zs) or empty, s [N, C] float32 input-channel scales of each image of sP pixels, or empty (their
// scaled copies within `budget` bytes at once). x, w, z and y all float32, or all bf16 (w in pairs of rows).
void pointwise(torch::Tensor x, int64_t xs, torch::Tensor w, torch::Tensor b, torch::Tensor z, int64_t zs,
               torch::Tensor y, int64_t ys, int64_t P, int64_t K, torch::Tensor s, int64_t sP, int64_t budget,
               int64_t pre, double pre0, double pre1, int64_t post, double post0, double post1, int64_t rows,
               int64_t vectors) {
  by_type("pointwise", x, {w, y, z}, [&](auto e) {
    launch<decltype(e)>(x, xs, w, b, z, zs, y, ys, P, K, s, sP, budget, pre, pre0, pre1, post, post0, post1, rows,
                        vectors);
  });
}

namespace {

template <typename T>
void pooled(torch::Tensor x, int64_t xs, int64_t N, int64_t HW, torch::Tensor w, torch::Tensor b, torch::Tensor y,
            int64_t K, int64_t pre, double pre0, double pre1, int64_t post, double post0, double post1, int64_t rows,
            int64_t vectors) {
  const int64_t C = x.size(1), Kp = b.size(0), vectorsC = (C + 15) / 16;
  TORCH_CHECK(w.numel() == weight_rows<T>(C) * Kp, "pooled_pointwise: a weight of ", w.numel(), " values for ", C,
              " input channels");
  auto means = torch::empty({N, C}, x.options());
  const auto data = [](const torch::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); };
  const T* xp = data(x);
  T* sp = data(means);
  const __m512 inv = _mm512_set1_ps(1.f / float(HW));
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, 16 * HW));
  at::parallel_for(0, N * vectorsC, grain, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int64_t n = i / vectorsC, c = i % vectorsC * 16;
      const __mmask16 m = mask_of(C - c);
      const T* px = xp + n * HW * xs + c;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t p = 0; p < HW; ++p) acc = _mm512_add_ps(acc, load16(m, px + p * xs));
      store16(sp + n * C + c, m, _mm512_mul_ps(acc, inv));
    }
  });
  const ProblemOf<T> q{N, C, K, Kp, sp, C, data(w), b.data_ptr<float>(), nullptr, 0, data(y), K, pre, post,
                       _mm512_set1_ps(float(pre0)), _mm512_set1_ps(float(pre1)), _mm512_set1_ps(float(post0)),
                       _mm512_set1_ps(float(post1)), nullptr, 1};
  dispatch(q, rows, vectors);
}

}  // namespace

// y [N, K] (contiguous) = the product of each image's mean pixel: x holds N images of HW pixels, pixel p's C
// channels at x + p·xs. The means go to a [N, C] buffer of x's type (a parallel item: 16 channels of one image, its
// pixels added in order in float32), then the rows of the buffer are multiplied as `pointwise` does. x, w and y all
// float32 or all bf16.
void pooled_pointwise(torch::Tensor x, int64_t xs, int64_t N, int64_t HW, torch::Tensor w, torch::Tensor b,
                      torch::Tensor y, int64_t K, int64_t pre, double pre0, double pre1, int64_t post, double post0,
                      double post1, int64_t rows, int64_t vectors) {
  by_type("pooled_pointwise", x, {w, y}, [&](auto e) {
    pooled<decltype(e)>(x, xs, N, HW, w, b, y, K, pre, pre0, pre1, post, post0, post1, rows, vectors);
  });
}
""",
)


def problem() -> str | None:
    """Why the kernel cannot run on this CPU, or None."""
    return vector_problem("1×1 convolution")


def pack_weight(w: torch.Tensor, vectors: int) -> torch.Tensor:
    """A 1×1 convolution's weight [K, C, 1, 1] as float32 column blocks of `vectors` × 16 output channels, each
    [C, 16·vectors] contiguous, one after the other (the last narrower; zeros past K): flat, C · K rounded up to 16.
    A bf16 weight stays bf16, each block's rows interleaved in pairs (`paired_rows`) for the bf16 dot product, which
    takes two input channels a step."""
    k, c = w.shape[:2]
    half = w.dtype == torch.bfloat16
    columns = torch.zeros(c, rounded(k), dtype=torch.bfloat16 if half else torch.float32)
    columns[:, :k] = w.detach().reshape(k, c).t()
    blocks = columns.split(16 * vectors, dim=1)
    return torch.cat([(paired_rows(block) if half else block).reshape(-1) for block in blocks])


def pixel_stride(t: torch.Tensor) -> int | None:
    """The distance between consecutive pixels of a 4-D tensor whose pixels are evenly spaced rows of contiguous
    channels (channels_last, or a channel slice of such a tensor), or None. Strides of dimensions of size 1 do not
    count."""
    n, c, h, w = t.shape
    s = t.stride(3) if w > 1 else t.stride(2) if h > 1 else t.stride(0) if n > 1 else c
    evenly = (w == 1 or t.stride(3) == s) and (h == 1 or t.stride(2) == w * s) and (n == 1 or t.stride(0) == h * w * s)
    return s if evenly and (c == 1 or t.stride(1) == 1) else None


class PointwiseConv:
    """A 1×1 convolution ready to run: its weight [K, C, 1, 1] and bias packed, its epilogue (activations by name,
    `ACTIVATIONS`, with their parameters as `kernels.activations.activation_args` gives them) and tile checked,
    once. A bf16 weight makes a bf16 convolution (bf16 input, residual and output; float32 sums and epilogue), on a
    CPU with AVX512-BF16."""

    __slots__ = ("_bias", "_epilogue", "_module", "_weight", "channels", "dtype", "in_channels")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        pre: str = "",
        pre_params: tuple[float, float] = (0.0, 0.0),
        post: str = "",
        post_params: tuple[float, float] = (0.0, 0.0),
        tile: tuple[int, int] | None = None,
    ) -> None:
        check_activations("1×1 convolution", pre, post)
        tile = TILES[0] if tile is None else tuple(tile)
        if tile not in TILES:
            raise ValueError(f"the CPU 1×1 convolution kernel tiles {TILES} (pixels, vectors), not {tile}")
        self.channels, self.in_channels = weight.shape[:2]
        self.dtype = kernel_dtype(weight)
        self._weight, self._bias = pack_weight(weight, tile[1]), pack_bias(bias, self.channels)
        self._epilogue = (ACTIVATION_CODES[pre], *pre_params, ACTIVATION_CODES[post], *post_params, *tile)
        self._module = module()

    def __call__(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """post(pre(conv(x · scale) + bias) + residual) for x [N, C, H, W] and the residual [N, K, H, W] in the
        convolution's dtype (each made channels_last unless its pixels are evenly spaced rows of contiguous channels,
        `pixel_stride`), `scale` [N, C] float32 (each image's input channels scaled, a squeeze-excite gate) or None;
        into `out` (evenly spaced pixels too) or a new channels_last tensor, which is returned."""
        x, xs = _rows("x", x, self.dtype)
        n, c, h, w = x.shape
        if c != self.in_channels:
            raise ValueError(f"x has {c} channels; this 1×1 convolution takes {self.in_channels}")
        if out is None:  # (a new channels_last tensor's pixels are K apart)
            out = torch.empty((n, self.channels, h, w), dtype=self.dtype, memory_format=torch.channels_last)
            ys = self.channels
        else:
            ys = pixel_stride(out)
            if out.dtype != self.dtype or ys is None:
                raise ValueError(
                    f"out must be a 4-D {DTYPE_NAMES[self.dtype]} tensor of evenly spaced pixels with contiguous "
                    f"channels, not {out.dtype} {tuple(out.shape)} with strides {out.stride()}"
                )
        z, zs = (ABSENT, 0) if residual is None else _rows("residual", residual, self.dtype)
        if scale is None:
            scale = ABSENT
        elif scale.dtype != torch.float32 or tuple(scale.shape) != (n, c):
            raise ValueError(f"scale must be a float32 tensor of shape {(n, c)}, not {scale.dtype} "
                             f"{tuple(scale.shape)}")  # fmt: skip
        else:
            scale = scale.contiguous()
        self._module.pointwise(x, xs, self._weight, self._bias, z, zs, out, ys, n * h * w, self.channels, scale,
                               h * w, SCALED_BYTES, *self._epilogue)  # fmt: skip
        return out

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        """post(pre(mean(x) · w + bias)) [N, K] for x [N, C, H, W] in the convolution's dtype, the mean over each
        image's pixels (a global average pool, then this product: a classifier's head in one call; in bf16 the means
        are rounded to bf16, as the pool's output would be), x made channels_last unless its pixels are evenly spaced
        rows of contiguous channels."""
        x, xs = _rows("x", x, self.dtype)
        n, c, h, w = x.shape
        if c != self.in_channels:
            raise ValueError(f"x has {c} channels; this 1×1 convolution takes {self.in_channels}")
        out = torch.empty((n, self.channels), dtype=self.dtype)
        self._module.pooled_pointwise(x, xs, n, h * w, self._weight, self._bias, out, self.channels, *self._epilogue)
        return out


def _rows(name: str, t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """`t` with evenly spaced pixels (made channels_last if need be) and its pixel stride."""
    if t.dtype != dtype or t.dim() != 4:
        raise ValueError(f"{name} must be a 4-D {DTYPE_NAMES[dtype]} tensor, not {t.dtype} {tuple(t.shape)}")
    stride = pixel_stride(t)
    if stride is None:
        t = t.contiguous(memory_format=torch.channels_last)
        stride = pixel_stride(t)
    return t, stride


@functools.cache
def module():
    """The compiled extension (built on first use, then loaded from the cache)."""
    return load_vector("pointwise", SOURCE, "1×1 convolution", ("pointwise", "pooled_pointwise"))
