// kiln cpu backend: dtype dispatch, threading and vectorizable math.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kiln/array.h"
#include "kiln/primitive.h"
#include "ops/dispatch.h"

namespace kiln::cpu {

// Below this many elements a kernel runs on one thread: the fork/join of an
// OpenMP region costs more than it saves.
inline constexpr int64_t kParallelGrain = 32768;

// Float types compute in float, except f64.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double,
                                 std::conditional_t<std::is_same_v<T, bf16>, float, T>>;

template <typename T>
inline acc_t<T> ld(const T& v) {
  return static_cast<acc_t<T>>(v);
}
template <typename T, typename A>
inline T st(A v) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

template <typename F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::bf16: return f(bf16{});
    default: fail(op, std::string("no cpu kernel for dtype ") + name_of(dt));
  }
}

template <typename F>
void dispatch_numeric(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::bf16: return f(bf16{});
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    default: fail(op, std::string("no cpu kernel for dtype ") + name_of(dt));
  }
}

template <typename F>
void dispatch_all(DType dt, const char* op, F&& f) {
  if (dt == DType::bool_) return f(bool{});
  dispatch_numeric(dt, op, std::forward<F>(f));
}

template <typename F>
void dispatch_int(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    default: fail(op, std::string("indices must be i32 or i64, got ") + name_of(dt));
  }
}

// Reads integer indices (i32 or i64) as int64. Each must lie in [-dim, dim)
// when negative ones wrap (as NumPy's), else in [0, dim); the error names the
// op, the value and its position.
std::vector<int64_t> read_indices(const Array& idx, int64_t dim, bool wrap, const char* op,
                                  const char* what);

// Splits [0, n) into one contiguous range per thread and calls f(begin, end).
template <typename F>
void parallel_for(int64_t n, int64_t cost_per_item, F&& f) {
  if (n <= 0) return;
  if (n * cost_per_item < kParallelGrain || omp_get_max_threads() == 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    if (begin < end) f(begin, end);
  }
}

// The width of the column blocks a column reduction over [outer, reduced,
// inner] gives each job: at most `widest`; with one outer slice (a bias
// gradient) the columns are cut into a multiple of the thread count of equal
// blocks (multiples of 16), so that no thread idles while another sums. The
// block width never changes the order in which a column is summed.
inline int64_t column_block(int64_t outer, int64_t inner, int64_t widest) {
  if (outer != 1) return widest;
  const int64_t nt = omp_get_max_threads();
  const int64_t blocks = nt * ((inner + widest * nt - 1) / (widest * nt));
  const int64_t width = ((inner + blocks - 1) / blocks + 15) / 16 * 16;
  return std::clamp<int64_t>(width, 16, widest);
}

// ---- float math that the compiler can vectorize (within ~2 ulp) ----
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

// ---- strided iteration ----
// Collapsed view of an output shape and the element strides of each operand
// (0 along broadcast axes). Adjacent axes merge where every operand is
// contiguous across them.
struct StridedView {
  std::vector<int64_t> shape;
  std::vector<std::vector<int64_t>> strides;  // [operand][axis]
};
StridedView make_broadcast_view(const Shape& out, const std::vector<Shape>& inputs);
StridedView collapse(StridedView v);

// Calls f(offsets, inner_count, inner_strides) over contiguous output ranges,
// split across threads. offsets[k] is operand k's element offset; operand 0 is
// the output (stride 1 along the innermost axis).
template <int N, typename F>
void for_each_strided(const StridedView& v, int64_t cost, F&& f) {
  int64_t total = 1;
  for (auto d : v.shape) total *= d;
  if (total == 0) return;
  int r = static_cast<int>(v.shape.size());
  int64_t inner = r ? v.shape[r - 1] : 1;
  int64_t inner_stride[N];
  for (int k = 0; k < N; ++k) inner_stride[k] = r ? v.strides[k][r - 1] : 0;
  parallel_for(total, cost, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(r ? r : 1, 0);
    int64_t rem = begin;
    for (int d = r - 1; d >= 0; --d) {
      idx[d] = rem % v.shape[d];
      rem /= v.shape[d];
    }
    int64_t off[N];
    for (int k = 0; k < N; ++k) {
      off[k] = 0;
      for (int d = 0; d < r; ++d) off[k] += idx[d] * v.strides[k][d];
    }
    int64_t pos = begin;
    while (pos < end) {
      int64_t col = r ? idx[r - 1] : 0;
      int64_t count = std::min(inner - col, end - pos);
      f(off, count, inner_stride);
      pos += count;
      if (pos >= end) break;
      // advance to the start of the next row
      for (int k = 0; k < N; ++k) off[k] += count * inner_stride[k];
      if (r) idx[r - 1] += count;
      for (int d = r - 1; d > 0 && idx[d] == v.shape[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
        for (int k = 0; k < N; ++k) off[k] += v.strides[k][d - 1] - v.shape[d] * v.strides[k][d];
      }
    }
  });
}

}  // namespace kiln::cpu
