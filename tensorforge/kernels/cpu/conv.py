"""A one-group convolution of any window, stride, dilation and padding (a 3×3 layer of ResNet or of the YOLO
detector) on the CPU in C++ with AVX-512, float32 or bf16 (a CPU with AVX512-BF16: bf16 activations and weight, the
1×1 kernel's paired step, float32 sums and epilogue), channels_last, with the whole FusedConv epilogue inside:

    y[n, oh, ow, k] = post(pre(b[k] + Σ_(kh,kw,c) w[kh, kw, c, k] · x[n, ih, iw, c]) + z[n, oh, ow, k])
    ih = oh·s_h − p_h + kh·d_h,  iw = ow·s_w − p_w + kw·d_w

The 1×1 kernel's tile (`kernels.cpu.pointwise`) over the window's taps: `rows` consecutive output pixels of an
image (row-major, so a tile may span output rows) × `vectors` vectors of 16 output channels in registers; each tap
adds the C input channels of the tile's pixels at that tap, a weight row (`vectors` loads) times each pixel's value
(a broadcast), so a tap is C steps of the 1×1 kernel's loop. A tap row outside the input for every pixel of the tile
is skipped; a pixel whose tap falls in the padding reads a row of zeros. (Tiles within one output row left ResNet's
7×7 maps in tiles of 6 and 1 pixels, each streaming the whole weight: 1.6× the time of tiles spanning rows on two
AVX2 cores.) The weight is packed once in column blocks of the tile's width, each [KH·KW·C, 16·vectors] contiguous
(taps in (kh, kw) order, then channels), the last narrower; a last partial vector of output channels is masked.
In bf16 each tap's rows are interleaved in pairs (`paired_rows`, a zero row after an odd C).

Why our own: oneDNN through torch runs these layers at 70-80% of a core's peak inside a network, and ONNX Runtime's
convolutions were 1.3× faster than it on the detector's 3×3 layers (docs/design.md, "Direct convolutions").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from ..activations import ACTIVATION_CODES
from .avx512 import ACTIVATIONS as ACTIVATIONS  # the epilogues this kernel evaluates, for its tactic
from .avx512 import (
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
from .depthwise import convolution_operands

# (output pixels of a row, vectors of 16 output channels), for AVX-512's 32 registers and for AVX2's 16; the C++
# instantiates this CPU's
TILES = register_tiles(((8, 3), (6, 4)), ((6, 1), (3, 2)))

CORE = r"""

// T: float, or uint16_t for bf16 activations and weight (sums, bias and epilogue in float32 either way).
template <typename T>
struct ConvOf {
  int64_t C, H, W, K, Kp, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW;
  int64_t xN, xH, xW, yN, yH, yW, zN, zH, zW;  // element strides (channels contiguous)
  const T* x;
  const T* w;      // column blocks [KH·KW·C, 16·NV], block b at KH·KW·C·16·NV·b (bf16: C rounded up to even, each
                   // tap's rows in pairs, [C/2, 16·NV, 2])
  const float* b;  // [Kp]
  const T* z;      // the residual, or null
  T* y;
  const T* zeros;  // C zeros: the input of a tap in the padding
  int64_t pre, post;
  __m512 pre0, pre1, post0, post1;
};

// Output pixels p0 .. p0+count-1 of image n, in row-major order over its OH × OW (a tile may span rows: a 7-pixel
// row in tiles of 6 would leave the second tile one pixel wide; the tile's other pixels repeat the last and are not
// stored) × output vectors from k0, NV of them.
template <int MR, int NV, typename T>
inline void tile(const ConvOf<T>& q, int64_t n, int64_t p0, int count, int64_t k0) {
  __m512 acc[MR * NV];
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const __m512 bias = _mm512_loadu_ps(q.b + k0 + 16 * v);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) acc[r * NV + v] = bias;
  }
  int64_t top[MR], left[MR];  // each pixel's window's first input row and column
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    const int64_t p = p0 + std::min(r, count - 1);
    top[r] = p / q.OW * q.sh - q.ph;
    left[r] = p % q.OW * q.sw - q.pw;
  }
  const int64_t C = q.C, rows = weight_rows<T>(C);  // a tap's weight rows
  const T* block = q.w + k0 * q.KH * q.KW * rows;
  const T* image = q.x + n * q.xN;
  for (int64_t kh = 0; kh < q.KH; ++kh) {
    const T* row[MR];  // each pixel's input row at this tap row, or null in the padding
    bool any = false;
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const int64_t ih = top[r] + kh * q.dh;
      row[r] = ih >= 0 && ih < q.H ? image + ih * q.xH : nullptr;
      any |= row[r] != nullptr;
    }
    if (!any) continue;
    for (int64_t kw = 0; kw < q.KW; ++kw) {
      const T* a[MR];
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const int64_t iw = left[r] + kw * q.dw;
        a[r] = row[r] && iw >= 0 && iw < q.W ? row[r] + iw * q.xW : q.zeros;
      }
      const T* taps = block + (kh * q.KW + kw) * rows * 16 * NV;
      if constexpr (sizeof(T) == 4) accumulate<MR, NV>(acc, a, taps, C);
      else accumulate_pairs<MR, NV>(acc, a, taps, C);
    }
  }
  activate_tile<MR * NV, sizeof(T) == 2>(acc, MR * NV, q.pre, q.pre0, q.pre1);
  __mmask16 m[NV];
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) m[v] = mask_of(q.K - k0 - 16 * v);
  if (q.z) {
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      if (r >= count) break;
      const int64_t p = p0 + r;
      const T* z = q.z + n * q.zN + p / q.OW * q.zH + p % q.OW * q.zW + k0;
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r * NV + v] = _mm512_add_ps(acc[r * NV + v], load16(m[v], z + 16 * v));
    }
  }
  activate_tile<MR * NV, sizeof(T) == 2>(acc, MR * NV, q.post, q.post0, q.post1);
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (r >= count) break;
    const int64_t p = p0 + r;
    T* y = q.y + n * q.yN + p / q.OW * q.yH + p % q.OW * q.yW + k0;
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store16(y + 16 * v, m[v], acc[r * NV + v]);
  }
}

template <int MR, int R, typename T>
inline void narrower(const ConvOf<T>& q, int64_t n, int64_t p0, int count, int64_t k0, int64_t left) {
  if constexpr (R > 0) {
    if (left == R) tile<MR, R>(q, n, p0, count, k0);
    else narrower<MR, R - 1>(q, n, p0, count, k0, left);
  }
}

constexpr int64_t kStreamedWeight = 4 << 20;  // bytes of weight above which a call walks column blocks outermost

// Work items: a tile of an output row × a block of NV output vectors (the last block narrower), a tile's blocks
// consecutive, so that a thread's items share their input pixels; with a weight of more than kStreamedWeight bytes
// (ResNet-50's 512-channel 3×3 layers: 9.4 MB), a block's tiles consecutive instead, so that each thread reads its
// blocks of the weight once rather than once a tile row (512 → 512 on 7×7 pixels: 1.72 → 1.14-1.17 ms on two cores).
template <int MR, int NV, typename T>
void run(const ConvOf<T>& q, int64_t N) {
  const int64_t vectors = q.Kp / 16, blocks = (vectors + NV - 1) / NV, pixels = q.OH * q.OW;
  const int64_t tiles = (pixels + MR - 1) / MR, items = N * tiles * blocks;  // tiles: an image's
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, MR * q.KH * q.KW * q.C * 16 * NV));
  const bool by_block = int64_t(sizeof(T)) * q.KH * q.KW * q.C * q.Kp > kStreamedWeight;
  at::parallel_for(0, items, grain, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int64_t block = by_block ? i / (N * tiles) : i % blocks, at = by_block ? i % (N * tiles) : i / blocks;
      const int64_t v = block * NV, n = at / tiles, p0 = at % tiles * MR;
      const int count = int(std::min<int64_t>(MR, pixels - p0));
      if (vectors - v >= NV) tile<MR, NV>(q, n, p0, count, 16 * v);
      else narrower<MR, NV - 1>(q, n, p0, count, 16 * v, vectors - v);
    }
  });
}

"""

SOURCE = module_source(
    CORE,
    r"""

namespace {

// The call on x, w, z and y of T (their data pointers as T).
template <typename T>
void launch(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor z, torch::Tensor y, int64_t KH,
            int64_t KW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t pre,
            double pre0, double pre1, int64_t post, double post0, double post1, int64_t rows, int64_t vectors) {
  TORCH_CHECK(x.stride(1) == 1 && y.stride(1) == 1, "conv: channels must be contiguous (channels_last)");
  TORCH_CHECK(!z.numel() || z.stride(1) == 1, "conv: the residual's channels must be contiguous");
  const int64_t C = x.size(1);
  TORCH_CHECK(w.numel() == KH * KW * weight_rows<T>(C) * b.size(0), "conv: a weight of ", w.numel(), " values for ", C,
              " input channels and a ", KH, "×", KW, " window");
  const auto data = [](const torch::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); };
  const auto zeros = torch::zeros({C}, x.options());
  const ConvOf<T> q{C, x.size(2), x.size(3), y.size(1), b.size(0), KH, KW, sh, sw, ph, pw, dh, dw, y.size(2),
                    y.size(3), x.stride(0), x.stride(2), x.stride(3), y.stride(0), y.stride(2), y.stride(3),
                    z.numel() ? z.stride(0) : 0, z.numel() ? z.stride(2) : 0, z.numel() ? z.stride(3) : 0, data(x),
                    data(w), b.data_ptr<float>(), z.numel() ? data(z) : nullptr, data(y), data(zeros), pre, post,
                    _mm512_set1_ps(float(pre0)), _mm512_set1_ps(float(pre1)), _mm512_set1_ps(float(post0)),
                    _mm512_set1_ps(float(post1))};
  const int64_t N = x.size(0);
  """
    + tile_dispatch(TILES, ("rows", "vectors"), "run<{tile}>(q, N)", "conv")
    + r"""
}

}  // namespace

// x [N, C, H, W] and y [N, K, OH, OW] channels_last (any pixel strides, channels contiguous), z as y or empty;
// w packed in blocks of `vectors` (`pack_weight`), b [Kp]. x, w, z and y all float32, or all bf16. Writes y.
void conv(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor z, torch::Tensor y, int64_t KH,
          int64_t KW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t pre,
          double pre0, double pre1, int64_t post, double post0, double post1, int64_t rows, int64_t vectors) {
  by_type("conv", x, {w, y, z}, [&](auto e) {
    launch<decltype(e)>(x, w, b, z, y, KH, KW, sh, sw, ph, pw, dh, dw, pre, pre0, pre1, post, post0, post1, rows,
                        vectors);
  });
}
""",
)


def problem() -> str | None:
    """Why the kernel cannot run on this CPU, or None."""
    return vector_problem("convolution")


def pack_weight(w: torch.Tensor, vectors: int) -> torch.Tensor:
    """A convolution's weight [K, C, KH, KW] as float32 column blocks of `vectors` × 16 output channels, each
    [KH·KW·C, 16·vectors] contiguous (rows in (kh, kw, c) order), one after the other (the last narrower; zeros past
    K): flat, KH·KW·C · K rounded up to 16. A bf16 weight stays bf16, each tap's rows interleaved in pairs
    (`paired_rows`: C rounded up to even)."""
    k, c = w.shape[:2]
    half = w.dtype == torch.bfloat16
    taps = w.detach().permute(2, 3, 1, 0).reshape(-1, c, k)  # [(kh, kw), C, K]
    columns = torch.zeros(taps.shape[0], c, rounded(k), dtype=torch.bfloat16 if half else torch.float32)
    columns[..., :k] = taps
    blocks = columns.split(16 * vectors, dim=2)
    return torch.cat([(paired_rows(block) if half else block).reshape(-1) for block in blocks])


class DirectConv:
    """A one-group convolution ready to run: its weight [K, C, KH, KW] and bias packed, its strides, dilations,
    epilogue (activations by name, `ACTIVATIONS`, with their parameters as `kernels.activations.activation_args`
    gives them) and tile checked, once; calls give the input, its padding and the output's size. A bf16 weight makes
    a bf16 convolution (bf16 input, residual and output; float32 sums and epilogue), on a CPU with AVX512-BF16."""

    __slots__ = ("_bias", "_epilogue", "_module", "_strides", "_weight", "channels", "dtype", "in_channels", "kernel")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        strides: Sequence[int] = (1, 1),
        dilations: Sequence[int] = (1, 1),
        pre: str = "",
        pre_params: tuple[float, float] = (0.0, 0.0),
        post: str = "",
        post_params: tuple[float, float] = (0.0, 0.0),
        tile: tuple[int, int] | None = None,
    ) -> None:
        check_activations("convolution", pre, post)
        tile = TILES[0] if tile is None else tuple(tile)
        if tile not in TILES:
            raise ValueError(f"the CPU convolution kernel tiles {TILES} (pixels, vectors), not {tile}")
        self.channels, self.in_channels = weight.shape[:2]
        self.kernel = tuple(weight.shape[2:])
        self.dtype = kernel_dtype(weight)
        self._weight, self._bias = pack_weight(weight, tile[1]), pack_bias(bias, self.channels)
        self._strides = (*strides, *dilations)
        self._epilogue = (ACTIVATION_CODES[pre], *pre_params, ACTIVATION_CODES[post], *post_params, *tile)
        self._module = module()

    def __call__(
        self,
        x: torch.Tensor,
        pads: Sequence[int],
        out_hw: Sequence[int],
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """post(pre(conv(x) + bias) + residual) for x [N, C, H, W] of the convolution's dtype (made channels_last
        unless its channels are contiguous), `pads` the leading (top, left) padding, `out_hw` the output's size (which
        fixes the trailing padding) and the residual [N, K, OH, OW] (of that dtype) or None; into `out` (contiguous
        channels) or a new channels_last tensor, which is returned."""
        x, z, out = convolution_operands(
            x, pads, out_hw, self.in_channels, self.channels, residual, out, dtype=self.dtype
        )
        sh, sw, dh, dw = self._strides
        self._module.conv(x, self._weight, self._bias, z, out, *self.kernel, sh, sw, *pads, dh, dw, *self._epilogue)
        return out


@functools.cache
def module():
    """The compiled extension (built on first use, then loaded from the cache)."""
    return load_vector("conv", SOURCE, "convolution")
