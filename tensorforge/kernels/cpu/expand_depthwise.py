"""An inverted-residual block on the CPU in C++ with AVX-512, float32 or bf16 (a CPU with AVX512-BF16: bf16
activations, E included, and 1×1 weights; float32 sums), channels_last: a 1×1 expansion, the depthwise convolution
that reads it, and (optionally) the 1×1 projection after that, in one pass:

    E = act_e(conv1×1(X, We) + be)                     (C → Ce channels, the block's widest tensor)
    D = act_d(depthwise(E, Wd) + bd)                   (any window, strides, padding, dilations)
    Y = post(pre(conv1×1(D, Wp) + bp) + Z)             (Ce → K; without a projection, Y = D)

E is never written to memory: a thread keeps the rows of E its depthwise rows read in a ring of (KH − 1)·dh + 1
rows (each computed once by the 1×1 kernel's tiles from a row of X, row ih in slot ih mod the ring's size), the
depthwise kernel's row code reads its taps through row pointers into that ring, and with a projection the depthwise
row goes to a per-thread buffer and the 1×1 tiles write the output row from it (as `depthwise_pointwise`). A thread
takes a run of output rows, so only the first row of its run computes rows of E that another thread computes too.
On maps of few rows, where that would be more than a quarter of E's work again, a call instead computes an image's
E into one buffer with the 1×1 kernel's parallel tiles, then its output rows from it (E stays in cache).

Why: in MobileNet-style networks the expanded tensors are the largest the network writes (112² × 64 floats,
3.2 MB, in MobileNetV3's second block); written by one kernel and read back by the next, at batch 1 they cost more
memory traffic than the blocks' arithmetic.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import torch

from ..activations import ACTIVATION_CODES
from . import depthwise as dw
from . import pointwise as pw
from .avx512 import (
    ABSENT,
    VECTOR_MATH,
    check_activations,
    kernel_dtype,
    load_vector,
    pack_bias,
    tile_dispatch,
    vector_problem,
)
from .avx512 import ACTIVATIONS as ACTIVATIONS  # the epilogues this kernel evaluates, for its tactic

# The 1×1 part's tiles (pixels, vectors of 16 output channels): the 1×1 kernel's that span a row of pixels; the
# depthwise part's is the depthwise kernel's widest that suits its window (`depthwise.ROW_TILE`, `WINDOW`).
TILES = pw.ROW_TILES

SOURCE = (
    VECTOR_MATH
    + "namespace dwk {\n"
    + dw.CORE
    + "}  // namespace dwk\nnamespace pwk {\n"
    + pw.CORE
    + "}  // namespace pwk\n"
    + r"""
namespace {

// The buffers below are left uninitialized (not zero-filled per call): every value read was written first, the
// lanes past the channels of a last, partial vector being neither read nor stored (masked).
// Elem: float, or uint16_t for bf16 activations (x, E, the row buffer, z and y) and 1×1 weights (in pairs); the
// depthwise weights, biases, sums and epilogues float32.
template <typename Elem>
struct Fused {
  dwk::Geometry g;      // the depthwise convolution over E (its rows read through row pointers); yW = Cp
  int64_t N;
  const Elem* x;        // the block's input
  int64_t xN, xH;       // its element strides by image and row (pixels xW apart: e.xs)
  pwk::ProblemOf<Elem> e;  // the expansion of one row of x: P = W, y a ring row (ys = Cp)
  const float* wd;
  const float* bd;
  int64_t act;
  __m512 p0, p1;
  bool project;
  pwk::ProblemOf<Elem> q;  // the projection of one depthwise row (x the row buffer), or unused
  Elem* y;              // the output (with a projection, q's) and its strides by image and row
  int64_t yN, yH, zN, zH;
};

template <int MR, int NV, typename Elem>
inline void pixels(const pwk::ProblemOf<Elem>& q) {
  const int64_t tiles = (q.P + MR - 1) / MR, vectors = q.Kp / 16;
  for (int64_t t = 0; t < tiles; ++t) {
    int64_t v = 0;
    for (; v + NV <= vectors; v += NV) pwk::tile<MR, NV>(q, t * MR, 16 * v);
    pwk::narrower<MR, NV - 1>(q, t * MR, 16 * v, vectors - v);
  }
}

// The depthwise row (n, oh) from the rows of E that `taps` point to, then its projection into the output row.
template <int KW, int S, int MR, int NV, typename Elem>
inline void depthwise_row(const Fused<Elem>& f, int64_t n, int64_t oh, const Elem* const* taps, Elem* buffer,
                          pwk::ProblemOf<Elem>& q, int64_t lo, int64_t hi) {
  Elem* out = f.project ? buffer : f.y + n * f.yN + oh * f.yH;
  const dwk::RowsBlockOf<Elem> k{{taps[0], f.wd, f.bd, out, oh * f.g.sh - f.g.ph, __mmask16(0xFFFF)}, taps, 0};
  dwk::row<dwk::row_tile<KW, S>(), KW, S>(k, f.g, 0, f.g.Cp / 16, lo, hi, f.act, f.p0, f.p1);
  if (f.project) {
    q.x = buffer;
    q.y = f.y + n * f.yN + oh * f.yH;
    q.z = f.q.z ? f.q.z + n * f.zN + oh * f.zH : nullptr;
    pixels<MR, NV>(q);
  }
}

// Each thread a run of output rows, the rows of E they read in a ring (see the module).
template <int KW, int S, int MR, int NV, typename Elem>
void ring(const Fused<Elem>& f, int64_t span, int64_t lo, int64_t hi) {
  const dwk::Geometry& g = f.g;
  const int64_t plane = g.W * g.Cp;
  at::parallel_for(0, f.N * g.OH, 1, [&](int64_t begin, int64_t end) {
    const std::unique_ptr<Elem[]> rows(new Elem[span * plane]), buffer(new Elem[f.project ? g.OW * g.Cp : 1]);
    std::vector<int64_t> held(span, -1);  // the row of E (image · H + row) in each slot
    std::vector<const Elem*> taps(g.KH, rows.get());
    pwk::ProblemOf<Elem> e = f.e, q = f.q;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / g.OH, oh = r % g.OH;
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
        if (ih < 0 || ih >= g.H) continue;
        const int64_t slot = ih % span;
        Elem* row = rows.get() + slot * plane;
        if (held[slot] != n * g.H + ih) {
          e.x = f.x + n * f.xN + ih * f.xH;
          e.y = row;
          pixels<MR, NV>(e);
          held[slot] = n * g.H + ih;
        }
        taps[kh] = row;
      }
      depthwise_row<KW, S, MR, NV>(f, n, oh, taps.data(), buffer.get(), q, lo, hi);
    }
  });
}

// An image at a time: all of its E (the 1×1 kernel's own parallel tiles, into one buffer), then its output rows in
// parallel. For maps of few rows, where a ring per thread would compute many rows of E twice.
template <int KW, int S, int MR, int NV, typename Elem>
void whole(const Fused<Elem>& f, int64_t lo, int64_t hi) {
  const dwk::Geometry& g = f.g;
  const int64_t plane = g.W * g.Cp;
  const std::unique_ptr<Elem[]> expanded(new Elem[g.H * plane]);
  for (int64_t n = 0; n < f.N; ++n) {
    pwk::ProblemOf<Elem> e = f.e;
    e.P = g.H * g.W;
    e.x = f.x + n * f.xN;
    e.y = expanded.get();
    pwk::run<MR, NV>(e);
    at::parallel_for(0, g.OH, 1, [&](int64_t begin, int64_t end) {
      const std::unique_ptr<Elem[]> buffer(new Elem[f.project ? g.OW * g.Cp : 1]);
      std::vector<const Elem*> taps(g.KH, expanded.get());
      pwk::ProblemOf<Elem> q = f.q;
      for (int64_t oh = begin; oh < end; ++oh) {
        for (int64_t kh = 0; kh < g.KH; ++kh) {
          const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
          if (ih >= 0 && ih < g.H) taps[kh] = expanded.get() + ih * plane;
        }
        depthwise_row<KW, S, MR, NV>(f, n, oh, taps.data(), buffer.get(), q, lo, hi);
      }
    });
  }
}

template <int KW, int S, int MR, int NV, typename Elem>
void run(const Fused<Elem>& f) {
  const dwk::Geometry& g = f.g;
  const int64_t span = (g.KH - 1) * g.dh + 1;
  const int64_t lo = std::min<int64_t>(g.OW, (g.pw + g.sw - 1) / g.sw);
  const int64_t reach = g.W - 1 + g.pw - (g.KW - 1) * g.dw;
  const int64_t hi = reach < 0 ? lo : std::max<int64_t>(lo, std::min<int64_t>(g.OW, reach / g.sw + 1));
  // Rings cost each thread (span − stride) rows of E computed twice: at most a quarter more of E's work, else an
  // image at a time (which needs an image's pixels evenly spaced, as a channels_last tensor's are).
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), f.N * g.OH);
  const bool rings = 4 * threads * std::max<int64_t>(0, span - g.sh) <= f.N * g.OH * g.sh;
  if (rings || f.xH != g.W * f.e.xs) ring<KW, S, MR, NV>(f, span, lo, hi);
  else whole<KW, S, MR, NV>(f, lo, hi);
}

template <int MR, int NV, typename Elem>
void dispatch(const Fused<Elem>& f) {
  switch (f.g.dw == 1 ? f.g.KW * 10 + f.g.sw : 0) {
    case 31: run<3, 1, MR, NV>(f); break;
    case 32: run<3, 2, MR, NV>(f); break;
    case 51: run<5, 1, MR, NV>(f); break;
    case 52: run<5, 2, MR, NV>(f); break;
    case 71: run<7, 1, MR, NV>(f); break;
    case 72: run<7, 2, MR, NV>(f); break;
    default: run<0, 1, MR, NV>(f);
  }
}

template <typename Elem>
pwk::ProblemOf<Elem> problem(int64_t P, int64_t C, torch::Tensor w, torch::Tensor b, int64_t act, double a0,
                             double a1, int64_t post, double b0, double b1) {
  return pwk::ProblemOf<Elem>{P, C, 0, b.size(0), nullptr, 0, reinterpret_cast<const Elem*>(w.data_ptr()),
                              b.data_ptr<float>(), nullptr, 0, nullptr, 0, act, post, _mm512_set1_ps(float(a0)),
                              _mm512_set1_ps(float(a1)), _mm512_set1_ps(float(b0)), _mm512_set1_ps(float(b1))};
}

template <typename Elem>
void launch(torch::Tensor x, torch::Tensor we, torch::Tensor be, int64_t Ce, torch::Tensor wd, torch::Tensor bd,
            torch::Tensor wp, torch::Tensor bp, torch::Tensor z, torch::Tensor y, int64_t KH, int64_t KW, int64_t sh,
            int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t expand_act, double e0, double e1,
            int64_t act, double p0, double p1, int64_t pre, double pre0, double pre1, int64_t post, double post0,
            double post1, int64_t rows, int64_t vectors) {
  const int64_t C = x.size(1), Cp = wd.size(1);
  TORCH_CHECK(we.numel() == weight_rows<Elem>(C) * be.size(0) && be.size(0) == Cp,
              "expand_depthwise: an expansion weight of ", we.numel(), " values for ", C, " channels into ", Ce);
  const auto data = [](const torch::Tensor& t) { return reinterpret_cast<Elem*>(t.data_ptr()); };
  Fused<Elem> f;
  f.g = dwk::Geometry{x.size(2), x.size(3), Ce, Cp, KH, KW, sh, sw, ph, pw, dh, dw, y.size(2), y.size(3),
                      0, 0, Cp, 0, 0, Cp};
  f.N = x.size(0);
  f.x = data(x);
  f.xN = x.stride(0);
  f.xH = x.stride(2);
  f.e = problem<Elem>(x.size(3), C, we, be, expand_act, e0, e1, 0, 0., 0.);
  f.e.K = Ce;
  f.e.xs = x.stride(3);
  f.e.ys = Cp;
  f.wd = wd.data_ptr<float>();
  f.bd = bd.data_ptr<float>();
  f.act = act;
  f.p0 = _mm512_set1_ps(float(p0));
  f.p1 = _mm512_set1_ps(float(p1));
  f.project = wp.numel() > 0;
  f.y = data(y);
  f.yN = y.stride(0);
  f.yH = y.stride(2);
  if (f.project) {
    TORCH_CHECK(wp.numel() == weight_rows<Elem>(Ce) * bp.size(0), "expand_depthwise: a projection weight of ",
                wp.numel(), " values for ", Ce, " channels");
    f.q = problem<Elem>(y.size(3), Ce, wp, bp, pre, pre0, pre1, post, post0, post1);
    f.q.K = y.size(1);
    f.q.xs = Cp;
    f.q.ys = y.stride(3);
    f.q.z = z.numel() ? data(z) : nullptr;
    f.q.zs = z.numel() ? z.stride(3) : 0;
    f.zN = z.numel() ? z.stride(0) : 0;
    f.zH = z.numel() ? z.stride(2) : 0;
  } else {
    f.g.yW = y.stride(3);
  }
  """
    + tile_dispatch(TILES, ("rows", "vectors"), "dispatch<{tile}>(f)", "expand_depthwise")
    + r"""
}

}  // namespace

// x [N, C, H, W], z and y channels_last (channels contiguous; z empty without a residual), all float32 or all bf16;
// we packed in blocks of `vectors` (`pointwise.pack_weight`, of x's type), be [Cep]; wd [KH·KW, Cep], bd [Cep]
// float32; wp packed likewise, bp [Kp], or both empty: no projection (y is the depthwise output, Ce channels).
void expand_depthwise(torch::Tensor x, torch::Tensor we, torch::Tensor be, int64_t Ce, torch::Tensor wd,
                      torch::Tensor bd, torch::Tensor wp, torch::Tensor bp, torch::Tensor z, torch::Tensor y,
                      int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                      int64_t expand_act, double e0, double e1, int64_t act, double p0, double p1, int64_t pre,
                      double pre0, double pre1, int64_t post, double post0, double post1, int64_t rows,
                      int64_t vectors) {
  TORCH_CHECK(x.stride(1) == 1 && y.stride(1) == 1 && (!z.numel() || z.stride(1) == 1),
              "expand_depthwise: channels must be contiguous (channels_last)");
  by_type("expand_depthwise", x, {we, wp, y, z}, [&](auto e) {
    launch<decltype(e)>(x, we, be, Ce, wd, bd, wp, bp, z, y, KH, KW, sh, sw, ph, pw, dh, dw, expand_act, e0, e1, act,
                        p0, p1, pre, pre0, pre1, post, post0, post1, rows, vectors);
  });
}
"""
)


def problem() -> str | None:
    """Why the kernel cannot run on this CPU, or None."""
    return vector_problem("1×1 + depthwise convolution")


_L2_SIZE = Path("/sys/devices/system/cpu/cpu0/cache/index2/size")


@functools.cache
def l2_bytes() -> int:
    """A core's level-2 cache in bytes, as Linux lists it (1 MiB where it does not)."""
    try:
        text = _L2_SIZE.read_text().strip().upper()
        return int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text)
    except (OSError, ValueError):
        return 1 << 20


class ExpandDepthwise:
    """An inverted-residual block ready to run: the expansion's, the depthwise convolution's and (optionally) the
    projection's weights and biases packed, the depthwise strides and dilations, the activations (by name,
    `ACTIVATIONS`, with their parameters as `kernels.activations.activation_args` gives them) and tile checked, once;
    calls give the input, the depthwise padding and the residual. A bf16 expansion weight makes a bf16 block (bf16
    input, expanded tensor, residual and output, the projection's weight bf16 too; the depthwise weight, sums and
    epilogues float32)."""

    __slots__ = (
        "_dw", "_epilogue", "_expand", "_module", "_project", "_strides", "channels", "dtype", "in_channels", "kernel",
    )  # fmt: skip

    def __init__(
        self,
        expand_weight: torch.Tensor,
        expand_bias: torch.Tensor | None,
        expand_act: str,
        expand_params: tuple[float, float],
        dw_weight: torch.Tensor,
        dw_bias: torch.Tensor | None,
        strides: Sequence[int],
        dilations: Sequence[int],
        act: str,
        act_params: tuple[float, float],
        pw_weight: torch.Tensor | None = None,
        pw_bias: torch.Tensor | None = None,
        pre: str = "",
        pre_params: tuple[float, float] = (0.0, 0.0),
        post: str = "",
        post_params: tuple[float, float] = (0.0, 0.0),
        tile: tuple[int, int] | None = None,
    ) -> None:
        check_activations("1×1 + depthwise", expand_act, act, pre, post)
        tile = TILES[0] if tile is None else tuple(tile)
        if tile not in TILES:
            raise ValueError(f"the CPU 1×1 + depthwise kernel tiles {TILES} (pixels, vectors), not {tile}")
        expanded = expand_weight.shape[0]
        if dw_weight.shape[0] != expanded or tuple(expand_weight.shape[2:]) != (1, 1):
            raise ValueError(f"the depthwise weight {list(dw_weight.shape)} does not read the expansion's "
                             f"{expanded} channels")  # fmt: skip
        if pw_weight is not None and (pw_weight.shape[1] != expanded or tuple(pw_weight.shape[2:]) != (1, 1)):
            raise ValueError(f"the projection weight {list(pw_weight.shape)} does not read the depthwise "
                             f"convolution's {expanded} channels")  # fmt: skip
        self.in_channels = expand_weight.shape[1]
        self.channels = expanded if pw_weight is None else pw_weight.shape[0]
        self.kernel = tuple(dw_weight.shape[2:])
        self.dtype = kernel_dtype(expand_weight)
        if pw_weight is not None and kernel_dtype(pw_weight) != self.dtype:
            raise ValueError(f"the projection weight is {pw_weight.dtype}, the expansion's {expand_weight.dtype}")
        self._expand = (pw.pack_weight(expand_weight, tile[1]), pack_bias(expand_bias, expanded), expanded)
        self._dw = (dw.pack_weight(dw_weight), pack_bias(dw_bias, expanded))
        self._project = (
            (ABSENT, ABSENT) if pw_weight is None
            else (pw.pack_weight(pw_weight, tile[1]), pack_bias(pw_bias, self.channels))
        )  # fmt: skip
        self._strides = (*strides, *dilations)
        self._epilogue = (
            ACTIVATION_CODES[expand_act], *expand_params, ACTIVATION_CODES[act], *act_params, ACTIVATION_CODES[pre],
            *pre_params, ACTIVATION_CODES[post], *post_params, *tile,
        )  # fmt: skip
        self._module = module()

    def __call__(
        self,
        x: torch.Tensor,
        pads: Sequence[int],
        out_hw: Sequence[int],
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The block's output for x [N, C, H, W] in the block's dtype, `pads` the depthwise convolution's leading
        (top, left) padding, `out_hw` its output size, and the residual [N, K, OH, OW] of that dtype or None (with a
        projection only; x and the residual made channels_last unless their channels are contiguous, as in a channel
        slice of a channels_last tensor); a new channels_last tensor."""
        x = dw.windowed_input(x, pads, out_hw, self.dtype)
        if x.shape[1] != self.in_channels:
            raise ValueError(f"x has {x.shape[1]} channels; this 1×1 convolution takes {self.in_channels}")
        if residual is not None and not self._project[0].numel():
            raise ValueError("a residual needs the projection")
        shape = (x.shape[0], self.channels, *out_hw)
        z = dw.residual_operand(residual, shape, self.dtype)
        out = torch.empty(shape, dtype=self.dtype, memory_format=torch.channels_last)
        sh, sw, dh, dwl = self._strides
        self._module.expand_depthwise(
            x, *self._expand, *self._dw, *self._project, z, out, *self.kernel, sh, sw, *pads, dh, dwl, *self._epilogue
        )
        return out


@functools.cache
def module():
    """The compiled extension (built on first use, then loaded from the cache)."""
    return load_vector("expand_depthwise", SOURCE, "1×1 + depthwise convolution")
