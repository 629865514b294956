"""The float32 CPU kernels on CPUs without AVX-512: AVX-512's float vector and the intrinsics our kernels use,
written for AVX2 + FMA (a vector of 16 float32 as two of 8, a mask of 16 lanes as the same 16 bits).

The kernels are written once, in AVX-512's intrinsics (`avx512.VECTOR_MATH`). Compiled where the CPU has AVX-512
this header is empty; elsewhere it maps each intrinsic the float32 kernels call, by a macro defined after
`<immintrin.h>`, to its two-halves form below, so the same source builds for an AVX2 CPU (most laptops and
desktops, AMD's before Zen 4, many cloud machines). What has no AVX2 form stays AVX-512's alone: the bf16 dot
products (`vdpbf16ps`) and the int8 kernels (`vpdpbusd`), which check their own features.

A vector of 16 is two AVX2 registers, so a register tile of R vectors needs 2·R of AVX2's 16: the tiles sized for
AVX-512's 32 registers spill here (an 8 × 3 tile of the 1×1 kernel ran at 16-18 GFLOP/s on ResNet-50's shapes, a 6 × 1
one at 80-110), so each kernel names its tiles for both (`avx512.register_tiles`) and instantiates this CPU's. Masked
loads and stores use `vmaskmovps`, which reads and writes only the lanes the mask holds (no fault past a buffer's end),
for a half the mask holds in part only: a half it holds whole is a plain move, one it holds none of none. Most of
MobileNetV3's widths are 8 past a multiple of 16 (24, 40, 72, 120, 184, 200), and border tiles read their outside
pixels with an empty mask: on a Zen 3 core the depthwise kernel at 72 channels of 56² ran 1.25× faster for it, at 120
channels 1.1×. `_mm512_scalef_ps` multiplies by 2^n in two halves, each a normal power of two, so that results that
underflow or overflow saturate to 0 and inf as AVX-512's does; `_mm512_rcp14_ps` is `vrcpps` (12 bits) with a Newton
step, within AVX-512's 2^-14. Every form is `TF_INLINE` (always inlined): the two-halves vector is a struct, and a call
GCC chose not to inline in a large kernel passed it through memory (the 1×1 kernel with SiLU ran 2.8× slower, the
depthwise one 1.5×)."""

from __future__ import annotations

AVX2_FORMS = r"""
#ifndef __AVX512F__
#if !defined(__AVX2__) || !defined(__FMA__)
#error "the CPU kernels need AVX-512 or AVX2 with FMA"
#endif
#include <cstdint>
#include <cstring>
namespace tf_avx2 {

struct V16 { __m256 lo, hi; };     // 16 float32
struct I16 { __m256i lo, hi; };    // 16 int32

// The lanes of a half (bits 0-7 of `bits`) as all-ones / all-zeros 32-bit lanes.
TF_INLINE __m256i lanes8(unsigned bits) {
  const __m256i each = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(bits & 0xFF)), each), each);
}
TF_INLINE __m256 lanes8_ps(unsigned bits) { return _mm256_castsi256_ps(lanes8(bits)); }

TF_INLINE V16 set1(float v) { const __m256 a = _mm256_set1_ps(v); return {a, a}; }
TF_INLINE V16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
TF_INLINE V16 loadu(const void* p) {
  const float* f = static_cast<const float*>(p);
  return {_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8)};
}
TF_INLINE void storeu(void* p, V16 v) {
  float* f = static_cast<float*>(p);
  _mm256_storeu_ps(f, v.lo);
  _mm256_storeu_ps(f + 8, v.hi);
}
// A half of a masked move (`bits`: its 8 lanes): a plain move when it holds every lane, none when it holds none.
TF_INLINE __m256 maskz_load8(unsigned bits, const float* f) {
  bits &= 0xFF;
  if (bits == 0xFF) return _mm256_loadu_ps(f);
  if (bits == 0) return _mm256_setzero_ps();
  return _mm256_maskload_ps(f, lanes8(bits));
}
TF_INLINE void mask_store8(float* f, unsigned bits, __m256 v) {
  bits &= 0xFF;
  if (bits == 0xFF) return _mm256_storeu_ps(f, v);
  if (bits != 0) _mm256_maskstore_ps(f, lanes8(bits), v);
}
TF_INLINE V16 maskz_loadu(uint16_t m, const void* p) {
  const float* f = static_cast<const float*>(p);
  if (m == 0xFFFF) return loadu(f);
  return {maskz_load8(m, f), maskz_load8(m >> 8, f + 8)};
}
TF_INLINE void mask_storeu(void* p, uint16_t m, V16 v) {
  float* f = static_cast<float*>(p);
  if (m == 0xFFFF) return storeu(f, v);
  mask_store8(f, m, v.lo);
  mask_store8(f + 8, m >> 8, v.hi);
}

#define TF_AVX2_BINARY(name, op) \
  TF_INLINE V16 name(V16 a, V16 b) { return {op(a.lo, b.lo), op(a.hi, b.hi)}; }
TF_AVX2_BINARY(add, _mm256_add_ps)
TF_AVX2_BINARY(sub, _mm256_sub_ps)
TF_AVX2_BINARY(mul, _mm256_mul_ps)
TF_AVX2_BINARY(div, _mm256_div_ps)
TF_AVX2_BINARY(max, _mm256_max_ps)  // as AVX-512's: the second operand when either is NaN
TF_AVX2_BINARY(min, _mm256_min_ps)
#undef TF_AVX2_BINARY

TF_INLINE V16 fmadd(V16 a, V16 b, V16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
TF_INLINE V16 fnmadd(V16 a, V16 b, V16 c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
TF_INLINE V16 abs(V16 a) {
  const __m256 bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, bits), _mm256_and_ps(a.hi, bits)};
}
TF_INLINE __m256 rcp8(__m256 d) {  // vrcpps (12 bits) and a Newton step
  const __m256 t = _mm256_rcp_ps(d);
  return _mm256_mul_ps(t, _mm256_fnmadd_ps(d, t, _mm256_set1_ps(2.f)));
}
TF_INLINE V16 rcp14(V16 d) { return {rcp8(d.lo), rcp8(d.hi)}; }
template <int MODE>
TF_INLINE V16 roundscale(V16 x) { return {_mm256_round_ps(x.lo, MODE), _mm256_round_ps(x.hi, MODE)}; }

// p · 2^n for integral n: n clamped to [-252, 254] (beyond it every p of the kernels' range saturates anyway) and
// applied as two normal powers of two, 2^(n>>1) then 2^(n - (n>>1)), so that underflow gives 0 and overflow inf.
TF_INLINE __m256 scalef8(__m256 p, __m256 n) {
  __m256i k = _mm256_cvtps_epi32(n);
  k = _mm256_min_epi32(_mm256_set1_epi32(254), _mm256_max_epi32(_mm256_set1_epi32(-252), k));
  const __m256i half = _mm256_srai_epi32(k, 1), rest = _mm256_sub_epi32(k, half);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 first = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 second = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, first), second);
}
TF_INLINE V16 scalef(V16 p, V16 n) { return {scalef8(p.lo, n.lo), scalef8(p.hi, n.hi)}; }
// p · 2^n for integral n in [-126, 127] (a normal power of two: one exponent field, no saturation to handle)
TF_INLINE __m256 scale_normal8(__m256 p, __m256 n) {
  const __m256i field = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(field));
}
TF_INLINE V16 scale_normal(V16 p, V16 n) { return {scale_normal8(p.lo, n.lo), scale_normal8(p.hi, n.hi)}; }

template <int PREDICATE>
TF_INLINE uint16_t cmp_mask(V16 a, V16 b) {
  const int lo = _mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, PREDICATE));
  const int hi = _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, PREDICATE));
  return uint16_t(lo | (hi << 8));
}
TF_INLINE V16 blend(V16 src, uint16_t m, V16 v) {  // v's lanes where m holds them, src's elsewhere
  return {_mm256_blendv_ps(src.lo, v.lo, lanes8_ps(m)), _mm256_blendv_ps(src.hi, v.hi, lanes8_ps(m >> 8))};
}
TF_INLINE V16 mask_mul(V16 src, uint16_t m, V16 a, V16 b) { return blend(src, m, mul(a, b)); }
TF_INLINE V16 mask_max(V16 src, uint16_t m, V16 a, V16 b) { return blend(src, m, max(a, b)); }
TF_INLINE V16 mask_mov(V16 src, uint16_t m, V16 a) { return blend(src, m, a); }
TF_INLINE V16 maskz_mov(uint16_t m, V16 a) { return blend(zero(), m, a); }
TF_INLINE V16 maskz_sub(uint16_t m, V16 a, V16 b) { return blend(zero(), m, sub(a, b)); }

TF_INLINE float reduce_add(V16 v) {
  const __m256 s = _mm256_add_ps(v.lo, v.hi);
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
TF_INLINE float reduce_max(V16 v) {
  const __m256 s = _mm256_max_ps(v.lo, v.hi);
  __m128 t = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_max_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

// 16 bf16 values (those of mask m; zeros elsewhere) as float32: bf16 is the upper half of a float32.
TF_INLINE V16 load_bf16(uint16_t m, const uint16_t* p) {
  alignas(16) uint16_t values[16] = {};
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) values[i] = p[i];
  const __m128i* v = reinterpret_cast<const __m128i*>(values);
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_load_si128(v)), 16)),
          _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_load_si128(v + 1)), 16))};
}

TF_INLINE I16 cvtps_epi32(V16 v) { return {_mm256_cvtps_epi32(v.lo), _mm256_cvtps_epi32(v.hi)}; }
TF_INLINE __m128i cvtsepi32_epi8(I16 v) {  // saturated to int16, lanes put back in order, then to int8
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(v.lo, v.hi), 0xD8);
  return _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
}
TF_INLINE void mask_storeu_epi8(void* p, uint16_t m, __m128i v) {
  if (m == 0xFFFF) return _mm_storeu_si128(static_cast<__m128i*>(p), v);
  alignas(16) int8_t values[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(values), v);
  int8_t* out = static_cast<int8_t*>(p);
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) out[i] = values[i];
}

}  // namespace tf_avx2

#define __m512 tf_avx2::V16
#define __m512i tf_avx2::I16
#define _mm512_set1_ps(v) tf_avx2::set1(v)
#define _mm512_setzero_ps() tf_avx2::zero()
#define _mm512_loadu_ps(p) tf_avx2::loadu(p)
#define _mm512_storeu_ps(p, v) tf_avx2::storeu(p, v)
#define _mm512_maskz_loadu_ps(m, p) tf_avx2::maskz_loadu(m, p)
#define _mm512_mask_storeu_ps(p, m, v) tf_avx2::mask_storeu(p, m, v)
#define _mm512_add_ps(a, b) tf_avx2::add(a, b)
#define _mm512_sub_ps(a, b) tf_avx2::sub(a, b)
#define _mm512_mul_ps(a, b) tf_avx2::mul(a, b)
#define _mm512_div_ps(a, b) tf_avx2::div(a, b)
#define _mm512_max_ps(a, b) tf_avx2::max(a, b)
#define _mm512_min_ps(a, b) tf_avx2::min(a, b)
#define _mm512_fmadd_ps(a, b, c) tf_avx2::fmadd(a, b, c)
#define _mm512_fnmadd_ps(a, b, c) tf_avx2::fnmadd(a, b, c)
#define _mm512_abs_ps(a) tf_avx2::abs(a)
#define _mm512_rcp14_ps(a) tf_avx2::rcp14(a)
#define _mm512_roundscale_ps(a, mode) tf_avx2::roundscale<(mode)>(a)
#define _mm512_scalef_ps(p, n) tf_avx2::scalef(p, n)
#define _mm512_cmp_ps_mask(a, b, predicate) tf_avx2::cmp_mask<(predicate)>(a, b)
#define _mm512_mask_mul_ps(src, m, a, b) tf_avx2::mask_mul(src, m, a, b)
#define _mm512_mask_max_ps(src, m, a, b) tf_avx2::mask_max(src, m, a, b)
#define _mm512_mask_mov_ps(src, m, a) tf_avx2::mask_mov(src, m, a)
#define _mm512_maskz_mov_ps(m, a) tf_avx2::maskz_mov(m, a)
#define _mm512_maskz_sub_ps(m, a, b) tf_avx2::maskz_sub(m, a, b)
#define _mm512_reduce_add_ps(v) tf_avx2::reduce_add(v)
#define _mm512_reduce_max_ps(v) tf_avx2::reduce_max(v)
#define _mm512_cvtps_epi32(v) tf_avx2::cvtps_epi32(v)
#define _mm512_cvtsepi32_epi8(v) tf_avx2::cvtsepi32_epi8(v)
#define _mm_mask_storeu_epi8(p, m, v) tf_avx2::mask_storeu_epi8(p, m, v)
#endif
"""
