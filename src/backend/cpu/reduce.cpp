// kiln cpu backend: reductions (sum, max, argmax) over any axes, and the
// running sum (cumsum) and the sorting permutation (argsort) along one axis.
//
// The input is viewed as [outer, reduced, inner] after merging adjacent axes
// of the same kind; reductions over several separated groups first move the
// reduced axes to the end with the transpose kernel.
#include <algorithm>
#include <limits>
#include <numeric>

#include "backend/cpu/kernels.h"
#include "backend/views.h"
#include "kiln/ops.h"

namespace kiln::cpu {
namespace {

template <typename T>
using sum_acc_t = std::conditional_t<std::is_integral_v<T>, int64_t, acc_t<T>>;

template <typename T, bool IsMax>
void reduce_typed(const T* x, T* y, const ReduceView& v) {
  using A = std::conditional_t<IsMax, acc_t<T>, sum_acc_t<T>>;
  // Max propagates NaN (as NumPy, JAX and PyTorch) and starts from -inf for
  // floats, so that a slice of -infs gives -inf.
  auto combine = [](A a, A b) { return IsMax ? ((b > a || b != b) ? b : a) : a + b; };
  const A init = !IsMax                                    ? A(0)
                 : std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                         : std::numeric_limits<A>::lowest();
  if (v.inner == 1) {
    // Row reduction: several accumulators keep the vector units busy.
    parallel_for(v.outer, v.reduced, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        const T* row = x + o * v.reduced;
        A acc[8];
        for (auto& a : acc) a = init;
        int64_t r = 0;
        for (; r + 8 <= v.reduced; r += 8)
          for (int k = 0; k < 8; ++k) acc[k] = combine(acc[k], static_cast<A>(ld(row[r + k])));
        for (; r < v.reduced; ++r) acc[0] = combine(acc[0], static_cast<A>(ld(row[r])));
        A total = init;
        for (auto a : acc) total = combine(total, a);
        y[o] = st<T>(total);
      }
    });
    return;
  }
  if (const RowSegments seg = row_segments(v.outer, v.reduced, v.inner); seg.count) {
    std::vector<A> partial(static_cast<size_t>(seg.count * v.inner));
    parallel_for(seg.count, seg.rows * v.inner, [&](int64_t b, int64_t e) {
      for (int64_t s = b; s < e; ++s) {
        A* acc = partial.data() + s * v.inner;
        std::fill_n(acc, v.inner, init);
        const int64_t r1 = std::min(v.reduced, (s + 1) * seg.rows);
        for (int64_t r = s * seg.rows; r < r1; ++r) {
          const T* row = x + r * v.inner;
#pragma omp simd
          for (int64_t i = 0; i < v.inner; ++i)
            acc[i] = combine(acc[i], static_cast<A>(ld(row[i])));
        }
      }
    });
    for (int64_t i = 0; i < v.inner; ++i) {
      A total = init;
      for (int64_t s = 0; s < seg.count; ++s) total = combine(total, partial[s * v.inner + i]);
      y[i] = st<T>(total);
    }
    return;
  }
  // Column reduction: accumulate whole inner rows, vectorized over inner, a
  // block of columns per thread where there is one row of outputs (a long
  // piece of each row, which the hardware prefetchers follow; fused.cpp's
  // column sums likewise).
  constexpr int64_t kTile = 4096;
  const int64_t tile = column_block(v.outer, v.inner, kTile);
  int64_t tiles = (v.inner + tile - 1) / tile;
  parallel_for(v.outer * tiles, v.reduced * tile, [&](int64_t b, int64_t e) {
    A acc[kTile];
    for (int64_t job = b; job < e; ++job) {
      int64_t o = job / tiles, i0 = (job % tiles) * tile;
      int64_t n = std::min(tile, v.inner - i0);
      for (int64_t i = 0; i < n; ++i) acc[i] = init;
      for (int64_t r = 0; r < v.reduced; ++r) {
        const T* row = x + (o * v.reduced + r) * v.inner + i0;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) acc[i] = combine(acc[i], static_cast<A>(ld(row[i])));
      }
      T* dst = y + o * v.inner + i0;
      for (int64_t i = 0; i < n; ++i) dst[i] = st<T>(acc[i]);
    }
  });
}

// The index of a row's largest value: the first of equal ones, or the first
// NaN (as NumPy). A block of 64 values at a time: the block's max and
// whether it holds a NaN vectorize, and only a block with a NaN or a larger
// value than all before it is searched for the index (a language model's
// 50257 logits: 3.5 -> 26 GB/s in f32, 2.8 -> 18 in bf16, on a Xeon with
// AVX-512). clang starts an OpenMP max reduction from the lowest finite
// float, above -inf: a block of -infs after a best of -inf gives that
// value, which the search then does not find in the block (nothing there
// is larger than the best).
template <typename T>
int64_t row_argmax(const T* row, int64_t n) {
  using A = acc_t<T>;
  constexpr int64_t kBlock = 64;
  A best = ld(row[0]);
  int64_t arg = 0;
  if (best != best) return 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    A m = best;
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t r = b; r < e; ++r) {
      const A v = ld(row[r]);
      m = v > m ? v : m;
      nan |= v != v;
    }
    if (nan) {
      for (int64_t r = b; r < e; ++r)
        if (ld(row[r]) != ld(row[r])) return r;
    }
    if (m > best)
      for (int64_t r = b; r < e; ++r)
        if (ld(row[r]) == m) {
          best = m, arg = r;
          break;
        }
  }
  return arg;
}

// Moves the reduced axes last (materialized) and reduces rows.
Array reduced_last(const Array& x, const std::vector<int>& axes) {
  std::vector<int> perm;
  for (size_t i = 0; i < x.ndim(); ++i)
    if (!std::binary_search(axes.begin(), axes.end(), static_cast<int>(i)))
      perm.push_back(static_cast<int>(i));
  for (int a : axes) perm.push_back(a);
  ExecState saved = exec_state();
  exec_state() = ExecState{};  // an eager helper inside a kernel
  Array t = transpose(x, perm);
  exec_state() = saved;
  return t;
}

void reduce_kernel(const KernelContext&, const Primitive& p,
                   const std::vector<Array>& in, ArrayNode& out) {
  const auto& attrs = p.attrs<ReduceAttrs>();
  Array x = in[0];
  ReduceView v;
  if (!reduce_view(x.shape(), attrs.axes, v)) {
    x = reduced_last(x, attrs.axes);
    v = {};
    std::vector<int> tail;
    for (size_t i = x.ndim() - attrs.axes.size(); i < x.ndim(); ++i) tail.push_back(i);
    reduce_view(x.shape(), tail, v);
  }
  if (p.op() == Op::Argmax) {
    dispatch_numeric(x.dtype(), p.name(), [&](auto t) {
      using T = decltype(t);
      const T* xs = x.data<T>();
      int32_t* y = static_cast<int32_t*>(alloc_output(out));
      if (v.inner == 1) {
        parallel_for(v.outer, v.reduced, [&](int64_t b, int64_t e) {
          for (int64_t o = b; o < e; ++o)
            y[o] = static_cast<int32_t>(row_argmax(xs + o * v.reduced, v.reduced));
        });
        return;
      }
      parallel_for(v.outer * v.inner, v.reduced, [&](int64_t b, int64_t e) {
        for (int64_t job = b; job < e; ++job) {
          int64_t o = job / v.inner, i = job % v.inner;
          const T* base = xs + o * v.reduced * v.inner + i;
          auto best = ld(base[0]);
          int32_t arg = 0;
          for (int64_t r = 1; r < v.reduced; ++r) {
            auto val = ld(base[r * v.inner]);
            if (val > best || (val != val && best == best)) {
              best = val;
              arg = static_cast<int32_t>(r);
            }
          }
          y[job] = arg;
        }
      });
    });
    return;
  }
  dispatch_numeric(x.dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    T* y = static_cast<T*>(alloc_output(out));
    if (p.op() == Op::Max)
      reduce_typed<T, true>(x.data<T>(), y, v);
    else
      reduce_typed<T, false>(x.data<T>(), y, v);
  });
}

// Cumsum: the input as [outer, n, inner] around the axis; each outer slice
// runs its n rows in order (reversed: from the last), keeping the inner
// sums in the accumulation type (f32 for bf16), each stored as it goes.
void cumsum_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                   ArrayNode& out) {
  const auto& a = p.attrs<ScanAttrs>();
  const ReduceView v = axis_view(in[0].shape(), a.axis);
  const int64_t outer = v.outer, n = v.reduced, inner = v.inner;
  dispatch_numeric(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    const T* x = in[0].data<T>();
    T* y = static_cast<T*>(alloc_output(out));
    parallel_for(outer, 1, [&](int64_t b, int64_t e) {
      std::vector<A> acc(inner);
      for (int64_t o = b; o < e; ++o) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t k = 0; k < n; ++k) {
          const int64_t r = (a.reverse ? n - 1 - k : k) + o * n;
          const T* xr = x + r * inner;
          T* yr = y + r * inner;
#pragma omp simd
          for (int64_t j = 0; j < inner; ++j) yr[j] = st<T>(acc[j] += ld(xr[j]));
        }
      }
    });
  });
}

// Argsort: lines of the [outer, n, inner] view around the axis, in parallel;
// each is copied out (widened: f32 for bf16), its positions stable-sorted by
// sorts_before (ops/scalar_math.h) and stored as i32.
void argsort_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                    ArrayNode& out) {
  const auto& a = p.attrs<SortAttrs>();
  const ReduceView v = axis_view(in[0].shape(), a.axis);
  const int64_t outer = v.outer, n = v.reduced, inner = v.inner;
  int32_t* y = static_cast<int32_t*>(alloc_output(out));
  dispatch_numeric(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    const T* x = in[0].data<T>();
    parallel_for(outer * inner, 8 * n, [&](int64_t b, int64_t e) {
      std::vector<A> v(n);
      std::vector<int32_t> idx(n);
      for (int64_t line = b; line < e; ++line) {
        const int64_t base = line / inner * n * inner + line % inner;
        for (int64_t k = 0; k < n; ++k) v[k] = ld(x[base + k * inner]);
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int32_t l, int32_t r) {
          return sorts_before(v[l], v[r], a.descending);
        });
        for (int64_t k = 0; k < n; ++k) y[base + k * inner] = idx[k];
      }
    });
  });
}

}  // namespace

void register_reduce(KernelTable& t) {
  for (Op op : {Op::Sum, Op::Max, Op::Argmax}) t.kernels[static_cast<int>(op)] = reduce_kernel;
  t.kernels[static_cast<int>(Op::Cumsum)] = cumsum_kernel;
  t.kernels[static_cast<int>(Op::Argsort)] = argsort_kernel;
}

}  // namespace kiln::cpu
