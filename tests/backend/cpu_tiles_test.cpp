// kiln's bf16 tile kernels (src/backend/cpu/tiles.h) on whichever unit the
// CPU has (AMX or AVX512-BF16), against f64 products of the same values.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/tiles.h"

namespace kiln {
namespace {

uint16_t bf16_of(float f) {  // exact for the values below
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Every size around the kernels' blocks (8 rows, 16 columns and 3 blocks of
// them, pairs and tiles of 32 along k), at ViT's 197 tokens and head dim 64:
// A and B hold small multiples of 1/8, so every f32 sum is exact and the
// result must equal the f64 product; the padding holds zeros along k and
// garbage elsewhere (which must not reach C's real rows and columns). With
// add, the sums start from C's values: C = A·B, plus a different number at
// each of C's real places, then C += A·B once more.
TEST(CpuTiles, GemmIsTheProductOnPaddedOperands) {
  if (cpu::tile_kernels().empty()) GTEST_SKIP() << "no bf16 unit for kiln's tile kernels here";
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> value(-16, 16);
  const std::vector<int64_t> sizes{1, 7, 8, 9, 16, 17, 31, 33, 48, 64, 65, 197};
  for (int64_t m : sizes)
    for (int64_t n : sizes)
      for (int64_t k : {1, 2, 3, 31, 32, 33, 64, 197}) {
        SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
                     std::to_string(k) + " on " + cpu::tile_kernels());
        const int64_t mp = round_up(m, 16), np = round_up(n, 16), kp = round_up(k, 32);
        std::vector<float> a(m * k), b(k * n);
        for (float& x : a) x = value(rng) / 8.0f;
        for (float& x : b) x = value(rng) / 8.0f;
        std::vector<uint16_t> a16(mp * kp, bf16_of(1e30f)), b16(kp / 2 * 2 * np, 0);
        for (int64_t i = 0; i < mp; ++i)
          for (int64_t p = 0; p < kp; ++p)
            a16[i * kp + p] = i < m && p < k ? bf16_of(a[i * k + p]) : (p < k ? bf16_of(3) : 0);
        for (int64_t p = 0; p < k; ++p)
          for (int64_t j = 0; j < n; ++j)
            b16[(p / 2) * 2 * np + 2 * j + p % 2] = bf16_of(b[p * n + j]);
        std::vector<float> c(mp * np, -1.0f);
        cpu::tiles::begin();
        cpu::tiles::gemm(m, n, k, a16.data(), kp, b16.data(), 2 * np, c.data(), np);
        std::vector<float> twice(c);
        for (int64_t i = 0; i < m; ++i)  // every real value + its row and column numbers
          for (int64_t j = 0; j < n; ++j) twice[i * np + j] += static_cast<float>(i * 1000 + j);
        cpu::tiles::gemm(m, n, k, a16.data(), kp, b16.data(), 2 * np, twice.data(), np, true);
        cpu::tiles::end();
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p) s += double(a[i * k + p]) * b[p * n + j];
            ASSERT_EQ(c[i * np + j], s) << "at " << i << ", " << j;
            ASSERT_EQ(twice[i * np + j], 2 * s + double(i * 1000 + j))
                << "add, at " << i << ", " << j;
          }
      }
}

}  // namespace
}  // namespace kiln
