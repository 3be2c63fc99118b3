// kiln cpu backend: fused neural-network kernels. Rows are processed whole
// (they fit in cache); statistics are accumulated in f32 (f64 for f64).
#include <limits>

#include "backend/cpu/kernels.h"

namespace kiln::cpu {
namespace {

// Softmax (or log-softmax) of n contiguous values.
template <typename T, bool Log, typename A>
void softmax_row(const T* x, T* y, int64_t n, A* buf) {
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t k = 0; k < n; ++k) buf[k] = ld(x[k]);
#pragma omp simd reduction(max : m)
  for (int64_t k = 0; k < n; ++k) m = buf[k] > m ? buf[k] : m;
  A total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t k = 0; k < n; ++k) {
    A e = fast_exp(buf[k] - m);
    total += e;
    if constexpr (!Log) buf[k] = e;
  }
  if constexpr (Log) {
    A lse = m + std::log(total);
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) y[k] = st<T>(buf[k] - lse);
  } else {
    A inv = A(1) / total;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) y[k] = st<T>(buf[k] * inv);
  }
}

// Softmax and log-softmax along one axis of x viewed as [outer, n, inner];
// a strided axis is gathered into a contiguous row first.
template <typename T, bool Log>
void softmax_typed(const T* x, T* y, int64_t outer, int64_t n, int64_t inner) {
  using A = acc_t<T>;
  parallel_for(outer * inner, n * 8, [&](int64_t b, int64_t e) {
    std::vector<A> buf(n);
    std::vector<T> row_in(inner == 1 ? 0 : n), row_out(inner == 1 ? 0 : n);
    for (int64_t job = b; job < e; ++job) {
      int64_t o = job / inner, i = job % inner;
      const T* xs = x + o * n * inner + i;
      T* ys = y + o * n * inner + i;
      if (inner == 1) {
        softmax_row<T, Log>(xs, ys, n, buf.data());
      } else {
        for (int64_t k = 0; k < n; ++k) row_in[k] = xs[k * inner];
        softmax_row<T, Log>(row_in.data(), row_out.data(), n, buf.data());
        for (int64_t k = 0; k < n; ++k) ys[k * inner] = row_out[k];
      }
    }
  });
}

void softmax_kernel(const KernelContext&, const Primitive& p,
                    const std::vector<Array>& in, ArrayNode& out) {
  int ax = p.attrs<AxisAttrs>().axis;
  const Shape& s = in[0].shape();
  int64_t outer = 1, inner = 1, n = s[ax];
  for (int i = 0; i < ax; ++i) outer *= s[i];
  for (size_t i = ax + 1; i < s.size(); ++i) inner *= s[i];
  dispatch_float(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    T* y = static_cast<T*>(alloc_output(out));
    if (p.op() == Op::LogSoftmax)
      softmax_typed<T, true>(in[0].data<T>(), y, outer, n, inner);
    else
      softmax_typed<T, false>(in[0].data<T>(), y, outer, n, inner);
  });
}

// Mean and 1/sqrt(var + eps) of one row (biased variance, as PyTorch).
template <typename T, typename A>
void row_stats(const T* x, int64_t c, double eps, A& mean, A& rstd) {
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < c; ++k) s += ld(x[k]);
  mean = s / A(c);
  A v = 0;
#pragma omp simd reduction(+ : v)
  for (int64_t k = 0; k < c; ++k) {
    A d = ld(x[k]) - mean;
    v += d * d;
  }
  rstd = A(1) / std::sqrt(v / A(c) + A(eps));
}

// y = (x - mean) * rstd * gamma + beta over the last axis.
void layer_norm_kernel(const KernelContext&, const Primitive& p,
                       const std::vector<Array>& in, ArrayNode& out) {
  double eps = p.attrs<NormAttrs>().eps;
  int64_t c = in[0].shape().back(), rows = c ? in[0].size() / c : 0;
  bool affine = in.size() == 3;
  // The output has the input's dtype, or is bf16 for an f32 input (the
  // compiler folds a following cast into it: bf16 mixed precision's next
  // GEMM operand), each value rounded once from the f32 result.
  if (out.dtype != in[0].dtype() && !(in[0].dtype() == DType::f32 && out.dtype == DType::bf16))
    fail(p.name(), std::string("writes ") + name_of(in[0].dtype()) + " for a " +
                       name_of(in[0].dtype()) + " input, or bf16 for f32, not " +
                       name_of(out.dtype));
  dispatch_float(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    const T* x = in[0].data<T>();
    const T* g = affine ? in[1].data<T>() : nullptr;
    const T* b = affine ? in[2].data<T>() : nullptr;
    void* y = alloc_output(out);
    auto rows_into = [&](auto* yt) {
      using O = std::remove_pointer_t<decltype(yt)>;
      parallel_for(rows, c * 4, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* xs = x + r * c;
          O* ys = yt + r * c;
          A mean, rstd;
          row_stats(xs, c, eps, mean, rstd);
          if (affine) {
#pragma omp simd
            for (int64_t k = 0; k < c; ++k)
              ys[k] = st<O>((ld(xs[k]) - mean) * rstd * ld(g[k]) + ld(b[k]));
          } else {
#pragma omp simd
            for (int64_t k = 0; k < c; ++k) ys[k] = st<O>((ld(xs[k]) - mean) * rstd);
          }
        }
      });
    };
    if (out.dtype == DType::bf16 && !std::is_same_v<T, bf16>)
      rows_into(static_cast<bf16*>(y));
    else
      rows_into(static_cast<T*>(y));
  });
}

// Runs f on dy's data: of the input's type T, or bf16 for an f32 input (the
// compiler folds a widening cast into LayerNorm's backward: bf16 mixed
// precision's GEMMs give dy in bf16), widened as it is read.
template <typename T, typename F>
void with_dy(const Array& dy, const Primitive& p, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    if (dy.dtype() == DType::bf16) return f(dy.data<bf16>());
  }
  if (dy.dtype() != dtype_of<T>::value)
    fail(p.name(), std::string("dy is ") + name_of(dy.dtype()) + ", expected " +
                       name_of(dtype_of<T>::value) + (std::is_same_v<T, float> ? " or bf16" : ""));
  f(dy.data<T>());
}

// dx = rstd * (dŷ - mean(dŷ) - x̂ * mean(dŷ * x̂)), with dŷ = dy * gamma.
// With NormAttrs::residual, the last input r is added: dx + r.
void layer_norm_grad_kernel(const KernelContext&, const Primitive& p,
                            const std::vector<Array>& in, ArrayNode& out) {
  double eps = p.attrs<NormAttrs>().eps;
  const bool residual = p.attrs<NormAttrs>().residual;
  const size_t n_in = in.size() - (residual ? 1 : 0);
  bool affine = n_in == 3;
  const Array& x = in[0];
  const Array& dy = in[n_in - 1];
  int64_t c = x.shape().back(), rows = c ? x.size() / c : 0;
  dispatch_float(x.dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    const T* xs0 = x.data<T>();
    const T* g = affine ? in[1].data<T>() : nullptr;
    const T* res0 = residual ? in.back().data<T>() : nullptr;
    T* dx0 = static_cast<T*>(alloc_output(out));
    with_dy<T>(dy, p, [&](const auto* dys0) {
      parallel_for(rows, c * 6, [&](int64_t r0, int64_t r1) {
        std::vector<A> dyh(c);
        for (int64_t r = r0; r < r1; ++r) {
          const T* xs = xs0 + r * c;
          const auto* dys = dys0 + r * c;
          T* dx = dx0 + r * c;
          A mean, rstd;
          row_stats(xs, c, eps, mean, rstd);
          if (affine) {
#pragma omp simd
            for (int64_t k = 0; k < c; ++k) dyh[k] = ld(dys[k]) * ld(g[k]);
          } else {
#pragma omp simd
            for (int64_t k = 0; k < c; ++k) dyh[k] = ld(dys[k]);
          }
          A s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
          for (int64_t k = 0; k < c; ++k) {
            s1 += dyh[k];
            s2 += dyh[k] * (ld(xs[k]) - mean);
          }
          s2 *= rstd;
          s1 /= A(c);
          s2 /= A(c);
#pragma omp simd
          for (int64_t k = 0; k < c; ++k)
            dx[k] = st<T>(rstd * (dyh[k] - s1 - (ld(xs[k]) - mean) * rstd * s2));
          if (res0) {  // added to the stored dx while the row is in cache: as the unfused Add
            const T* rs = res0 + r * c;
#pragma omp simd
            for (int64_t k = 0; k < c; ++k) dx[k] = st<T>(ld(rs[k]) + ld(dx[k]));
          }
        }
      });
    });
  });
}

// [2, C]: sum over rows of dy * x̂ and of dy, in f64 partial sums per block
// of kRows rows (each row's statistics computed while it is in cache), the
// blocks then added in order: the result does not depend on the thread count.
// Within a block, kFlush rows at a time are summed in the compute type and
// then added to the f64 sums (f32 vectors are twice as wide as f64 ones).
void layer_norm_param_grad_kernel(const KernelContext&, const Primitive& p,
                                  const std::vector<Array>& in, ArrayNode& out) {
  double eps = p.attrs<NormAttrs>().eps;
  const Array &x = in[0], &dy = in[1];
  int64_t c = x.shape().back(), rows = c ? x.size() / c : 0;
  dispatch_float(x.dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    const T* xs = x.data<T>();
    T* y = static_cast<T*>(alloc_output(out));
    with_dy<T>(dy, p, [&](const auto* dys) {
      constexpr int64_t kRows = 128, kFlush = 8;
      const int64_t blocks = (rows + kRows - 1) / kRows;
      std::vector<double> part(blocks * 2 * c, 0.0);
      parallel_for(blocks, kRows * c * 6, [&](int64_t b0, int64_t b1) {
        std::vector<A> fg(c), fb(c);
        for (int64_t b = b0; b < b1; ++b) {
          double* pg = part.data() + b * 2 * c;
          double* pb = pg + c;
          const int64_t end = std::min(rows, (b + 1) * kRows);
          for (int64_t r0 = b * kRows; r0 < end; r0 += kFlush) {
            std::fill(fg.begin(), fg.end(), A(0));
            std::fill(fb.begin(), fb.end(), A(0));
            for (int64_t r = r0; r < std::min(end, r0 + kFlush); ++r) {
              const T* xr = xs + r * c;
              const auto* dr = dys + r * c;
              A mean, rstd;
              row_stats(xr, c, eps, mean, rstd);
#pragma omp simd
              for (int64_t k = 0; k < c; ++k) {
                A d = ld(dr[k]);
                fg[k] += d * ((ld(xr[k]) - mean) * rstd);
                fb[k] += d;
              }
            }
#pragma omp simd
            for (int64_t k = 0; k < c; ++k) {
              pg[k] += static_cast<double>(fg[k]);
              pb[k] += static_cast<double>(fb[k]);
            }
          }
        }
      });
      for (int64_t k = 0; k < c; ++k) {
        double g = 0, bsum = 0;
        for (int64_t b = 0; b < blocks; ++b) {
          g += part[b * 2 * c + k];
          bsum += part[b * 2 * c + c + k];
        }
        y[k] = st<T>(static_cast<A>(g));
        y[c + k] = st<T>(static_cast<A>(bsum));
      }
    });
  });
}

std::vector<int64_t> labels_of(const Array& labels, int64_t classes) {
  return read_indices(labels, classes, false, "softmax_cross_entropy", "label");
}

// The largest of a row's n values (vectorized: a language model's rows are
// 50257 logits; the same maximum in any order, NaN aside).
template <typename T>
acc_t<T> row_max(const T* x, int64_t n) {
  acc_t<T> m = -std::numeric_limits<acc_t<T>>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t k = 0; k < n; ++k) m = ld(x[k]) > m ? ld(x[k]) : m;
  return m;
}

// loss[r] = logsumexp(logits[r]) - logits[r, label[r]]
void sce_kernel(const KernelContext&, const Primitive& p,
                const std::vector<Array>& in, ArrayNode& out) {
  const Array& logits = in[0];
  int64_t c = logits.shape().back(), rows = c ? logits.size() / c : 0;
  auto labels = labels_of(in[1], c);
  dispatch_float(logits.dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    const T* x = logits.data<T>();
    void* y = alloc_output(out);
    parallel_for(rows, c * 4, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xs = x + r * c;
        const A m = row_max(xs, c);
        A total = 0;
#pragma omp simd reduction(+ : total)
        for (int64_t k = 0; k < c; ++k) total += fast_exp(ld(xs[k]) - m);
        A loss = m + std::log(total) - ld(xs[labels[r]]);
        if (out.dtype == DType::f64)
          static_cast<double*>(y)[r] = loss;
        else
          static_cast<float*>(y)[r] = static_cast<float>(loss);
      }
    });
  });
}

// dlogits[r] = (softmax(logits[r]) - onehot(label[r])) * dloss[r]; for f32
// logits also rounded to bf16 as it is stored (the compiler's fuse_casts:
// the bf16 GEMM of a language model's head reads it), the same bits as the
// f32 result's cast.
void sce_grad_kernel(const KernelContext&, const Primitive& p,
                     const std::vector<Array>& in, ArrayNode& out) {
  const Array& logits = in[0];
  int64_t c = logits.shape().back(), rows = c ? logits.size() / c : 0;
  auto labels = labels_of(in[1], c);
  std::vector<double> dloss(rows);
  in[2].copy_to_host(dloss.data(), DType::f64);
  const bool narrow = logits.dtype() == DType::f32 && out.dtype == DType::bf16;
  dispatch_float(logits.dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    const T* x = logits.data<T>();
    void* y = alloc_output(out);
    parallel_for(rows, c * 6, [&](int64_t r0, int64_t r1) {
      std::vector<A> e(c);
      for (int64_t r = r0; r < r1; ++r) {
        const T* xs = x + r * c;
        const A m = row_max(xs, c);
        A total = 0;
#pragma omp simd reduction(+ : total)
        for (int64_t k = 0; k < c; ++k) {
          e[k] = fast_exp(ld(xs[k]) - m);
          total += e[k];
        }
        const A scale = A(dloss[r]) / total;
        if constexpr (std::is_same_v<T, float>) {
          if (narrow) {  // the f32 values in e, then rounded
            uint16_t* ds = static_cast<uint16_t*>(y) + r * c;
#pragma omp simd
            for (int64_t k = 0; k < c; ++k) e[k] *= scale;
            e[labels[r]] -= A(dloss[r]);
#pragma omp simd
            for (int64_t k = 0; k < c; ++k) ds[k] = narrow_bf16(e[k]);
            continue;
          }
        }
        T* ds = static_cast<T*>(y) + r * c;
#pragma omp simd
        for (int64_t k = 0; k < c; ++k) ds[k] = st<T>(e[k] * scale);
        ds[labels[r]] = st<T>(ld(ds[labels[r]]) - A(dloss[r]));
      }
    });
  });
}

}  // namespace

void register_nn(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Softmax)] = softmax_kernel;
  t.kernels[static_cast<int>(Op::LogSoftmax)] = softmax_kernel;
  t.kernels[static_cast<int>(Op::LayerNorm)] = layer_norm_kernel;
  t.kernels[static_cast<int>(Op::LayerNormGrad)] = layer_norm_grad_kernel;
  t.kernels[static_cast<int>(Op::LayerNormParamGrad)] = layer_norm_param_grad_kernel;
  t.kernels[static_cast<int>(Op::SoftmaxCrossEntropy)] = sce_kernel;
  t.kernels[static_cast<int>(Op::SoftmaxCrossEntropyGrad)] = sce_grad_kernel;
}

}  // namespace kiln::cpu
