"""What our AVX-512 CPU kernels share: the includes, a vector exponential and the fused activations
(`VECTOR_MATH`, C++ put before each kernel's source), and the check that the CPU has AVX-512.

Exponentials are a degree-7 polynomial scaled by 2^n (`vscalefps`), within 2 ulp of `expf`; Sigmoid and SiLU take
theirs on the range whose results are normal floats (`vexp_normal`: beyond it the functions are 0, 1 or x anyway),
where 2^n is one exponent field (on AVX2 four instructions a half against the saturating `vscalefps` form's eleven:
SiLU's cost in EfficientNet-B0's first fused block 0.34 → 0.24 ms). GELU (the
exact one, with erf) is `max(x, 0) − a·Φ(−a)`, a = |x|, the Gaussian tail as the GPU kernels evaluate it
(`kernels.activations.GELU_TAIL`: one reciprocal, one exponential, a degree-9 polynomial, no branch; for bf16 outputs
lower degrees, `GELU_TAIL_16` and `EXP2_16`). An
activation is a template on its `kernels.activations` code, applied to a tile of accumulators by one switch a tile.
`accumulate` is the 1×1 kernel's step over the input channels, which the direct convolution repeats for each tap;
`accumulate_pairs` the same in bf16 (`vdpbf16ps`, two channels a step, over `weight_rows` rows), `load16` /
`store16` move 16 float32 or bf16 values as float32 vectors, and `by_type` calls a kernel's float32 or bf16 form by
its operands' type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch

from ..activations import EXP2_16, GELU_SQUARE, GELU_T, GELU_TAIL, GELU_TAIL_16
from .avx2 import AVX2_FORMS
from .extension import host_flags, load

# The activations the kernels evaluate (by `kernels.activations` code): the rest decline.
ACTIVATIONS = ("", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "SiLU", "Gelu")
LANES = 16  # float32 lanes of an AVX-512 vector
ABSENT = torch.empty(0)  # an operand a call leaves out (the C++ reads an empty tensor as none); never written
T = TypeVar("T")
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bf16"}  # the activation types of our CPU kernels, by name

_VECTOR_MATH = (
    r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
// The vector helpers are inlined whatever the compiler's size limits say: a call that is not passes its vectors
// through memory (AVX2's two-halves vector is a struct), which ran the AVX2 1×1 kernel with SiLU at 2.8× its time.
#define TF_INLINE [[gnu::always_inline]] inline
"""
    + AVX2_FORMS
    + r"""

namespace {

// The lanes of a vector of 16 that hold `count` values (all of them from 16 on): a last partial vector's mask.
TF_INLINE __mmask16 mask_of(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
}

// e^x as p · 2^n for x clamped to [lo, hi]: n = round(x·log2 e), r = x − n·ln 2 (in two parts), p = e^r by its
// Taylor polynomial of degree 7 (|r| ≤ ln2/2: error 4e-9).
TF_INLINE __m512 exp_parts(__m512 x, float lo, float hi, __m512& n) {
  x = _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), x));
  n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
}

// e^x over [-104, 89], into the denormals (a softmax's masked scores reach 0); vscalefps multiplies by 2^n,
// saturating to inf and 0.
TF_INLINE __m512 vexp(__m512 x) {
  __m512 n;
  const __m512 p = exp_parts(x, -104.f, 89.f, n);
  return _mm512_scalef_ps(p, n);
}

// p · 2^n for integral n in [-126, 127]: vscalefps on AVX-512; on AVX2 one exponent field and a multiply (its
// vscalefps form handles saturation in two steps, about 11 instructions a half against 4).
TF_INLINE __m512 vscale_normal(__m512 p, __m512 n) {
#ifdef __AVX512F__
  return _mm512_scalef_ps(p, n);
#else
  return tf_avx2::scale_normal(p, n);
#endif
}

// e^x for x clamped to [-87.33, 88.37], where 2^n is a normal power of two: for the logistic functions, whose
// results past that range are 0, 1 or x whatever the exponential's.
TF_INLINE __m512 vexp_normal(__m512 x) {
  __m512 n;
  const __m512 p = exp_parts(x, -87.33f, 88.37f, n);
  return vscale_normal(p, n);
}

// 2^f for f in [−1/2, 1/2]: e^(f·ln 2) by its Taylor polynomial of degree 7 in f (error 5e-9).
TF_INLINE __m512 exp2_fraction(__m512 f) {
  __m512 p = _mm512_set1_ps(1.5252733804059841e-05f);  // ln2^7 / 7!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381609e-04f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-01f));
  return _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
}

// 2^x = 2^n · 2^f (n = round(x), f = x − n) for x ≥ −126 (x below is taken as −126), so that 2^n is a normal power
// of two: one exponent field on AVX2 (`vscale_normal`), where vscalefps's saturating form takes about 11
// instructions a half. For GELU's tail, whose 2^x below 2^−126 only ever subtracts less than 1e-36 from its result.
TF_INLINE __m512 vexp2_normal(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-126.f), x);  // NaN stays NaN (max returns its second operand)
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return vscale_normal(exp2_fraction(_mm512_sub_ps(x, n)), n);
}

// 2^x to 16-bit precision (`kernels.activations.EXP2_16`: relative error 2.6e-6): a lower degree, and vscalefps
// saturating to inf and 0.
TF_INLINE __m512 vexp2_16(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(EXP2_16[EXP2_DEGREE_16]);
  #pragma GCC unroll 8
  for (int k = EXP2_DEGREE_16 - 1; k >= 0; --k) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_16[k]));
  return _mm512_scalef_ps(p, n);
}

// `kernels.activations` codes. max/min return their second operand when either is NaN: v is put second so that
// a NaN passes through, as in the reference. NARROW: the values are stored in 16 bits (bf16), and GELU is computed
// to that precision (`GELU_TAIL_16`, `EXP2_16`, the reciprocal without its Newton step: within 1e-4, relative).
template <int CODE, bool NARROW = false>
TF_INLINE __m512 activate(__m512 v, __m512 p0, __m512 p1) {
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f);
  switch (CODE) {
    case 1: return _mm512_max_ps(zero, v);                                              // Relu
    case 2: return _mm512_min_ps(p1, _mm512_max_ps(p0, v));                            // Clip
    case 3: return _mm512_mask_mul_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), v, p0);  // LeakyRelu
    case 4: return _mm512_div_ps(one, _mm512_add_ps(one, vexp_normal(_mm512_sub_ps(zero, v))));  // Sigmoid
    case 5: return _mm512_min_ps(one, _mm512_max_ps(zero, _mm512_fmadd_ps(v, p0, p1)));    // HardSigmoid
    case 6: {                                                                            // HardSwish
      const __m512 r = _mm512_fmadd_ps(v, _mm512_set1_ps(1.f / 6.f), _mm512_set1_ps(0.5f));
      return _mm512_mul_ps(v, _mm512_min_ps(one, _mm512_max_ps(zero, r)));
    }
    case 7: return _mm512_div_ps(v, _mm512_add_ps(one, vexp_normal(_mm512_sub_ps(zero, v))));   // SiLU
    case 8: {                                                                            // Gelu
      const __m512 a = _mm512_min_ps(_mm512_set1_ps(20.f), _mm512_abs_ps(v));  // NaN stays NaN
      const __m512 d = _mm512_fmadd_ps(a, _mm512_set1_ps(GELU_T), one);
      __m512 t = _mm512_rcp14_ps(d);  // 1/d within 2^-14, one Newton step: within 2^-28 (a division is 4× slower)
      __m512 p;
      if constexpr (NARROW) {
        p = _mm512_set1_ps(GELU_TAIL_16[GELU_DEGREE_16]);
        #pragma GCC unroll 16
        for (int k = GELU_DEGREE_16 - 1; k >= 0; --k) p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(GELU_TAIL_16[k]));
      } else {
        t = _mm512_mul_ps(t, _mm512_fnmadd_ps(d, t, _mm512_set1_ps(2.f)));
        p = _mm512_set1_ps(GELU_TAIL[GELU_DEGREE]);
        #pragma GCC unroll 16
        for (int k = GELU_DEGREE - 1; k >= 0; --k) p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(GELU_TAIL[k]));
      }
      const __m512 power = _mm512_fnmadd_ps(_mm512_mul_ps(a, a), _mm512_set1_ps(GELU_SQUARE), p);
      const __m512 tail = NARROW ? vexp2_16(power) : vexp2_normal(power);
      return _mm512_fnmadd_ps(a, _mm512_mul_ps(t, tail), _mm512_max_ps(zero, v));
    }
    default: return v;
  }
}

template <int T, int CODE, bool NARROW>
TF_INLINE void activate_tile(__m512* acc, int count, __m512 p0, __m512 p1) {
  #pragma GCC unroll 32
  for (int t = 0; t < T; ++t)
    if (t < count) acc[t] = activate<CODE, NARROW>(acc[t], p0, p1);
}

template <int T, bool NARROW = false>
TF_INLINE void activate_tile(__m512* acc, int count, int64_t code, __m512 p0, __m512 p1) {
  switch (code) {  // once a tile, outside the unrolled loops
    case 1: activate_tile<T, 1, NARROW>(acc, count, p0, p1); break;
    case 2: activate_tile<T, 2, NARROW>(acc, count, p0, p1); break;
    case 3: activate_tile<T, 3, NARROW>(acc, count, p0, p1); break;
    case 4: activate_tile<T, 4, NARROW>(acc, count, p0, p1); break;
    case 5: activate_tile<T, 5, NARROW>(acc, count, p0, p1); break;
    case 6: activate_tile<T, 6, NARROW>(acc, count, p0, p1); break;
    case 7: activate_tile<T, 7, NARROW>(acc, count, p0, p1); break;
    case 8: activate_tile<T, 8, NARROW>(acc, count, p0, p1); break;
    default: break;
  }
}

// The 1×1 kernel's step over C input channels: acc[r·NV + v] += a[r][c] · w[c·16·NV + 16·v] for the tile's MR
// pixels' inputs a[r] and a [C, 16·NV] block of weights (the 1×1 and direct convolution kernels).
template <int MR, int NV>
TF_INLINE void accumulate(__m512* acc, const float* const* a, const float* w, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    __m512 wv[NV];
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_ps(w + c * 16 * NV + 16 * v);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = _mm512_set1_ps(a[r][c]);
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r * NV + v] = _mm512_fmadd_ps(xv, wv[v], acc[r * NV + v]);
    }
  }
}

// `f(Elem{})` for the element type of the kernel's operands: float for float32, uint16_t for bf16 (the module
// compiled with AVX512-BF16), checked: x's type, every other non-empty operand's the same. `kernel` names the caller
// in the errors.
template <typename F>
void by_type(const char* kernel, const torch::Tensor& x, std::initializer_list<torch::Tensor> others, F&& f) {
  const auto type = x.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kBFloat16, kernel, ": float32 or bf16 operands, not ", type);
  for (const auto& t : others)
    TORCH_CHECK(!t.numel() || t.scalar_type() == type, kernel, ": operands all float32 or all bf16, not ", type,
                " and ", t.scalar_type());
  if (type == at::kFloat) return f(float{});
#ifdef __AVX512BF16__
  f(uint16_t{});
#else
  TORCH_CHECK(false, kernel, ": this CPU has no AVX512-BF16 (the module was compiled without it)");
#endif
}

// The rows of a 1×1 weight block for C input channels: C, or in bf16 C rounded up to even (rows in pairs).
template <typename T>
constexpr int64_t weight_rows(int64_t C) {
  return sizeof(T) == 2 ? C + C % 2 : C;
}

// 16 values (those of mask m) as float32, and back: bf16 is the upper half of a float32.
TF_INLINE __m512 load16(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
TF_INLINE void store16(float* p, __mmask16 m, __m512 v) { _mm512_mask_storeu_ps(p, m, v); }
TF_INLINE __m512 load16(__mmask16 m, const uint16_t* p) {
#ifdef __AVX512F__
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
#else
  return tf_avx2::load_bf16(m, p);
#endif
}
TF_INLINE void store16(uint16_t* p, __mmask16 m, __m512 v) {
#ifdef __AVX512BF16__
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));  // round to nearest even
#endif
}

// 16 float32 values quantized as QuantizedConv does (v · inverse rounded half to even, saturated) into int8.
TF_INLINE __m128i quantize16(__m512 v, __m512 inverse) {
  return _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v, inverse)));
}

// The 1×1 step in bf16: a pair of input channels a pixel (one 32-bit broadcast) times a block's pair of weight
// rows, interleaved ([C/2, 16·NV, 2]), in one `vdpbf16ps`: two multiply-adds a lane into float32 sums. An odd
// last channel pairs with a zero (its weight pair's second row is zero too). (Without AVX512-BF16 the bf16 entry
// point refuses to run, so this is never reached.)
template <int MR, int NV>
TF_INLINE void accumulate_pairs(__m512* acc, const uint16_t* const* a, const uint16_t* w,
                                                    int64_t C) {
#ifdef __AVX512BF16__
  const int64_t pairs = (C + 1) / 2;
  for (int64_t c2 = 0; c2 < pairs; ++c2) {
    __m512bh wv[NV];
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) wv[v] = (__m512bh)_mm512_loadu_si512(w + (c2 * NV + v) * 32);
    const bool single = 2 * c2 + 1 == C;
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      uint32_t pair = a[r][2 * c2];
      if (!single) pair |= uint32_t(a[r][2 * c2 + 1]) << 16;
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(int(pair));
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r * NV + v] = _mm512_dpbf16_ps(acc[r * NV + v], xv, wv[v]);
    }
  }
#endif
}

}  // namespace
"""
)


def _gelu_constants() -> str:
    """The GELU tail's constants (`kernels.activations`) as C++ declarations."""

    def array(name: str, values: tuple[float, ...]) -> str:
        return f"constexpr float {name}[] = {{{', '.join(f'{c!r}f' for c in values)}}};\n"

    return (
        f"constexpr float GELU_T = {GELU_T!r}f, GELU_SQUARE = {GELU_SQUARE!r}f;\n"
        f"constexpr int GELU_DEGREE = {len(GELU_TAIL) - 1}, GELU_DEGREE_16 = {len(GELU_TAIL_16) - 1}, "
        f"EXP2_DEGREE_16 = {len(EXP2_16) - 1};\n"
        + array("GELU_TAIL", GELU_TAIL)
        + array("GELU_TAIL_16", GELU_TAIL_16)
        + array("EXP2_16", EXP2_16)
    )


VECTOR_MATH = _VECTOR_MATH.replace("namespace {\n", "namespace {\n\n" + _gelu_constants(), 1)


def check_activations(kernel: str, *names: str) -> None:
    """Raise ValueError naming the first of `names` that the epilogues (`ACTIVATIONS`) do not evaluate."""
    for name in names:
        if name not in ACTIVATIONS:
            raise ValueError(f"the CPU {kernel} kernel has no activation {name!r}; it has {ACTIVATIONS}")


def isa() -> str | None:
    """The vector instructions the float32 CPU kernels compile to here: "avx512", "avx2" (AVX2 with FMA, through
    `avx2.AVX2_FORMS`), or None."""
    flags = host_flags().split()
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2"
    return None


def vnni() -> bool:
    """Whether the CPU has VNNI's int8 dot product (`vpdpbusd`), in its AVX-512 or its AVX form."""
    flags = host_flags().split()
    return "avx512_vnni" in flags or "avx_vnni" in flags


def features() -> str:
    """What of the CPU's vector instructions our kernels depend on, e.g. "AVX-512, BF16, VNNI" or "AVX2" (or
    "no AVX2"): an engine's and a timing's CPU are told apart by it."""
    here = isa()
    if here == "avx512":
        flags = host_flags().split()
        extra = [name for flag, name in (("avx512_bf16", "BF16"), ("avx512_vnni", "VNNI")) if flag in flags]
        return ", ".join(["AVX-512", *extra])
    return "AVX2" if here == "avx2" else "no AVX2"


def register_tiles(avx512: Sequence[T], avx2: Sequence[T]) -> tuple[T, ...]:
    """A kernel's register tiles for this CPU: `avx512` where it has AVX-512's 32 vector registers, else `avx2`
    (AVX2 has 16, and a vector of 16 float32 takes two of them: `avx2.AVX2_FORMS`)."""
    return tuple(avx512 if isa() == "avx512" else avx2)


def tile_dispatch(tiles: Sequence[tuple[int, ...]], names: Sequence[str], call: str, kernel: str) -> str:
    """C++ statements that make `call` (a C++ call with `{tile}` where its template arguments go) for the tile of
    `tiles` whose values the C++ variables `names` hold, and fail naming `kernel` and this CPU's tiles for any
    other: e.g. `tile_dispatch(TILES, ("rows", "vectors"), "run<{tile}>(q)", "pointwise")`."""
    branches = []
    for tile in tiles:
        test = " && ".join(f"{name} == {value}" for name, value in zip(names, tile, strict=True))
        branches.append(f"if ({test}) {call.format(tile=', '.join(map(str, tile)))};")
    asked = ', " × ", '.join(names)
    shown = ", ".join("×".join(map(str, tile)) for tile in tiles)
    branches.append(f'TORCH_CHECK(false, "{kernel}: no tile of ", {asked}, " (this CPU\'s tiles: {shown})");')
    return "\n  else ".join(branches)


def vector_problem(kernel: str) -> str | None:
    """Why the float32 `kernel` cannot run on this CPU (it needs AVX-512, or AVX2 with FMA), or None."""
    if isa() is None:
        return f"the {kernel} kernel needs AVX-512 or AVX2 with FMA, and this CPU has neither"
    return None


def avx512_problem(kernel: str) -> str | None:
    """Why the `kernel`, written for AVX-512 alone (the int8 kernels), cannot run on this CPU, or None."""
    if isa() != "avx512":
        return f"the {kernel} kernel is written for AVX-512 and this CPU has none"
    return None


def module_source(core: str, entry: str) -> str:
    """A CPU kernel's module: the vector math, the kernel's C++ (`core`) in an unnamed namespace, and its entry
    point."""
    return VECTOR_MATH + "namespace {\n" + core + "}  // namespace\n" + entry


def load_vector(name: str, source: str, kernel: str, functions: tuple[str, ...] = ()):
    """The extension module of a float32 kernel (`extension.load`) exposing `functions` (by default the one named
    `name`), or RuntimeError where the CPU has neither AVX-512 nor AVX2 with FMA."""
    problem = vector_problem(kernel)
    if problem:
        raise RuntimeError(problem)
    return load(name, source, functions or (name,))


def load_avx512(name: str, source: str, kernel: str, functions: tuple[str, ...] = ()):
    """The extension module of a kernel written for AVX-512 alone, or RuntimeError where the CPU has none."""
    problem = avx512_problem(kernel)
    if problem:
        raise RuntimeError(problem)
    return load(name, source, functions or (name,))


def rounded(channels: int) -> int:
    """`channels` rounded up to whole vectors."""
    return -(-channels // LANES) * LANES


def kernel_dtype(weight: torch.Tensor) -> torch.dtype:
    """The activations' type of a kernel made for `weight`: bf16 for a bf16 weight, else float32."""
    return torch.bfloat16 if weight.dtype == torch.bfloat16 else torch.float32


def paired_rows(block: torch.Tensor) -> torch.Tensor:
    """[..., R, W] (rows: input channels) with a zero row appended to an odd R, then rows interleaved in pairs,
    [..., R/2, W, 2]: the layout `accumulate_pairs` reads, a pair of weights for each output lane."""
    if block.shape[-2] % 2:
        block = torch.nn.functional.pad(block, (0, 0, 0, 1))
    return block.unflatten(-2, (block.shape[-2] // 2, 2)).transpose(-2, -1)


def pack_bias(b: torch.Tensor | None, channels: int) -> torch.Tensor:
    """A bias as [channels rounded up to whole vectors] float32 (zeros past it, or everywhere without one)."""
    packed = torch.zeros(rounded(channels), dtype=torch.float32)
    if b is not None:
        packed[:channels] = b.detach().float().reshape(-1)
    return packed
