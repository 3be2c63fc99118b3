// kiln ops: the math of every elementwise primitive that has a scalar
// function (kScalar in ops/op_facts.h), written once: scalar<op>(x, y). Three
// compilers read this file — the host's (the cpu and ref kernels), nvcc (the
// CUDA backend's kernels) and NVRTC (the CUDA kernels kiln generates for
// fused programs at run time, which get this text as their prelude, after a
// definition of Op) — so it includes nothing under NVRTC and reaches the
// standard math functions through the m:: shims below. Float math runs in
// the type it is given: f32 uses vectorizable approximations (exp within ~2
// ulp, erf within 1.5e-7 absolute), f64 the exact library functions.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstring>
#include <type_traits>

#include "ops/op_facts.h"
#endif

namespace kiln {

namespace m {
#ifdef __CUDACC_RTC__
// NVRTC: CUDA's math functions are built in; no standard library. m::f is
// CUDA's ff for float (fabsf, erff, ...) and ::f for double.
#define KILN_MATH1(name)                 \
  KILN_HD inline float name(float x) {   \
    return name##f(x);                   \
  }                                      \
  KILN_HD inline double name(double x) { \
    return ::name(x);                    \
  }
#define KILN_MATH2(name)                           \
  KILN_HD inline float name(float x, float y) {    \
    return name##f(x, y);                          \
  }                                                \
  KILN_HD inline double name(double x, double y) { \
    return ::name(x, y);                           \
  }
// clang-format off
KILN_MATH1(fabs) KILN_MATH1(erf) KILN_MATH1(exp) KILN_MATH1(log) KILN_MATH1(sqrt)
KILN_MATH1(tanh) KILN_MATH1(sin) KILN_MATH1(cos) KILN_MATH1(log1p) KILN_MATH1(expm1)
KILN_MATH1(floor) KILN_MATH1(rint) KILN_MATH2(copysign) KILN_MATH2(pow)
KILN_HD inline float fma(float x, float y, float z) { return fmaf(x, y, z); }
// clang-format on
#undef KILN_MATH1
#undef KILN_MATH2
            template <typename A, typename B>
            inline constexpr bool is_same_v = false;
template <typename A>
inline constexpr bool is_same_v<A, A> = true;
KILN_HD inline float float_from_bits(int bits) { return __int_as_float(bits); }
KILN_HD inline unsigned float_bits(float f) {
  return static_cast<unsigned>(__float_as_int(f));
}
#else
using std::copysign, std::erf, std::exp, std::fabs, std::fma, std::log, std::sqrt, std::tanh;
using std::cos, std::expm1, std::floor, std::log1p, std::pow, std::rint, std::sin;
using std::is_same_v;
KILN_HD inline float float_from_bits(int bits) {
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
KILN_HD inline unsigned float_bits(float f) {
  unsigned bits;
  memcpy(&bits, &f, 4);
  return bits;
}
#endif
}  // namespace m

// ---- float math that the compiler can vectorize ----
// Results below FLT_MIN (x < ln FLT_MIN = -87.3365) are flushed to 0, so that
// exp(-inf) is 0 (a masked softmax entry) rather than FLT_MIN; x >= 88.38
// gives inf (2^128: a little early, exp(88.72) is FLT_MAX); NaN stays NaN.
KILN_HD inline float exp_approx(float x0) {
  constexpr float kLnMin = -87.33654f;
  const float x = x0 < kLnMin ? kLnMin : (x0 > 88.5f ? 88.5f : x0);
  // Round to nearest by adding and subtracting 1.5 * 2^23 (vectorizes, unlike
  // nearbyint): t is 1.5 * 2^23 + n exactly, so its bits are 0x4b400000 + n.
  const float t = x * 1.44269504089f + 12582912.0f;
  const float n = t - 12582912.0f;
  float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.1666666716f +
                                                r * (0.04166664928f + r * (0.008333335072f +
                                                                           r * 0.001388888922f)))));
  // 2^n built from t's bits: a float-to-int conversion of n would be undefined
  // for a NaN x (clang's UBSan reports it), and a guard against NaN cost GELU
  // and the attention's softmax 10-25%.
  const float y =
      p * m::float_from_bits(static_cast<int>((m::float_bits(t) - 0x4b400000u + 127u) << 23));
  return x0 < kLnMin ? 0.0f : y;
}

// erf with absolute error below 1.5e-7 (Abramowitz & Stegun 7.1.26).
KILN_HD inline float erf_approx(float x) {
  float ax = m::fabs(x);
  float t = 1.0f / (1.0f + 0.3275911f * ax);
  float y = t * (0.254829592f +
                 t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  float r = 1.0f - y * exp_approx(-ax * ax);
  return m::copysign(r, x);
}

inline constexpr double kSqrt1_2 = 0.70710678118654752440;
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;

// exp(x) for x <= 0 (GELU's exp(-x²/2)): 2^u for u = x·log2(e), as 2^f
// (f = u - n in [-1/2, 1/2], a polynomial of degree 5 fitted for it, 2.4e-7)
// times 2^n from n's bits. u is clamped at -127, where 2^n's bits are 0:
// results below 2^-126.5 are 0 (exp(-inf) = 0); NaN stays NaN. One clamp
// and no selects, where exp_approx takes both ends of the range. Relative
// error below 6.4e-7 for x >= -10 and 4e-6 down to -87 (u's rounding, which
// exp_approx's two-part reduction avoids); GELU's absolute error stays below
// 4.2e-7 and its derivative's 2.7e-7. Every multiply-add is an explicit fma,
// so that the values do not depend on what a compiler contracts (a
// generator of vector code that writes GELU out operation for operation gets
// the same bits; one was tried in fused_jit.cpp and ran no faster than the
// loops compiled from this).
// (exp_nonpositive's two factors: 2^f, and 2^n; their product is the
// result, so that a caller can form 1 + exp(x) in one explicit fma.)
struct ExpParts {
  float p, scale;
};
KILN_HD inline ExpParts exp_nonpositive_parts(float x) {
  float u = x * 1.44269504089f;
  u = u < -127.0f ? -127.0f : u;    // keeps NaN
  const float t = u + 12582912.0f;  // 1.5·2^23 + n exactly, as in exp_approx
  const float n = t - 12582912.0f;
  const float f = u - n;
  float p = m::fma(0.001327645266f, f, 0.009675535373f);
  p = m::fma(p, f, 0.05550713092f);
  p = m::fma(p, f, 0.2402212024f);
  p = m::fma(p, f, 0.6931469440f);
  p = m::fma(p, f, 1.0000001192f);
  return {p, m::float_from_bits(static_cast<int>((m::float_bits(t) - 0x4b400000u + 127u) << 23))};
}
KILN_HD inline float exp_nonpositive(float x) {
  const ExpParts e = exp_nonpositive_parts(x);
  return e.p * e.scale;
}

// erfc(a) for a = |x|/√2 >= 0, and exp(-a²) = exp(-x²/2) beside it:
// erf_approx's formula (Abramowitz & Stegun 7.1.26, absolute error below
// 1.5e-7) with exp_nonpositive.
struct Erfc {
  float w, e;
  KILN_HD explicit Erfc(float a) {
    e = exp_nonpositive(-a * a);
    const float t = 1.0f / m::fma(0.3275911f, a, 1.0f);
    float q = m::fma(1.061405429f, t, -1.453152027f);
    q = m::fma(q, t, 1.421413741f);
    q = m::fma(q, t, -0.284496736f);
    q = m::fma(q, t, 0.254829592f);
    w = q * t * e;
  }
  // Φ(x), the normal distribution function, for x of a = |x|/√2: 1 -
  // erfc(a)/2 for x >= 0 and erfc(a)/2 below (NaN: below).
  KILN_HD float phi(float x) const { return x >= 0.0f ? m::fma(-0.5f, w, 1.0f) : 0.5f * w; }
};

// GELU and its derivative in f32 take Φ(x) from Erfc: no cancellation in the
// left tail (1 + erf(x/√2) lost the digits of small values there), no
// copysign, and a quarter fewer vector operations than erf_approx's form
// with exp_approx (33 against 45 a vector of GELU): bf16 GELU 18% faster
// and its fused backward 9% (the two took a tenth of a bf16 ViT-S step;
// bench/results/2026-12-07-gelu/).
template <typename A>
KILN_HD inline A gelu_exact(A x) {
  if constexpr (m::is_same_v<A, double>) {
    return 0.5 * x * (1.0 + m::erf(x * kSqrt1_2));
  } else {
    return x * Erfc(m::fabs(x) * static_cast<float>(kSqrt1_2)).phi(x);
  }
}
template <typename A>
KILN_HD inline A gelu_exact_grad(A x) {
  if constexpr (m::is_same_v<A, double>) {
    return 0.5 * (1.0 + m::erf(x * kSqrt1_2)) + x * kInvSqrt2Pi * m::exp(-0.5 * x * x);
  } else {
    // Φ(x) + x·φ(x): one exponential serves both.
    const Erfc c(m::fabs(x) * static_cast<float>(kSqrt1_2));
    return m::fma(x * static_cast<float>(kInvSqrt2Pi), c.e, c.phi(x));
  }
}
// GELU's tanh form (GPT-2's gelu_new), u = √(2/π)(x + 0.044715x³):
// 0.5·x·(1 + tanh(u)) = x·σ(2u), and in f32 σ(2u) = 1/(1 + e) for u >= 0
// and e/(1 + e) below, e = exp(-2|u|) from exp_nonpositive: one exponential
// of the cheap kind and one division, no copysign, and no cancellation in
// the left tail (1 + tanh(u) lost the digits of small values there). The
// derivative: σ + 2x·σ(1 - σ)·du/dx, 1 - σ(2u) as e/(1 + e) or 1/(1 + e).
// Every multiply-add an explicit fma, as exp_nonpositive's. f64 takes the
// library's tanh.
struct SigmoidOf2u {
  float s, c;  // σ(2u) and 1 - σ(2u), each without cancellation
  KILN_HD explicit SigmoidOf2u(float u) {
    const ExpParts x = exp_nonpositive_parts(-2.0f * m::fabs(u));
    const float e = x.p * x.scale, r = 1.0f / m::fma(x.p, x.scale, 1.0f), er = e * r;
    const bool up = u >= 0.0f;  // NaN: below (e·r is NaN)
    s = up ? r : er;
    c = up ? er : r;
  }
};
template <typename A>
KILN_HD inline A gelu_tanh(A x) {
  if constexpr (m::is_same_v<A, double>) {
    const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + m::tanh(u));
  } else {
    const float u = static_cast<float>(kSqrt2OverPi) * m::fma(0.044715f * (x * x), x, x);
    return x * SigmoidOf2u(u).s;
  }
}
template <typename A>
KILN_HD inline A gelu_tanh_grad(A x) {
  if constexpr (m::is_same_v<A, double>) {
    const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
    const double du = kSqrt2OverPi * (1.0 + 3 * 0.044715 * x * x);
    const double t = m::tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
  } else {
    const float x2 = x * x;
    const float u = static_cast<float>(kSqrt2OverPi) * m::fma(0.044715f * x2, x, x);
    const float du = static_cast<float>(kSqrt2OverPi) * m::fma(0.134145f, x2, 1.0f);
    const SigmoidOf2u g(u);
    return m::fma(2.0f * x * g.s, g.c * du, g.s);
  }
}
template <typename A>
KILN_HD inline A fast_exp(A x) {
  if constexpr (m::is_same_v<A, double>)
    return m::exp(x);
  else
    return exp_approx(x);
}

// Argsort's order: whether x sorts before y. Ascending, NaN after every
// number (NumPy's order); descending, the reverse (largest and NaN first).
// Equal values, and two NaNs, are neither: the kernels keep their positions'
// order (a stable sort).
template <typename A>
KILN_HD inline bool sorts_before(A x, A y, bool descending) {
  if (descending) {
    const A t = x;
    x = y;
    y = t;
  }
  return x == x && (y != y || x < y);
}

template <Op>
inline constexpr bool dependent_false = false;

// The value of elementwise op `op` at x (and y, for a binary or comparison
// op; a unary one, op_kind Unary, ignores it). A comparison returns bool; every other op returns A.
template <Op op, typename A>
KILN_HD inline auto scalar(A x, [[maybe_unused]] A y = A()) {
#ifndef __CUDACC_RTC__
  static_assert(op_has(op, kScalar), "scalar<op>: op has no scalar function (ops/op_facts.h)");
#endif
  if constexpr (op == Op::Neg) return A(-x);
  else if constexpr (op == Op::Exp) return fast_exp(x);
  else if constexpr (op == Op::Log) return A(m::log(x));
  else if constexpr (op == Op::Sqrt) return A(m::sqrt(x));
  else if constexpr (op == Op::Rsqrt) return A(A(1) / m::sqrt(x));
  else if constexpr (op == Op::Tanh) return A(m::tanh(x));
  else if constexpr (op == Op::Erf) return A(m::erf(x));
  else if constexpr (op == Op::Gelu) return gelu_exact(x);
  else if constexpr (op == Op::GeluTanh) return gelu_tanh(x);
  else if constexpr (op == Op::GeluGrad) return gelu_exact_grad(x);
  else if constexpr (op == Op::GeluTanhGrad) return gelu_tanh_grad(x);
  else if constexpr (op == Op::Relu) return x > A(0) ? x : A(0);
  else if constexpr (op == Op::Abs) return x < A(0) ? A(-x) : x;
  else if constexpr (op == Op::Sin)
    return A(m::sin(x));
  else if constexpr (op == Op::Cos)
    return A(m::cos(x));
  else if constexpr (op == Op::Log1p)
    return A(m::log1p(x));
  else if constexpr (op == Op::Expm1)
    return A(m::expm1(x));
  else if constexpr (op == Op::Sign)
    return x > A(0) ? A(1) : (x < A(0) ? A(-1) : x);  // keeps 0, -0, NaN
  else if constexpr (op == Op::Floor)
    return A(m::floor(x));
  else if constexpr (op == Op::Round)
    return A(m::rint(x));  // halves to even, as NumPy and JAX
  else if constexpr (op == Op::Add) return A(x + y);
  else if constexpr (op == Op::Sub) return A(x - y);
  else if constexpr (op == Op::Mul) return A(x * y);
  else if constexpr (op == Op::Div) return A(x / y);
  else if constexpr (op == Op::Maximum) return x > y ? x : y;
  else if constexpr (op == Op::Minimum) return x < y ? x : y;
  else if constexpr (op == Op::ReluGrad)
    return y > A(0) ? x : A(0);  // NaN y: 0
  else if constexpr (op == Op::Pow) {
    if constexpr (m::is_same_v<A, float> || m::is_same_v<A, double>)
      return A(m::pow(x, y));
    else
      return A(m::pow(static_cast<double>(x), static_cast<double>(y)));  // integers
  } else if constexpr (op == Op::Equal)
    return x == y;
  else if constexpr (op == Op::NotEqual) return x != y;
  else if constexpr (op == Op::Less) return x < y;
  else if constexpr (op == Op::LessEqual) return x <= y;
  else if constexpr (op == Op::Greater) return x > y;
  else if constexpr (op == Op::GreaterEqual) return x >= y;
  else static_assert(dependent_false<op>, "scalar<op>: kScalar op without a function here");
}

}  // namespace kiln
