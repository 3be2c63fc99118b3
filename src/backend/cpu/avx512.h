// kiln cpu backend: AVX-512 helpers for the kernels written with intrinsics
// (16 f32 lanes). KILN_CPU_AVX512 is 1 where the compiler targets AVX-512 F,
// BW and VL (kiln's -march); a kernel that uses these keeps a portable loop
// for the other CPUs.
//
// Include this first: GCC 12's AVX-512 intrinsics start from
// _mm512_undefined_ps(), which its -Wuninitialized reports as read
// uninitialized (a false positive, at the lines of GCC's own header, so the
// pragmas must come before any include of <immintrin.h>; clang, which builds
// the sanitized suite and the fuzz targets, has neither the false positive
// nor -Wmaybe-uninitialized).
#pragma once
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

// (KILN_CPU_AVX512_BY_PRAGMA: a test that compiles these under `#pragma GCC
// target("avx512f,avx512bw,avx512vl")`, which does not define the __AVX512*
// macros in GCC 12's C++.)
#if (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)) || \
    defined(KILN_CPU_AVX512_BY_PRAGMA)
#define KILN_CPU_AVX512 1
#else
#define KILN_CPU_AVX512 0
#endif

#if KILN_CPU_AVX512
namespace kiln::cpu::avx512 {

// 16 bf16 values (their bits) widened to f32, exactly.
inline __m512 load_bf16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The first n of 16 lanes (all 16 when n >= 16).
inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}

// exp of 16 lanes: exp_approx's range reduction and polynomial (scalar_math.h),
// with 2^n applied by vscalefps, which also takes the result down through the
// subnormals to 0 (exp_approx flushes them to 0). x is clamped at -104 only so
// that -inf gives 0 rather than -inf + inf. NaN stays NaN; +inf gives NaN
// (the softmax calls it on x <= 0 only).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);  // returns the second operand for NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(0.001388888922f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.008333335072f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.04166664928f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.1666666716f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 16 f32 -> bf16 bits as narrow_bf16 (cpu_common.h) rounds them: to nearest
// even, NaN kept quiet. Integer ops, for CPUs without AVX512-BF16.
inline __m256i to_bf16_bits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                               _mm512_and_si512(hi, _mm512_set1_epi32(1)));
  r = _mm512_srli_epi32(r, 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                            _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

// 16 f32 -> bf16 bits, rounded to nearest even: one vcvtneps2bf16 where the
// CPU has AVX512-BF16 (which also flushes subnormal inputs and results to
// zero; the same as narrow_bf16 otherwise), else to_bf16_bits.
inline __m256i to_bf16(__m512 x) {
#if defined(__AVX512BF16__)
  return (__m256i)_mm512_cvtneps_pbh(x);
#else
  return to_bf16_bits(x);
#endif
}

}  // namespace kiln::cpu::avx512
#endif
