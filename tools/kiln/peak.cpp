// kiln train's peak FLOP rate: loops of independent FMA chains on all
// threads, one copy per vector ISA (AVX-512, AVX2, SSE's multiply and add).
#include "peak.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "kiln/ops.h"

namespace kiln::tools {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// GFLOP/s of 12 independent FMA chains per thread, on all threads, the best
// of three short runs: 12 chains hide the FMA latency (4 cycles) on two FMA
// ports and fit AVX2's 16 vector registers. A macro, so that each copy is
// compiled for its own target ISA. Vec: the vector type of LANES floats.
#define KILN_FMA_PEAK(Vec, LANES, SET1, FMA)                                       \
  constexpr int64_t kIters = 20'000'000;                                           \
  constexpr int kChains = 12;                                                      \
  double best = 0;                                                                 \
  for (int rep = 0; rep < 3; ++rep) {                                              \
    auto t0 = Clock::now();                                                        \
    float sink = 0;                                                                \
    _Pragma("omp parallel reduction(+ : sink)") {                                  \
      const Vec m = SET1(0.999999f), c = SET1(1e-7f);                              \
      Vec a[kChains];                                                              \
      for (int i = 0; i < kChains; ++i) a[i] = SET1(static_cast<float>(i));        \
      for (int64_t it = 0; it < kIters; ++it) {                                    \
        _Pragma("GCC unroll 12") for (int i = 0; i < kChains; ++i) a[i] = FMA(a[i], m, c); \
      }                                                                            \
      for (int i = 1; i < kChains; ++i) a[0] = FMA(a[i], m, a[0]);                 \
      float lanes[LANES];                                                          \
      std::memcpy(lanes, &a[0], sizeof lanes);                                     \
      for (int l = 0; l < LANES; ++l) sink += lanes[l];                            \
    }                                                                              \
    double secs = since(t0);                                                       \
    double flops = 2.0 * kChains * LANES * kIters * num_threads();                 \
    if (sink != 12345.0f) best = std::max(best, flops / secs / 1e9);               \
  }                                                                                \
  return best;

__attribute__((target("avx512f"))) double fma_gflops_avx512() {
  KILN_FMA_PEAK(__m512, 16, _mm512_set1_ps, _mm512_fmadd_ps)
}

__attribute__((target("avx2,fma"))) double fma_gflops_avx2() {
  KILN_FMA_PEAK(__m256, 8, _mm256_set1_ps, _mm256_fmadd_ps)
}

// x86-64's baseline: a multiply and an add (2 flops) per step.
inline __m128 mul_add_sse(__m128 a, __m128 b, __m128 c) {
  return _mm_add_ps(_mm_mul_ps(a, b), c);
}
double mul_add_gflops_sse() {
  KILN_FMA_PEAK(__m128, 4, _mm_set1_ps, mul_add_sse)
}
#undef KILN_FMA_PEAK

}  // namespace

double measure_peak_gflops() {
  // The ISA the GEMMs really run (cpu_gemm_isa: AVX2 on an AVX2-only CPU and
  // where the libraries are capped), so that utilization stays below 100%.
  std::string isa = cpu_gemm_isa();
  if (isa == "AVX-512") return fma_gflops_avx512();
  if (isa == "AVX2") return fma_gflops_avx2();
  return mul_add_gflops_sse();
}

}  // namespace kiln::tools
