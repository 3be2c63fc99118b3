// kiln ops: Threefry-2x32 (20 rounds) and the draws built on it — the block
// function, the key derivations (split, fold_in, a draw's key) and the two
// values of a draw's block — written once for the host (ops/random.cpp, which
// the cpu and ref backends and the data sets call) and, compiled by nvcc, for
// the CUDA backend's Random kernel, so that one key gives the same numbers on
// every device. Every multiply-add of a draw is an explicit fma, so that no
// compiler contracts differently: only the library functions (log, sin, cos,
// erf, exp) of the host and the device may differ, by an ulp of a double.
#pragma once
#include <cmath>
#include <cstdint>

#include "kiln/random.h"
#include "ops/draws.h"

#if !defined(KILN_HD)
#if defined(__CUDACC__)
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif
#endif

namespace kiln::threefry {

// Counter-space domains, so that split, fold_in and draws never share a block.
inline constexpr uint32_t kFoldIn = 0, kSplit = 1, kDraw = 2;

KILN_HD inline uint32_t rotl(uint32_t x, int r) {
  return (x << r) | (x >> (32 - r));
}

// Four rounds of mixing with rotations r0..r3.
KILN_HD inline void mix4(uint32_t& x0, uint32_t& x1, int r0, int r1, int r2, int r3) {
  x0 += x1;
  x1 = rotl(x1, r0) ^ x0;
  x0 += x1;
  x1 = rotl(x1, r1) ^ x0;
  x0 += x1;
  x1 = rotl(x1, r2) ^ x0;
  x0 += x1;
  x1 = rotl(x1, r3) ^ x0;
}

// The block function: out = Threefry-2x32-20(key, in). `out` may alias
// `key` or `in`.
KILN_HD inline void threefry2x32(const uint32_t key[2], const uint32_t in[2], uint32_t out[2]) {
  const uint32_t k0 = key[0], k1 = key[1], k2 = k0 ^ k1 ^ 0x1BD11BDAu;
  uint32_t x0 = in[0] + k0, x1 = in[1] + k1;
  // Five groups of four rounds; after group g the key schedule's words
  // (g + 1) % 3 and (g + 2) % 3 are injected, the latter plus g + 1.
  mix4(x0, x1, 13, 15, 26, 6);
  x0 += k1;
  x1 += k2 + 1u;
  mix4(x0, x1, 17, 29, 16, 24);
  x0 += k2;
  x1 += k0 + 2u;
  mix4(x0, x1, 13, 15, 26, 6);
  x0 += k0;
  x1 += k1 + 3u;
  mix4(x0, x1, 17, 29, 16, 24);
  x0 += k1;
  x1 += k2 + 4u;
  mix4(x0, x1, 13, 15, 26, 6);
  x0 += k2;
  x1 += k0 + 5u;
  out[0] = x0;
  out[1] = x1;
}

// The key of block (domain, data) under `key` (split's and fold_in's).
KILN_HD inline void derive(const uint32_t key[2], uint32_t domain, uint32_t data, uint32_t out[2]) {
  const uint32_t in[2] = {domain, data};
  threefry2x32(key, in, out);
}

// The key a draw's blocks are enciphered under, from the user's key (folded
// with fold_data first when `fold`, as RandomAttrs says).
KILN_HD inline void draw_key(const uint32_t key[2], bool fold, uint32_t fold_data,
                             uint32_t out[2]) {
  uint32_t k[2] = {key[0], key[1]};
  if (fold) derive(k, kFoldIn, fold_data, k);
  derive(k, kDraw, 0, out);
}

// The bits of an i32[2] key array as a key.
KILN_HD inline void key_of_bits(const int32_t bits[2], uint32_t out[2]) {
  out[0] = static_cast<uint32_t>(bits[0]);
  out[1] = static_cast<uint32_t>(bits[1]);
}

// A draw's parameters apart from its key (left 0): truncated normal keeps erf
// of its bounds over sqrt(2) in a and b and the bounds in lower and upper.
KILN_HD inline random::DrawSpec draw_params(RandomKind kind, double a, double b) {
  random::DrawSpec s{{0, 0}, kind, a, b};
  if (kind == RandomKind::TruncatedNormal) {
    s.a = std::erf(a / std::sqrt(2.0));
    s.b = std::erf(b / std::sqrt(2.0));
    s.lower = a;
    s.upper = b;
  }
  return s;
}

// Inverse error function: Giles' approximation refined by two Newton steps.
KILN_HD inline double erfinv(double y) {
  double w = -std::log((1.0 - y) * (1.0 + y)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = std::fma(p, w, 3.43273939e-07);
    p = std::fma(p, w, -3.5233877e-06);
    p = std::fma(p, w, -4.39150654e-06);
    p = std::fma(p, w, 0.00021858087);
    p = std::fma(p, w, -0.00125372503);
    p = std::fma(p, w, -0.00417768164);
    p = std::fma(p, w, 0.246640727);
    p = std::fma(p, w, 1.50140941);
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257;
    p = std::fma(p, w, 0.000100950558);
    p = std::fma(p, w, 0.00134934322);
    p = std::fma(p, w, -0.00367342844);
    p = std::fma(p, w, 0.00573950773);
    p = std::fma(p, w, -0.0076224613);
    p = std::fma(p, w, 0.00943887047);
    p = std::fma(p, w, 1.00167406);
    p = std::fma(p, w, 2.83297682);
  }
  double x = p * y;
  for (int i = 0; i < 2; ++i) x -= (std::erf(x) - y) / (1.1283791670955126 * std::exp(-x * x));
  return x;
}

inline constexpr double kTwoPi = 2 * 3.14159265358979323846;

// The draws whose elements take a variable number of blocks (gamma's
// rejections, randint's): element e has a stream of its own, the blocks
// (n, 0) for n = 0, 1, ... under the key derived from the draw key with
// (kStream, e), a counter no fixed-size draw's block reaches below 2^62 elements.
inline constexpr uint32_t kStream = 0x40000000u;

// A uniform double in [0, 1) with 53 bits: block n of a stream.
KILN_HD inline double stream_uniform(const uint32_t key[2], uint32_t n) {
  const uint32_t in[2] = {n, 0};
  uint32_t w[2];
  threefry2x32(key, in, w);
  const uint64_t bits = (static_cast<uint64_t>(w[0]) << 21) ^ (w[1] >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1p-53;
}

// Gamma(a, 1) by Marsaglia and Tsang (2000) from the stream `key`: each try
// takes blocks n, n + 1 (a Box–Muller normal) and n + 2 (the uniform that
// accepts it); a < 1 draws Gamma(a + 1)·U^(1/a), U from the last block.
KILN_HD inline double gamma_stream(const uint32_t key[2], double a) {
  const bool boost = a < 1;
  const double d = (boost ? a + 1 : a) - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (uint32_t n = 0; n < 0xFFFFFFF0u; n += 3) {
    const double u1 = 1.0 - stream_uniform(key, n), u2 = stream_uniform(key, n + 1);
    const double x = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
    double v = std::fma(c, x, 1.0);
    if (v <= 0) continue;
    v = v * v * v;
    const double u = stream_uniform(key, n + 2);
    const double x2 = x * x;
    if (u < 1.0 - 0.0331 * x2 * x2 || std::log(u) < 0.5 * x2 + d * (1.0 - v + std::log(v))) {
      const double g = d * v;
      return boost ? g * std::pow(stream_uniform(key, 0xFFFFFFFFu), 1.0 / a) : g;
    }
  }
  return d;  // not reached: each try is accepted with probability above 0.95
}

// An integer in [low, high) from the stream `key`: 64 bits a block, the top
// partial range rejected so that every value is equally likely.
KILN_HD inline double randint_stream(const uint32_t key[2], double low, double high) {
  const uint64_t span = static_cast<uint64_t>(high - low);
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  for (uint32_t n = 0;; ++n) {
    const uint32_t in[2] = {n, 1};
    uint32_t w[2];
    threefry2x32(key, in, w);
    const uint64_t bits = (static_cast<uint64_t>(w[0]) << 32) | w[1];
    if (bits < limit) return low + static_cast<double>(bits % span);
  }
}

// Elements 2j and 2j + 1 of the draw `s`: block j enciphered under s.key.
KILN_HD inline void draw_block(const random::DrawSpec& s, uint64_t j, double v[2]) {
  const uint32_t ctr[2] = {static_cast<uint32_t>(j >> 32), static_cast<uint32_t>(j)};
  uint32_t w[2];
  threefry2x32(s.key, ctr, w);
  const double u[2] = {(w[0] >> 8) * 0x1p-24, (w[1] >> 8) * 0x1p-24};  // [0, 1)
  switch (s.kind) {
    case RandomKind::Uniform:
      for (int k = 0; k < 2; ++k) v[k] = std::fma(s.b - s.a, u[k], s.a);
      break;
    case RandomKind::Normal: {
      const double r = std::sqrt(-2.0 * std::log(1.0 - u[0]));  // 1 - u in (0, 1]
      v[0] = r * std::cos(kTwoPi * u[1]);
      v[1] = r * std::sin(kTwoPi * u[1]);
      break;
    }
    case RandomKind::TruncatedNormal:
      // Inverse CDF of the normal restricted to [lower, upper]; s.a, s.b hold
      // erf of the bounds over sqrt(2).
      for (int k = 0; k < 2; ++k) {
        const double y = std::fma(u[k] + 0x1p-25, s.b - s.a, s.a);
        v[k] = std::fmin(std::fmax(std::sqrt(2.0) * erfinv(y), s.lower), s.upper);
      }
      break;
    case RandomKind::Bernoulli:
      for (int k = 0; k < 2; ++k) v[k] = u[k] < s.a ? 1.0 : 0.0;
      break;
    case RandomKind::Gamma:
    case RandomKind::Randint:
      for (int k = 0; k < 2; ++k) {
        uint32_t e[2];
        derive(s.key, kStream | static_cast<uint32_t>(j >> 31), static_cast<uint32_t>(2 * j + k),
               e);
        v[k] = s.kind == RandomKind::Gamma ? gamma_stream(e, s.a) : randint_stream(e, s.a, s.b);
      }
      break;
  }
}

}  // namespace kiln::threefry
