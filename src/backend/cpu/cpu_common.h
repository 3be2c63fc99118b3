// kiln cpu backend: dtype dispatch, threading and vectorizable math.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kiln/array.h"
#include "ops/dispatch.h"
#include "ops/indices.h"
#include "ops/primitive.h"
#include "ops/scalar.h"

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
// f32 -> bf16 bits, rounded to nearest even, NaN kept quiet: bf16(float)'s
// result, written without a branch so that loops over it vectorize.
inline uint16_t narrow_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

// bf16 bits -> f32 (exact).
inline float widen_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T, typename A>
inline T st(A v) {
  if constexpr (std::is_same_v<T, bf16>) {
    bf16 r;
    r.bits = narrow_bf16(static_cast<float>(v));
    return r;
  } else {
    return static_cast<T>(v);
  }
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

// y [outer, rows, cols] = x [outer, cols, rows] with its two inner axes
// swapped, by 32 x 32 tiles so that both sides stay in cache lines.
template <typename T>
void transpose_tiles(const T* x, int64_t outer, int64_t rows, int64_t cols, T* y) {
  constexpr int64_t B = 32;
  const int64_t tr = (rows + B - 1) / B, tc = (cols + B - 1) / B;
  parallel_for(outer * tr * tc, B * B, [&](int64_t b, int64_t e) {
    for (int64_t job = b; job < e; ++job) {
      const int64_t o = job / (tr * tc), t = job % (tr * tc);
      const int64_t i0 = (t / tc) * B, j0 = (t % tc) * B;
      const T* xs = x + o * rows * cols;
      T* ys = y + o * rows * cols;
      for (int64_t i = i0; i < std::min(rows, i0 + B); ++i)
        for (int64_t j = j0; j < std::min(cols, j0 + B); ++j) ys[i * cols + j] = xs[j * rows + i];
    }
  });
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

// Column reductions of one slice, [1, reduced, inner] with at most 4096
// columns and 1024 rows or more (a bias gradient, BatchNorm's per-channel sums
// over a channels-last activation), cut the reduced axis into `count`
// segments of `rows` rows, fixed by the shape alone (never by the thread
// count): each segment is summed in order into its own row of partial sums,
// a thread reading long runs of whole rows (which the hardware prefetchers
// follow: a thread reading half of each row of 256 floats ran at an eighth of
// the memory's speed), then the partials are added in segment order. The Sum
// kernel and the fused reductions share it, so that fusing does not change a
// bit. count = 0: not segmented.
struct RowSegments {
  int64_t count = 0, rows = 0;
};
inline RowSegments row_segments(int64_t outer, int64_t reduced, int64_t inner) {
  if (outer != 1 || inner > 4096 || reduced < 1024) return {};
  const int64_t want = std::min<int64_t>(64, reduced / 16);
  const int64_t rows = (reduced + want - 1) / want;
  return {(reduced + rows - 1) / rows, rows};
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
