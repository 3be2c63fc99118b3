// kiln ops: the scalar function of every elementwise primitive that has one
// (kScalar in ops/op_facts.h), written once. The CPU's eager kernels, its
// fused elementwise and reduction kernels and its GEMM epilogues all compute
// an op through scalar<op>(x, y); so does the reference backend (in f64), and
// so will any other backend whose compiler can run C++. Float math runs in
// the type it is given: f32 uses vectorizable approximations (exp within
// ~2 ulp, erf within 1.5e-7 absolute), f64 the exact library functions.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kiln/error.h"
#include "ops/op_facts.h"

namespace kiln {

// ---- float math that the compiler can vectorize ----
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.5f ? 88.5f : x);
  // Round to nearest by adding and subtracting 1.5 * 2^23 (vectorizes, unlike nearbyint).
  float n = (x * 1.44269504089f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.1666666716f +
                                                r * (0.04166664928f + r * (0.008333335072f +
                                                                           r * 0.001388888922f)))));
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// erf with absolute error below 1.5e-7 (Abramowitz & Stegun 7.1.26).
inline float erf_approx(float x) {
  float ax = std::fabs(x);
  float t = 1.0f / (1.0f + 0.3275911f * ax);
  float y = t * (0.254829592f +
                 t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  float r = 1.0f - y * exp_approx(-ax * ax);
  return std::copysign(r, x);
}

inline constexpr double kSqrt1_2 = 0.70710678118654752440;
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;

template <typename A>
inline A gelu_exact(A x) {
  if constexpr (std::is_same_v<A, double>)
    return 0.5 * x * (1.0 + std::erf(x * kSqrt1_2));
  else
    return 0.5f * x * (1.0f + erf_approx(x * static_cast<float>(kSqrt1_2)));
}
template <typename A>
inline A gelu_exact_grad(A x) {
  if constexpr (std::is_same_v<A, double>)
    return 0.5 * (1.0 + std::erf(x * kSqrt1_2)) + x * kInvSqrt2Pi * std::exp(-0.5 * x * x);
  else {
    // erf_approx(x/√2) written out, so that its exp(-x²/2) also serves the
    // density term: one exponential instead of two.
    const float ax = std::fabs(x * static_cast<float>(kSqrt1_2));
    const float e = exp_approx(-ax * ax);
    const float t = 1.0f / (1.0f + 0.3275911f * ax);
    const float y =
        t * (0.254829592f +
             t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    const float erf = std::copysign(1.0f - y * e, x);
    return 0.5f * (1.0f + erf) + x * static_cast<float>(kInvSqrt2Pi) * e;
  }
}
template <typename A>
inline A gelu_tanh(A x) {
  A u = A(kSqrt2OverPi) * (x + A(0.044715) * x * x * x);
  return A(0.5) * x * (A(1) + std::tanh(u));
}
template <typename A>
inline A gelu_tanh_grad(A x) {
  A u = A(kSqrt2OverPi) * (x + A(0.044715) * x * x * x);
  A t = std::tanh(u);
  A du = A(kSqrt2OverPi) * (A(1) + A(3 * 0.044715) * x * x);
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * du;
}
template <typename A>
inline A fast_exp(A x) {
  if constexpr (std::is_same_v<A, double>)
    return std::exp(x);
  else
    return exp_approx(x);
}

template <Op>
inline constexpr bool dependent_false = false;

// The value of elementwise op `op` at x (and y, for a binary or comparison
// op; a unary one, op_kind Unary, ignores it). A comparison returns bool; every other op returns A.
template <Op op, typename A>
inline auto scalar(A x, [[maybe_unused]] A y = A()) {
  static_assert(op_has(op, kScalar), "scalar<op>: op has no scalar function (ops/op_facts.h)");
  if constexpr (op == Op::Neg) return A(-x);
  else if constexpr (op == Op::Exp) return fast_exp(x);
  else if constexpr (op == Op::Log) return A(std::log(x));
  else if constexpr (op == Op::Sqrt) return A(std::sqrt(x));
  else if constexpr (op == Op::Rsqrt) return A(A(1) / std::sqrt(x));
  else if constexpr (op == Op::Tanh) return A(std::tanh(x));
  else if constexpr (op == Op::Erf) return A(std::erf(x));
  else if constexpr (op == Op::Gelu) return gelu_exact(x);
  else if constexpr (op == Op::GeluTanh) return gelu_tanh(x);
  else if constexpr (op == Op::GeluGrad) return gelu_exact_grad(x);
  else if constexpr (op == Op::GeluTanhGrad) return gelu_tanh_grad(x);
  else if constexpr (op == Op::Relu) return x > A(0) ? x : A(0);
  else if constexpr (op == Op::Abs) return x < A(0) ? A(-x) : x;
  else if constexpr (op == Op::Add) return A(x + y);
  else if constexpr (op == Op::Sub) return A(x - y);
  else if constexpr (op == Op::Mul) return A(x * y);
  else if constexpr (op == Op::Div) return A(x / y);
  else if constexpr (op == Op::Maximum) return x > y ? x : y;
  else if constexpr (op == Op::Minimum) return x < y ? x : y;
  else if constexpr (op == Op::Equal) return x == y;
  else if constexpr (op == Op::NotEqual) return x != y;
  else if constexpr (op == Op::Less) return x < y;
  else if constexpr (op == Op::LessEqual) return x <= y;
  else if constexpr (op == Op::Greater) return x > y;
  else if constexpr (op == Op::GreaterEqual) return x >= y;
  else static_assert(dependent_false<op>, "scalar<op>: kScalar op without a function here");
}

namespace scalar_detail {
template <int I, typename F>
inline void visit(Op op, const char* who, F& f) {
  if constexpr (I < kOpCount) {
    constexpr Op o = static_cast<Op>(I);
    if constexpr (op_has(o, kScalar)) {
      if (op == o) return f(std::integral_constant<Op, o>{});
    }
    return visit<I + 1>(op, who, f);
  } else {
    fail(who, std::string(op_name(op)) + " has no scalar function (ops/op_facts.h)");
  }
}
}  // namespace scalar_detail

// Calls f(std::integral_constant<Op, op>{}) for a run-time `op` with a scalar
// function, so that a kernel's inner loop is compiled once per op:
//   visit_scalar(op, "add", [&](auto o) { ... scalar<decltype(o)::value>(x, y) ... });
template <typename F>
inline void visit_scalar(Op op, const char* who, F&& f) {
  scalar_detail::visit<0>(op, who, f);
}

}  // namespace kiln
