// The AVX-512 helpers of the cpu kernels (src/backend/cpu/avx512.h) against
// their scalar definitions: to_bf16_bits is narrow_bf16 bit for bit, exp16 is
// exp to a few ulp and goes to 0 (not -inf + inf) at the bottom. The suite is
// built without -march, so this file compiles the helpers for AVX-512 itself
// and runs them where the CPU has it; the kernels' portable loops are checked
// on every CPU by the attention tests, and under scripts/test-isa.sh's caps.
// (clang, which builds the sanitized suite, spells the pragma its own way;
// its intrinsics' header comes first, as they carry their own targets.)
#if defined(__clang__)
#include <immintrin.h>
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
#endif
#define KILN_CPU_AVX512_BY_PRAGMA 1
#include "backend/cpu/avx512.h"

#include <cstring>

namespace {
using namespace kiln::cpu;
void round16(const float* x, uint16_t* y) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), avx512::to_bf16_bits(_mm512_loadu_ps(x)));
}
void exp_16(const float* x, float* y) {
  _mm512_storeu_ps(y, avx512::exp16(_mm512_loadu_ps(x)));
}
}  // namespace
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_common.h"

namespace kiln {
namespace {

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(CpuAvx512, Bf16BitsRoundAsNarrowBf16) {
  if (!cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 F/BW/VL on this CPU";
  static_assert(KILN_CPU_AVX512);
  std::vector<uint32_t> u{0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                          0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu,
                          0x7f7fffffu, 0x00000001u, 0x807fffffu, 0x3f808000u,
                          0x3f818000u, 0x3f80ffffu, 0x7f7f8000u, 0x3f800000u};
  for (uint64_t i = 0; i < (uint64_t(1) << 32); i += 4099) u.push_back(static_cast<uint32_t>(i));
  while (u.size() % 16) u.push_back(0x40490fdbu);
  std::vector<float> x(u.size());
  for (size_t i = 0; i < u.size(); ++i) x[i] = from_bits(u[i]);
  std::vector<uint16_t> got(u.size());
  for (size_t i = 0; i < u.size(); i += 16) round16(x.data() + i, got.data() + i);
  for (size_t i = 0; i < u.size(); ++i)
    ASSERT_EQ(got[i], cpu::narrow_bf16(x[i])) << "f32 bits 0x" << std::hex << u[i];
}

TEST(CpuAvx512, Exp16IsExpToAFewUlp) {
  if (!cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 F/BW/VL on this CPU";
  std::vector<float> x;
  for (float v = -110.0f; v <= 88.5f; v += 0.0137f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.7f, -87.3f, -103.9f, -104.0f, -200.0f,
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    x.push_back(v);
  while (x.size() % 16) x.push_back(0.5f);
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += 16) exp_16(x.data() + i, y.data() + i);
  for (size_t i = 0; i < x.size(); ++i) {
    SCOPED_TRACE(x[i]);
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]));
      continue;
    }
    const double want = std::exp(static_cast<double>(x[i]));
    if (x[i] <= -104.0f) {
      EXPECT_EQ(y[i], 0.0f);
    } else if (want >= std::numeric_limits<float>::min()) {
      EXPECT_NEAR(y[i], want, 5e-7 * want);
    } else {  // subnormal results: within an ulp of the subnormals' spacing
      EXPECT_NEAR(y[i], want, 2 * std::numeric_limits<float>::denorm_min());
    }
  }
}

TEST(CpuAvx512, LanesMasksTheFirstN) {
  if (!cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 F/BW/VL on this CPU";
  EXPECT_EQ(cpu::avx512::lanes(0), 0);
  EXPECT_EQ(cpu::avx512::lanes(5), 0x1f);
  EXPECT_EQ(cpu::avx512::lanes(16), 0xffff);
  EXPECT_EQ(cpu::avx512::lanes(197), 0xffff);
}

}  // namespace
}  // namespace kiln
