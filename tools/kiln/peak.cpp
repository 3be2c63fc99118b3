// kiln train's peak FLOP rate: loops of independent FMA chains on all
// threads, one copy per vector ISA (AVX-512, AVX2, SSE's multiply and add),
// and for bf16 the matrix unit's own loop (AMX tiles, AVX512-BF16 dot
// products).
#include "peak.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include "kiln/ops.h"

namespace kiln::tools {
namespace {

// The measured loops are never instrumented: under ASan their accumulators
// would live in memory, and a sanitizer build would measure its sanitizer
// (an AVX512-BF16 peak of 39 GFLOP/s below the 165 of a bf16 matmul that
// oneDNN, uninstrumented, ran beside it).
#define KILN_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// GFLOP/s of thread_loop(iters) run on every thread at once, the best of
// three short runs, for `flops` per iteration per thread. Each ISA's loop is
// a function of its own with that ISA's target attribute, called from the
// OpenMP region: the region's body is outlined into a function that does not
// carry the attribute, where clang cannot compile the ISA's intrinsics on a
// CPU without it (-march=native). Its result keeps the loop from being
// dropped.
double best_rate(float (*thread_loop)(int64_t), int64_t iters, double flops) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    sink += thread_loop(iters);
    double secs = since(t0);
    if (sink != 12345.0f) best = std::max(best, flops * iters * num_threads() / secs / 1e9);
  }
  return best;
}

// 12 independent FMA chains: they hide the FMA latency (4 cycles) on two FMA
// ports and fit AVX2's 16 vector registers. A macro, so that each copy is
// compiled for its own target ISA. Vec: the vector type of LANES floats.
constexpr int kChains = 12;
constexpr int64_t kChainIters = 20'000'000;
#define KILN_FMA_CHAINS(Vec, LANES, SET1, FMA)                                         \
  const Vec m = SET1(0.999999f), c = SET1(1e-7f);                                      \
  Vec a[kChains];                                                                      \
  for (int i = 0; i < kChains; ++i) a[i] = SET1(static_cast<float>(i));                \
  for (int64_t it = 0; it < iters; ++it) {                                             \
    _Pragma("GCC unroll 12") for (int i = 0; i < kChains; ++i) a[i] = FMA(a[i], m, c); \
  }                                                                                    \
  for (int i = 1; i < kChains; ++i) a[0] = FMA(a[i], m, a[0]);                         \
  float lanes[LANES];                                                                  \
  std::memcpy(lanes, &a[0], sizeof lanes);                                             \
  float sum = 0;                                                                       \
  for (int l = 0; l < LANES; ++l) sum += lanes[l];                                     \
  return sum;

KILN_UNINSTRUMENTED __attribute__((target("avx512f"), noinline)) float fma_chains_avx512(
    int64_t iters) {
  KILN_FMA_CHAINS(__m512, 16, _mm512_set1_ps, _mm512_fmadd_ps)
}
double fma_gflops_avx512() {
  return best_rate(fma_chains_avx512, kChainIters, 2.0 * kChains * 16);
}

KILN_UNINSTRUMENTED __attribute__((target("avx2,fma"), noinline)) float fma_chains_avx2(
    int64_t iters) {
  KILN_FMA_CHAINS(__m256, 8, _mm256_set1_ps, _mm256_fmadd_ps)
}
double fma_gflops_avx2() {
  return best_rate(fma_chains_avx2, kChainIters, 2.0 * kChains * 8);
}

// x86-64's baseline: a multiply and an add (2 flops) per step.
inline __m128 mul_add_sse(__m128 a, __m128 b, __m128 c) {
  return _mm_add_ps(_mm_mul_ps(a, b), c);
}
KILN_UNINSTRUMENTED __attribute__((noinline)) float mul_add_chains_sse(int64_t iters) {
  KILN_FMA_CHAINS(__m128, 4, _mm_set1_ps, mul_add_sse)
}
double mul_add_gflops_sse() {
  return best_rate(mul_add_chains_sse, kChainIters, 2.0 * kChains * 4);
}
#undef KILN_FMA_CHAINS

// AVX512-BF16: 12 independent chains of vdpbf16ps, each 16 lanes of two bf16
// products summed into f32 (64 flops).
KILN_UNINSTRUMENTED __attribute__((target("avx512f,avx512bf16"), noinline)) float
dot_chains_avx512_bf16(int64_t iters) {
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  for (int i = 1; i < kChains; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  float lanes[16];
  _mm512_storeu_ps(lanes, acc[0]);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}
double dot_gflops_avx512_bf16() {
  return best_rate(dot_chains_avx512_bf16, kChainIters, 64.0 * kChains);
}

// AMX: tdpbf16ps on four accumulator tiles from four source tiles kept in
// the tile registers (16x16 f32 += 16x32 bf16 · 32x16 bf16, 16384 flops
// each), on every thread: the tile unit's rate, which no GEMM exceeds. Linux
// gives a process the AMX state only when asked (arch_prctl); 0 if it will not.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// One thread's tile loop (a function of its own, as best_rate explains).
KILN_UNINSTRUMENTED __attribute__((target("amx-tile,amx-bf16"), noinline)) float tile_loop_amx(
    int64_t iters) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.bytes_per_row[t] = 64;
  // GCC 12's _tile_loadconfig tells the compiler that it reads 8 bytes of
  // the 64, which lets it drop the stores of the rest: make them all happen.
  __asm__ __volatile__("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t src[16 * 32];
  std::fill(src, src + 16 * 32, uint16_t{0x3380});  // bf16 5.96e-8
  alignas(64) float out[16 * 16];
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

double tile_gflops_amx() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return 0;
  return best_rate(tile_loop_amx, 2'000'000, 4.0 * 2 * 16 * 16 * 32);
}

double fma_gflops(const std::string& isa) {
  if (isa == "AVX-512") return fma_gflops_avx512();
  if (isa == "AVX2") return fma_gflops_avx2();
  return mul_add_gflops_sse();
}

}  // namespace

std::string peak_description(bool bf16) {
  const std::string unit = bf16 ? cpu_bf16_gemm_unit() : cpu_gemm_isa();
  if (unit == "AMX") return "an AMX bf16 tile loop";
  if (unit == "AVX512-BF16") return "an AVX512-BF16 dot-product loop";
  return "an fp32 " + unit + " FMA loop";
}

double measure_peak_gflops(bool bf16) {
  // The unit the GEMMs really run on (AVX2 on an AVX2-only CPU and where the
  // libraries are capped; for bf16 the unit oneDNN chose), so that
  // utilization stays below 100%.
  if (bf16) {
    const std::string unit = cpu_bf16_gemm_unit();
    if (unit == "AMX") {
      if (double amx = tile_gflops_amx(); amx > 0) return amx;
      return dot_gflops_avx512_bf16();  // not reached: oneDNN runs AMX only with the permission
    }
    if (unit == "AVX512-BF16") return dot_gflops_avx512_bf16();
  }
  return fma_gflops(cpu_gemm_isa());
}

}  // namespace kiln::tools
