"""Depthwise convolution (one filter a channel) on the CPU in C++ with AVX-512, float32, channels_last, with the
FusedConv epilogue (bias, activation) inside:

    y[n, oh, ow, c] = act(b[c] + Σ_kh,kw w[kh, kw, c] · x[n, oh·s_h − p_h + kh·d_h, ow·s_w − p_w + kw·d_w, c])

A vector is 16 channels of one pixel. A thread takes output rows (or, on maps of few rows, a span of channel
blocks of a row); along a row, tiles of `tile` output pixels sweep the row's channel blocks, blocks innermost, so
that a pixel's channels are read in memory order. For filters 3, 5 or 7 wide at stride 1 or 2 a tile loads the
(tile−1)·stride + KW input pixels of a row of taps into registers once and multiplies them by each tap's weight
vector; other filters load each tap's pixels. Tiles at the borders take the same path with masked loads that read
zeros for the padding and touch no memory. The weights are packed once as [KH·KW, C rounded up to 16] so that a
tap's 16 weights are one load; a last partial block of channels is masked.

Why our own: through torch a oneDNN depthwise call costs 25-45 µs before it computes (docs/design.md, "The CPU
at batch 1"), more than the whole layer on the deep, small maps of MobileNet and EfficientNet.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

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
    register_tiles,
    rounded,
    tile_dispatch,
    vector_problem,
)
from .avx512 import ACTIVATIONS as ACTIVATIONS  # the epilogues this kernel evaluates, for its tactic

# output pixels a tile (accumulator vectors), for AVX-512's 32 registers and for AVX2's 16; the C++ instantiates this
# CPU's, and the fused kernels that include this one take the widest, ROW_TILE, unless its input window along W,
# (ROW_TILE − 1)·stride + KW vectors, passes WINDOW: then the narrowest (`row_tile` in the C++). On AVX2 (two
# registers a vector) a 5-wide window at stride 2 ran 1.04-1.3× faster in tiles of 2 than of 4 (its window of 11
# spills), 3- to 7-wide ones at stride 1 and 3-wide at stride 2 as fast or faster in 4.
TILES = register_tiles((4, 8), (2, 4))
ROW_TILE = max(TILES)
(WINDOW,) = register_tiles((64,), (10,))

# The kernel's C++ but its entry point (the module puts it in an unnamed namespace; the fused depthwise + 1×1
# kernel, `kernels.cpu.depthwise_pointwise`, in a named one).
CORE = (
    f"constexpr int ROW_TILE = {ROW_TILE}, NARROW_TILE = {min(TILES)}, WINDOW = {WINDOW};\n"
    + r"""
// The fused kernels' tile for a KW-wide window at stride S (the module's TILES comment says why).
template <int KW, int S>
constexpr int row_tile() {
  return (ROW_TILE - 1) * S + KW <= WINDOW ? ROW_TILE : NARROW_TILE;
}
"""
    + r"""

struct Geometry {
  int64_t H, W, C, Cp, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW;
  int64_t xN, xH, xW, yN, yH, yW;  // element strides of x and y (channels are contiguous)
};

// Elem: float, or uint16_t for bf16 activations (weights, bias, sums and epilogue in float32 either way).
template <typename Elem>
struct BlockOf {  // one output row of one block of channels
  const Elem* x;   // the block's first channel in image n
  const float* w;
  const float* b;
  Elem* y;         // the block's first channel in output row oh of image n
  int64_t ih0;     // the input row of tap kh = 0
  __mmask16 mask;  // the block's channels (all 16 but in a last, partial block)
};
using Block = BlockOf<float>;

// A Block whose taps read their input rows through pointers (the expansion kernel's ring of rows) rather than from
// x. A type of its own, not a field tested in the tap loop: that test cost the standalone kernel about 3%.
template <typename Elem>
struct RowsBlockOf : BlockOf<Elem> {
  const Elem* const* rows;  // each tap row's input row (its first pixel's channel 0)
  int64_t c0;               // the block's first channel
};

// The input row of tap row kh (input row ih), at the block's first channel.
template <typename Elem>
inline const Elem* input_row(const BlockOf<Elem>& k, const Geometry& g, int64_t, int64_t ih) {
  return k.x + ih * g.xH;
}
template <typename Elem>
inline const Elem* input_row(const RowsBlockOf<Elem>& k, const Geometry&, int64_t kh, int64_t) {
  return k.rows[kh] + k.c0;
}

// `k` for the channels from c0 (mask m).
template <typename Elem>
inline BlockOf<Elem> shifted(const BlockOf<Elem>& k, int64_t c0, __mmask16 m) {
  return BlockOf<Elem>{k.x + c0, k.w + c0, k.b + c0, k.y + c0, k.ih0, m};
}
template <typename Elem>
inline RowsBlockOf<Elem> shifted(const RowsBlockOf<Elem>& k, int64_t c0, __mmask16 m) {
  return RowsBlockOf<Elem>{shifted(static_cast<const BlockOf<Elem>&>(k), c0, m), k.rows, c0};
}

inline __m512 load(const float* p, __mmask16 m, bool full) {
  return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
inline __m512 load(const uint16_t* p, __mmask16 m, bool full) { return load16(full ? __mmask16(0xFFFF) : m, p); }

// Every accumulator of a tile starts at the block's bias.
template <int T, bool FULL, typename B>
inline void start(__m512* acc, const B& k) {
  const __m512 bias = load(k.b, k.mask, FULL);
  #pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t] = bias;
}

template <int T, typename Elem>
inline void store(__m512* acc, Elem* out, int64_t step, int count, __mmask16 m, bool full) {
  #pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    if (t >= count) break;
    if constexpr (sizeof(Elem) == 4) {
      if (full) _mm512_storeu_ps(out + t * step, acc[t]);
      else _mm512_mask_storeu_ps(out + t * step, m, acc[t]);
    } else {
      store16(out + t * step, full ? __mmask16(0xFFFF) : m, acc[t]);
    }
  }
}

// Output pixels ow0 .. ow0+count-1 (count <= T) of a block for a KW-wide, stride-S, undilated filter along W: a row
// of taps reads (T-1)·S + KW input pixels once into registers and makes T·KW multiply-adds of them. BORDER: some of
// those pixels are outside the input (their masked loads read zeros and touch no memory); otherwise count == T.
// FULL: all 16 channels (the loads need no mask).
template <int T, int KW, int S, bool FULL, bool BORDER, typename B>
inline void window_tile(const B& k, const Geometry& g, int64_t ow0, int count, int64_t act, __m512 p0,
                        __m512 p1) {
  constexpr int L = (T - 1) * S + KW;
  const int64_t KH = g.KH, Cp = g.Cp, xW = g.xW, H = g.H, W = g.W, dh = g.dh, col0 = ow0 * S - g.pw;
  __m512 acc[T];
  start<T, FULL>(acc, k);
  for (int64_t kh = 0; kh < KH; ++kh) {
    const int64_t ih = k.ih0 + kh * dh;
    if (ih < 0 || ih >= H) continue;
    const auto* row = input_row(k, g, kh, ih) + col0 * xW;
    const float* taps = k.w + kh * KW * Cp;
    __m512 in[L];
    #pragma GCC unroll 32
    for (int i = 0; i < L; ++i) {
      if (BORDER) {
        const bool inside = col0 + i >= 0 && col0 + i < W;
        in[i] = load16(inside ? k.mask : __mmask16(0), row + i * xW);
      } else {
        in[i] = load(row + i * xW, k.mask, FULL);
      }
    }
    #pragma GCC unroll 8
    for (int kw = 0; kw < KW; ++kw) {
      const __m512 wv = _mm512_loadu_ps(taps + kw * Cp);
      #pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[t] = _mm512_fmadd_ps(in[t * S + kw], wv, acc[t]);
    }
  }
  activate_tile<T>(acc, count, act, p0, p1);
  store<T>(acc, k.y + ow0 * g.yW, g.yW, count, k.mask, FULL);
}

// The same for any filter, stride and dilation along W: each tap's T input pixels are loaded for it; BORDER checks
// each against the input's width.
template <int T, bool FULL, bool BORDER, typename B>
inline void any_tile(const B& k, const Geometry& g, int64_t ow0, int count, int64_t act, __m512 p0,
                     __m512 p1) {
  const int64_t KH = g.KH, KW = g.KW, Cp = g.Cp, xW = g.xW, sw = g.sw, step = g.sw * g.xW;
  const int64_t H = g.H, W = g.W, dh = g.dh, dw = g.dw, col0 = ow0 * g.sw - g.pw;
  __m512 acc[T];
  start<T, FULL>(acc, k);
  for (int64_t kh = 0; kh < KH; ++kh) {
    const int64_t ih = k.ih0 + kh * dh;
    if (ih < 0 || ih >= H) continue;
    const auto* row = input_row(k, g, kh, ih) + col0 * xW;
    const float* taps = k.w + kh * KW * Cp;
    for (int64_t kw = 0; kw < KW; ++kw) {
      const __m512 wv = _mm512_loadu_ps(taps + kw * Cp);
      const auto* in = row + kw * dw * xW;
      #pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        if (BORDER) {
          const int64_t iw = col0 + kw * dw + t * sw;
          const bool inside = t < count && iw >= 0 && iw < W;
          acc[t] = _mm512_fmadd_ps(load16(inside ? k.mask : __mmask16(0), in + t * step), wv, acc[t]);
        } else {
          acc[t] = _mm512_fmadd_ps(load(in + t * step, k.mask, FULL), wv, acc[t]);
        }
      }
    }
  }
  activate_tile<T>(acc, count, act, p0, p1);
  store<T>(acc, k.y + ow0 * g.yW, g.yW, count, k.mask, FULL);
}

template <int T, int KW, int S, bool FULL, bool BORDER, typename B>
inline void tile(const B& k, const Geometry& g, int64_t ow0, int count, int64_t act, __m512 p0, __m512 p1) {
  if (KW) window_tile<T, KW, S, FULL, BORDER>(k, g, ow0, count, act, p0, p1);
  else any_tile<T, FULL, BORDER>(k, g, ow0, count, act, p0, p1);
}

// Output pixels ow .. ow+count-1 of blocks [first, last) of a row: the blocks innermost, so that consecutive tiles
// read consecutive cache lines of each input pixel (channels_last keeps a pixel's channels together).
template <int T, int KW, int S, bool BORDER, typename B>
inline void tiles(const B& k, const Geometry& g, int64_t first, int64_t last, int64_t ow, int count,
                  int64_t act, __m512 p0, __m512 p1) {
  const int64_t full = std::min(last, g.C / 16);  // blocks of 16 channels; a last partial one is masked
  for (int64_t block = first; block < last; ++block) {
    const int64_t c0 = block * 16;
    const B kb = shifted(k, c0, block < full ? __mmask16(0xFFFF) : __mmask16((1u << (g.C - c0)) - 1));
    if (block < full) tile<T, KW, S, true, BORDER>(kb, g, ow, count, act, p0, p1);
    else tile<T, KW, S, false, BORDER>(kb, g, ow, count, act, p0, p1);
  }
}

// One output row of blocks [first, last): tiles of T pixels, those whose taps may leave the input, [0, lo) and
// [hi, OW), on the checked path.
template <int T, int KW, int S, typename B>
inline void row(const B& k, const Geometry& g, int64_t first, int64_t last, int64_t lo, int64_t hi, int64_t act,
                __m512 p0, __m512 p1) {
  int64_t ow = 0;
  for (int count; ow < lo; ow += count) {
    count = int(std::min<int64_t>(T, lo - ow));
    tiles<T, KW, S, true>(k, g, first, last, ow, count, act, p0, p1);
  }
  for (; ow + T <= hi; ow += T) tiles<T, KW, S, false>(k, g, first, last, ow, T, act, p0, p1);
  for (int count; ow < g.OW; ow += count) {
    count = int(std::min<int64_t>(T, g.OW - ow));
    tiles<T, KW, S, true>(k, g, first, last, ow, count, act, p0, p1);
  }
}

template <int T, int KW, int S, typename Elem>
void run(const Elem* x, const float* w, const float* b, Elem* y, const Geometry& g, int64_t N, int64_t act,
         float p0f, float p1f) {
  const __m512 p0 = _mm512_set1_ps(p0f), p1 = _mm512_set1_ps(p1f);
  const int64_t blocks = g.Cp / 16, rows = N * g.OH;
  // output columns whose taps along W are all inside the input: [lo, hi)
  const int64_t lo = std::min<int64_t>(g.OW, (g.pw + g.sw - 1) / g.sw);
  const int64_t reach = g.W - 1 + g.pw - (g.KW - 1) * g.dw;
  const int64_t hi = reach < 0 ? lo : std::max<int64_t>(lo, std::min<int64_t>(g.OW, reach / g.sw + 1));
  // An item is an output row of `span` blocks: whole rows, unless there are too few rows to give every thread
  // four items. A chunk of items is at least 64k multiply-adds.
  const int64_t parts = std::min(blocks, (4 * at::get_num_threads() + rows - 1) / rows);
  const int64_t span = (blocks + parts - 1) / parts, per_row = (blocks + span - 1) / span;
  const int64_t grain = std::max<int64_t>(1, 65536 / (span * g.OW * g.KH * g.KW * 16));
  at::parallel_for(0, rows * per_row, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / per_row, n = r / g.OH, oh = r % g.OH, first = (item % per_row) * span;
      const BlockOf<Elem> k{x + n * g.xN, w, b, y + n * g.yN + oh * g.yH, oh * g.sh - g.ph, __mmask16(0xFFFF)};
      row<T, KW, S>(k, g, first, std::min(blocks, first + span), lo, hi, act, p0, p1);
    }
  });
}

// The filter widths and strides along W with a register-window kernel; the others take the generic one (KW = 0).
template <int T, typename Elem>
void dispatch(const Elem* x, const float* w, const float* b, Elem* y, const Geometry& g, int64_t N, int64_t act,
              float p0, float p1) {
  switch (g.dw == 1 ? g.KW * 10 + g.sw : 0) {
    case 31: run<T, 3, 1>(x, w, b, y, g, N, act, p0, p1); break;
    case 32: run<T, 3, 2>(x, w, b, y, g, N, act, p0, p1); break;
    case 51: run<T, 5, 1>(x, w, b, y, g, N, act, p0, p1); break;
    case 52: run<T, 5, 2>(x, w, b, y, g, N, act, p0, p1); break;
    case 71: run<T, 7, 1>(x, w, b, y, g, N, act, p0, p1); break;
    case 72: run<T, 7, 2>(x, w, b, y, g, N, act, p0, p1); break;
    default: run<T, 0, 1>(x, w, b, y, g, N, act, p0, p1);
  }
}

"""
)

SOURCE = module_source(
    CORE,
    r"""

namespace {

template <typename Elem>
void launch(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor y, const Geometry& g, int64_t act,
            double p0, double p1, int64_t tile) {
  const auto* xp = reinterpret_cast<const Elem*>(x.data_ptr());
  auto* yp = reinterpret_cast<Elem*>(y.data_ptr());
  const float* wp = w.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  """
    + tile_dispatch(
        [(t,) for t in TILES], ("tile",), "dispatch<{tile}>(xp, wp, bp, yp, g, x.size(0), act, p0, p1)", "depthwise"
    )
    + r"""
}

}  // namespace

// x [N, C, H, W] and y [N, C, OH, OW] channels_last (any pixel strides, channels contiguous), both float32 or both
// bf16; w [KH·KW, Cp] and b [Cp] float32, Cp = C rounded up to 16. Writes y.
void depthwise(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor y, int64_t KH, int64_t KW,
               int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t act, double p0,
               double p1, int64_t tile) {
  TORCH_CHECK(x.stride(1) == 1 && y.stride(1) == 1, "depthwise: channels must be contiguous (channels_last)");
  const Geometry g{x.size(2), x.size(3), x.size(1), w.size(1), KH, KW, sh, sw, ph, pw, dh, dw, y.size(2),
                   y.size(3), x.stride(0), x.stride(2), x.stride(3), y.stride(0), y.stride(2), y.stride(3)};
  by_type("depthwise", x, {y}, [&](auto e) { launch<decltype(e)>(x, w, b, y, g, act, p0, p1, tile); });
}
""",
)


def problem() -> str | None:
    """Why the kernel cannot run on this CPU, or None."""
    return vector_problem("depthwise")


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """A depthwise weight [C, 1, KH, KW] as [KH·KW, C rounded up to 16] float32 (zeros past C)."""
    c, _, kh, kw = w.shape
    packed = torch.zeros(kh * kw, rounded(c), dtype=torch.float32)
    packed[:, :c] = w.detach().float().reshape(c, kh * kw).t()
    return packed


def windowed_input(
    x: torch.Tensor, pads: Sequence[int], out_hw: Sequence[int], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The input of a kernel with a depthwise window, checked (4-D `dtype`; `pads` (top, left) and `out_hw` two values
    each) and made channels_last unless its channels are contiguous (as in a channel slice of a channels_last
    tensor)."""
    if x.dtype != dtype or x.dim() != 4:
        raise ValueError(f"x must be a 4-D {DTYPE_NAMES[dtype]} tensor, not {x.dtype} {tuple(x.shape)}")
    if len(pads) != 2 or len(out_hw) != 2:
        raise ValueError(f"pads (top, left) and out_hw (height, width) take two values each, not {pads}, {out_hw}")
    return x if x.stride(1) == 1 else x.contiguous(memory_format=torch.channels_last)


def residual_operand(
    residual: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A block kernel's residual checked (`dtype`, the output's `shape`) and made channels_last unless its channels
    are contiguous; `ABSENT` for none."""
    if residual is None:
        return ABSENT
    if residual.dtype != dtype or tuple(residual.shape) != shape:
        raise ValueError(f"residual must be a {DTYPE_NAMES[dtype]} tensor of shape {shape}, not {residual.dtype} "
                         f"{tuple(residual.shape)}")  # fmt: skip
    return residual if residual.stride(1) == 1 else residual.contiguous(memory_format=torch.channels_last)


def output_operand(
    out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A block kernel's output buffer: `out` checked (`dtype`, `shape`, channels contiguous: a channel slice of a
    channels_last tensor will do), or a new channels_last tensor."""
    if out is None:
        return torch.empty(shape, dtype=dtype, memory_format=torch.channels_last)
    if out.dtype != dtype or tuple(out.shape) != shape or out.stride(1) != 1:
        raise ValueError(f"out must be a {DTYPE_NAMES[dtype]} tensor of shape {shape} with contiguous channels, not "
                         f"{out.dtype} {tuple(out.shape)} with strides {out.stride()}")  # fmt: skip
    return out


def convolution_operands(
    x: torch.Tensor,
    pads: Sequence[int],
    out_hw: Sequence[int],
    in_channels: int,
    channels: int,
    residual: torch.Tensor | None,
    out: torch.Tensor | None,
    kernel: str = "convolution",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A windowed block kernel's input (`windowed_input`, checked against its `in_channels`), residual and output
    buffer ([N, `channels`, *out_hw]) as its C++ takes them, all of `dtype`."""
    x = windowed_input(x, pads, out_hw, dtype)
    if x.shape[1] != in_channels:
        raise ValueError(f"x has {x.shape[1]} channels; this {kernel} takes {in_channels}")
    shape = (x.shape[0], channels, *out_hw)
    return x, residual_operand(residual, shape, dtype), output_operand(out, shape, dtype)


class DepthwiseConv:
    """A depthwise convolution ready to run: its weight [C, 1, KH, KW] and bias packed, its strides, dilations,
    activation (by name, `ACTIVATIONS`, with its two parameters as `kernels.activations.activation_args` gives them)
    and tile checked, once; calls give the input and its padding. A bf16 weight makes a bf16 convolution (bf16
    input and output; the weight, sums and epilogue in float32), on a CPU with AVX512-BF16."""

    __slots__ = ("_bias", "_epilogue", "_module", "_strides", "_weight", "channels", "dtype", "kernel")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        strides: Sequence[int] = (1, 1),
        dilations: Sequence[int] = (1, 1),
        act: str = "",
        act_params: tuple[float, float] = (0.0, 0.0),
        tile: int | None = None,
    ) -> None:
        check_activations("depthwise", act)
        tile = TILES[-1] if tile is None else tile
        if tile not in TILES:
            raise ValueError(f"the CPU depthwise kernel tiles {TILES} pixels, not {tile}")
        self.channels, self.kernel = weight.shape[0], tuple(weight.shape[2:])
        self.dtype = kernel_dtype(weight)
        self._weight, self._bias = pack_weight(weight), pack_bias(bias, self.channels)
        self._strides = (*strides, *dilations)
        self._epilogue = (ACTIVATION_CODES[act], *act_params, tile)
        self._module = module()

    def __call__(
        self, x: torch.Tensor, pads: Sequence[int], out_hw: Sequence[int], out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """act(conv(x) + bias) for x [N, C, H, W] in the convolution's dtype (made channels_last unless its channels
        are contiguous, as in a channel slice of a channels_last tensor), `pads` the leading (top, left) padding and
        `out_hw` the output's size, which fixes the trailing padding; into `out` (contiguous channels) or a new
        channels_last tensor, which is returned."""
        x = windowed_input(x, pads, out_hw, self.dtype)
        if out is None:
            out = torch.empty((x.shape[0], self.channels, *out_hw), dtype=self.dtype, memory_format=torch.channels_last)
        elif out.dtype != self.dtype or out.dim() != 4 or out.stride(1) != 1:
            raise ValueError(f"out must be a 4-D {DTYPE_NAMES[self.dtype]} tensor with contiguous channels, not "
                             f"{out.dtype} {tuple(out.shape)} with strides {out.stride()}")  # fmt: skip
        sh, sw, dh, dw = self._strides
        self._module.depthwise(x, self._weight, self._bias, out, *self.kernel, sh, sw, *pads, dh, dw, *self._epilogue)
        return out


@functools.cache
def module():
    """The compiled extension (built on first use, then loaded from the cache)."""
    return load_vector("depthwise", SOURCE, "depthwise")
