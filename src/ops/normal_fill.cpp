// kiln ops: random::fill_normal, the data sets' standard normals (random
// images, random erasing's fill), vectorized: the Threefry blocks and the
// Box–Muller transform of normal(key, {n}), in f32 with float
// approximations of log, sin and cos instead of the f64 library functions.
// A batch of ViT's random 224 x 224 images (4.8M values) took 90 ms of the
// two cores' time with the f64 library functions, beside a 1.05 s training
// step that it slowed by as much (bench/results/2026-12-07-amx-linears/).
// Built without contracted multiply-adds (CMakeLists.txt), so that every
// value is the same whatever the vector width the compiler chose.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kiln/random.h"
#include "ops/draws.h"
#include "ops/scalar_math.h"
#include "ops/threefry.h"

namespace kiln::random {
namespace {

// log(x) for x in [2^-24, 1] (normal floats): Cephes' logf polynomial.
inline float log_unit(float x) {
  const uint32_t u = kiln::m::float_bits(x);
  float e = static_cast<float>(static_cast<int32_t>(u >> 23) - 126);
  float m =
      kiln::m::float_from_bits(static_cast<int>((u & 0x007fffffu) | 0x3f000000u));  // [0.5, 1)
  const bool low = m < 0.70710678f;
  e = low ? e - 1.0f : e;
  m = (low ? m + m : m) - 1.0f;
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y = y + -2.12194440e-4f * e;
  y = y - 0.5f * z;
  return (m + y) + 0.693359375f * e;
}

// cos and sin of 2π·t for t = i·2^-24 in [0, 1): t less the nearest
// quarter turn (exact), Cephes' sinf and cosf polynomials on [-π/4, π/4],
// then the quarter's swap and signs.
inline void cos_sin_turns(float t, float& c, float& s) {
  const float q = static_cast<float>(static_cast<int32_t>(t * 4.0f + 0.5f));  // 0..4
  const float a = (t - 0.25f * q) * 6.28318530717958648f;
  const float z = a * a;
  float sp = -1.9515295891e-4f;
  sp = sp * z + 8.3321608736e-3f;
  sp = sp * z - 1.6666654611e-1f;
  const float sa = sp * z * a + a;
  float cp = 2.443315711809948e-5f;
  cp = cp * z - 1.388731625493765e-3f;
  cp = cp * z + 4.166664568298827e-2f;
  const float ca = cp * z * z - 0.5f * z + 1.0f;
  const int quarter = static_cast<int>(q) & 3;
  const bool swap = quarter & 1;
  const float cos_abs = swap ? sa : ca, sin_abs = swap ? ca : sa;
  c = quarter == 1 || quarter == 2 ? -cos_abs : cos_abs;
  s = quarter >= 2 ? -sin_abs : sin_abs;
}

constexpr int64_t kLanes = 16;

// Threefry-2x32-20 (threefry::threefry2x32) of kLanes blocks at once, in
// loops the compiler vectorizes: x0, x1 in, enciphered under key in place.
template <int R0, int R1, int R2, int R3>
inline void mix4_lanes(uint32_t* x0, uint32_t* x1) {
  for (int r : {R0, R1, R2, R3})
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) {
      x0[l] += x1[l];
      x1[l] = ((x1[l] << r) | (x1[l] >> (32 - r))) ^ x0[l];
    }
}
inline void inject(uint32_t* x0, uint32_t* x1, uint32_t a, uint32_t b) {
#pragma omp simd
  for (int64_t l = 0; l < kLanes; ++l) x0[l] += a, x1[l] += b;
}
void threefry_lanes(const uint32_t key[2], uint32_t* x0, uint32_t* x1) {
  const uint32_t k0 = key[0], k1 = key[1], k2 = k0 ^ k1 ^ 0x1BD11BDAu;
  inject(x0, x1, k0, k1);
  mix4_lanes<13, 15, 26, 6>(x0, x1);
  inject(x0, x1, k1, k2 + 1u);
  mix4_lanes<17, 29, 16, 24>(x0, x1);
  inject(x0, x1, k2, k0 + 2u);
  mix4_lanes<13, 15, 26, 6>(x0, x1);
  inject(x0, x1, k0, k1 + 3u);
  mix4_lanes<17, 29, 16, 24>(x0, x1);
  inject(x0, x1, k1, k2 + 4u);
  mix4_lanes<13, 15, 26, 6>(x0, x1);
  inject(x0, x1, k2, k0 + 5u);
}

// Pairs [j0, j0 + kLanes): values 2j and 2j + 1 into v.
void normal_block(const uint32_t key[2], uint64_t j0, float v[2 * kLanes]) {
  uint32_t x0[kLanes], x1[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) {
    const uint64_t j = j0 + static_cast<uint64_t>(l);
    x0[l] = static_cast<uint32_t>(j >> 32), x1[l] = static_cast<uint32_t>(j);
  }
  threefry_lanes(key, x0, x1);
  float c[kLanes], s[kLanes], r[kLanes];
#pragma omp simd
  for (int64_t l = 0; l < kLanes; ++l) {
    const float u0 = static_cast<float>(static_cast<int32_t>(x0[l] >> 8)) * 0x1p-24f;  // [0, 1)
    const float u1 = static_cast<float>(static_cast<int32_t>(x1[l] >> 8)) * 0x1p-24f;
    r[l] = __builtin_sqrtf(-2.0f * log_unit(1.0f - u0));  // 1 - u0 in (0, 1], exact
    cos_sin_turns(u1, c[l], s[l]);
  }
#pragma omp simd
  for (int64_t l = 0; l < kLanes; ++l) {
    v[2 * l] = r[l] * c[l];
    v[2 * l + 1] = r[l] * s[l];
  }
}

}  // namespace

void fill_normal(const Key& key, float* out, int64_t n) {
  const DrawSpec spec = draw_spec(key, RandomKind::Normal);
  const int64_t pairs = (n + 1) / 2;
  float v[2 * kLanes];
  for (int64_t j = 0; j < pairs; j += kLanes) {
    normal_block(spec.key, static_cast<uint64_t>(j), v);
    const int64_t first = 2 * j, count = std::min<int64_t>(2 * kLanes, n - first);
    std::memcpy(out + first, v, static_cast<size_t>(count) * sizeof(float));
  }
}

}  // namespace kiln::random
