#include <immintrin.h>
#include <x86intrin.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#define KILN_DPBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// (needs the pre-069051c row32, transpose_pairs and pack_transposed of src/backend/cpu/tiles.cpp pasted here)
// 32 x 32 transpose from lane inserts: dst[i][c] = src[c][i] (src rows lds apart)
KILN_DPBF16 __attribute__((always_inline)) inline void transpose32_lanes(const uint16_t* src, int64_t lds, uint16_t* dst, int64_t ld) {
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    __m512i a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const uint16_t* s = src + i * lds + 8 * g;
      __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)s));
      z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i*)(s + 8 * lds)), 1);
      z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i*)(s + 16 * lds)), 2);
      z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i*)(s + 24 * lds)), 3);
      a[i] = z;
    }
    __m512i t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm512_unpacklo_epi16(a[i], a[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi16(a[i], a[i + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 8; h += 4) {
      u[h] = _mm512_unpacklo_epi32(t[h], t[h + 2]);
      u[h + 1] = _mm512_unpackhi_epi32(t[h], t[h + 2]);
      u[h + 2] = _mm512_unpacklo_epi32(t[h + 1], t[h + 3]);
      u[h + 3] = _mm512_unpackhi_epi32(t[h + 1], t[h + 3]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      _mm512_storeu_si512(dst + (8 * g + 2 * c) * ld, _mm512_unpacklo_epi64(u[c], u[c + 4]));
      _mm512_storeu_si512(dst + (8 * g + 2 * c + 1) * ld, _mm512_unpackhi_epi64(u[c], u[c + 4]));
    }
  }
}
KILN_DPBF16 void pack_transposed3(const uint16_t* a, int64_t k, int64_t m, int64_t i0, int64_t k0,
                                 uint16_t* dst, int64_t ld) {
  if (k0 + 32 <= k) return transpose32_lanes(a + k0 * m + i0, m, dst, ld);
  alignas(64) uint16_t pad[32 * 32];
  for (int r = 0; r < 32; ++r) _mm512_store_si512(pad + r * 32, row32(a, k, m, k0 + r, i0));
  transpose32_lanes(pad, 32, dst, ld);
}
int main(int argc, char** argv) {
  const int64_t m = atoi(argv[1]), k = atoi(argv[2]);
  uint16_t* a = (uint16_t*)aligned_alloc(64, (k * m * 2 + 63) / 64 * 64);
  for (int64_t i = 0; i < k * m; ++i) a[i] = (uint16_t)(i * 7 + i / 1000);
  const int64_t kcap = (k + 255) / 256 * 256;
  uint16_t* dst = (uint16_t*)aligned_alloc(64, kcap * m * 2);
  uint16_t* dst2 = (uint16_t*)aligned_alloc(64, kcap * m * 2);
  memset(dst, 0, kcap * m * 2); memset(dst2, 0, kcap * m * 2);
  for (int mode = 1; mode < 3; ++mode)
    for (int64_t k0 = 0; k0 < k; k0 += 256) {
      const int64_t kc = std::min<int64_t>(256, (k - k0 + 31) / 32 * 32);
      uint16_t* d = (mode == 1 ? dst : dst2) + k0 * m;
      for (int64_t s = 0; s < kc; s += 32)
        for (int64_t i = 0; i < m; i += 32)
          if (mode == 1) pack_transposed(a, k, m, i, k0 + s, d + i * kc + s, kc);
          else pack_transposed3(a, k, m, i, k0 + s, d + i * kc + s, kc);
    }
  printf("same: %d\n", memcmp(dst, dst2, kcap * m * 2) == 0);
  for (int round = 0; round < 3; ++round)
  for (int mode = 1; mode < 5; ++mode) {
    double best = 1e30;
    for (int rep = 0; rep < 7; ++rep) {
      uint64_t t0 = __rdtsc();
      for (int64_t k0 = 0; k0 < k; k0 += 256) {
        const int64_t kc = std::min<int64_t>(256, (k - k0 + 31) / 32 * 32);
        uint16_t* d = (mode == 1 ? dst : dst2);
        for (int64_t s = 0; s < kc; s += 32)
          for (int64_t i = 0; i < m; i += 32) {
            if (mode >= 3) {
              const int64_t D = mode == 3 ? 2 : 4;
              int64_t ii = i + 32 * D, ss = s;
              if (ii >= m) { ii -= m; ss += 32; }
              if (k0 + ss + 32 <= k)
                for (int r = 0; r < 32; ++r) _mm_prefetch((const char*)(a + (k0 + ss + r) * m + ii), _MM_HINT_T0);
            }
            if (mode == 1) pack_transposed(a, k, m, i, k0 + s, d + i * kc + s, kc);
            else pack_transposed3(a, k, m, i, k0 + s, d + i * kc + s, kc);
          }
      }
      best = std::min(best, (double)(__rdtsc() - t0));
    }
    printf("m %ld k %ld (%.1f MB) %s: %.2f B/cycle\n", (long)m, (long)k, k * m * 2 / 1e6, mode == 1 ? "transposed" : mode == 2 ? "lanes" : mode == 3 ? "lanes+pf2" : "lanes+pf4", k * m * 2 / best);
  }
}
