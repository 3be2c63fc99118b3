// kiln cuda backend: the fused neural-network row kernels — Softmax and
// LogSoftmax along an axis, LayerNorm, LayerNormGrad (with its residual
// input), LayerNormParamGrad (a deterministic column reduction: partial sums
// per block of rows, added in order, no atomics), SoftmaxCrossEntropy and its
// gradient. One warp handles a row of up to kWarpRow elements, one thread
// block a longer one (a softmax along another axis than the last: one thread
// per strided row). Statistics accumulate in f32 for f32 and bf16 and in f64
// for f64, with the cpu backend's formulas and rounding points (scalar.h's
// exp), so that results differ from it only by the order of the sums.
#include <algorithm>
#include <limits>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_common.cuh"
#include "ops/scalar.h"

namespace kiln::cuda {
namespace {

// Rows up to this long are handled by one warp each, kRowThreads / 32 rows
// to a block; longer rows by one block each.
constexpr int64_t kWarpRow = 1024;
constexpr int kRowThreads = 256;
constexpr int64_t kMaxGrid = 65535LL * 8;

template <typename A>
__device__ inline A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// The largest value (NaNs are skipped, as by the cpu's comparison; partial
// maxima start at -inf and so are never NaN).
template <typename A>
__device__ inline A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) {
    const A w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}
template <typename A>
__device__ inline A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

// The warp totals v of a block (blockDim.x a multiple of 32) combined, given
// to every thread. red: shared, at least 33 values. Two barriers suffice:
// a reduction writes red[0..32) before its first barrier, which every thread
// reaches only after reading the previous reduction's red[32], and red[32]
// after it, when warp 0 has read the previous red[0..32) (second barrier).
template <bool kMax, typename A>
__device__ inline A across_warps(A v, A* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A w = lane < warps ? red[lane] : (kMax ? neg_inf<A>() : A(0));
    w = kMax ? warp_max(w) : warp_sum(w);
    if (lane == 0) red[32] = w;
  }
  __syncthreads();
  return red[32];
}

// The threads that handle one row: a warp (kWarp) or the whole block. Rows
// first, first + step, ... are this group's; sum and max give the group's
// total to each of its threads (red: a shared buffer of 66 values, used by
// block groups only).
template <bool kWarp>
struct Group {
  int rank, size;
  int64_t first, step;
  __device__ Group() {
    if constexpr (kWarp) {
      const int64_t per_block = blockDim.x >> 5;
      rank = threadIdx.x & 31;
      size = 32;
      first = static_cast<int64_t>(blockIdx.x) * per_block + (threadIdx.x >> 5);
      step = static_cast<int64_t>(gridDim.x) * per_block;
    } else {
      rank = threadIdx.x;
      size = blockDim.x;
      first = blockIdx.x;
      step = gridDim.x;
    }
  }
  template <typename A>
  __device__ A sum(A v, A* red) const {
    v = warp_sum(v);
    if constexpr (kWarp) return v;
    else return across_warps<false>(v, red);
  }
  template <typename A>
  __device__ A max(A v, A* red) const {
    v = warp_max(v);
    if constexpr (kWarp) return v;
    else return across_warps<true>(v, red);
  }
  // A row's max m and its sum of exp(x - m), each reduced over the group:
  // the prologue of the softmax and cross-entropy row kernels.
  template <typename A, typename T>
  __device__ void max_and_sum_exp(const T* xs, int64_t n, A* red, A& m, A& total) const {
    m = neg_inf<A>();
    for (int64_t k = rank; k < n; k += size) {
      const A v = load(xs, k);
      m = v > m ? v : m;
    }
    m = max(m, red);
    total = 0;
    for (int64_t k = rank; k < n; k += size) total += scalar<Op::Exp>(A(load(xs, k) - m));
    total = sum(total, red);
  }
  // Two sums at once (one pair of barriers).
  template <typename A>
  __device__ void sum2(A& a, A& b, A* red) const {
    a = warp_sum(a);
    b = warp_sum(b);
    if constexpr (!kWarp) {
      const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
      if (lane == 0) {
        red[warp] = a;
        red[33 + warp] = b;
      }
      __syncthreads();
      if (warp == 0) {
        A x = lane < warps ? red[lane] : A(0), y = lane < warps ? red[33 + lane] : A(0);
        x = warp_sum(x);
        y = warp_sum(y);
        if (lane == 0) {
          red[32] = x;
          red[65] = y;
        }
      }
      __syncthreads();
      a = red[32];
      b = red[65];
    }
  }
};

// The launch of a row kernel over `rows` rows of n elements.
struct RowLaunch {
  bool warp;
  unsigned grid;
  int threads;
};
RowLaunch row_launch(int64_t rows, int64_t n) {
  if (n <= kWarpRow) {
    const int64_t per_block = kRowThreads / 32;
    return {true, static_cast<unsigned>(std::clamp<int64_t>((rows + per_block - 1) / per_block, 1,
                                                            kMaxGrid)),
            kRowThreads};
  }
  const int threads = n <= 4096 ? 256 : (n <= 16384 ? 512 : 1024);
  return {false, static_cast<unsigned>(std::clamp<int64_t>(rows, 1, kMaxGrid)), threads};
}

// Calls launch(std::bool_constant<warp>, grid, threads) for rows of n.
template <typename F>
void for_rows(int64_t rows, int64_t n, F&& launch) {
  const RowLaunch l = row_launch(rows, n);
  if (l.warp)
    launch(std::true_type{}, l.grid, l.threads);
  else
    launch(std::false_type{}, l.grid, l.threads);
}

// The float element types, as the cpu's dispatch_float.
template <typename F>
void visit_float(DType dt, const char* who, F&& f) {
  switch (dt) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::bf16: return f(__nv_bfloat16{});
    default: break;
  }
  fail(who, std::string("no cuda kernel for dtype ") + name_of(dt));
}

void require_dtype(const Primitive& p, const Array& a, DType dt, const char* what) {
  if (a.dtype() != dt)
    fail(p.name(), std::string(what) + " is " + name_of(a.dtype()) + ", not " + name_of(dt) +
                       " as the input");
}

// ---- softmax ----

// Softmax (or log-softmax) of contiguous rows of n. (The row kernels' launch
// bounds keep a 1024-thread block launchable wherever the driver compiles
// the PTX for a later GPU.)
template <typename T, bool kLog, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kRowThreads : 1024) softmax_rows(const T* x, T* y, int64_t rows, int64_t n) {
  using A = acc_t<T>;
  KILN_SHARED(A, red, [66]);
  const Group<kWarp> g;
  for (int64_t r = g.first; r < rows; r += g.step) {
    const T* xs = x + r * n;
    T* ys = y + r * n;
    A m, total;
    g.max_and_sum_exp(xs, n, red, m, total);
    if constexpr (kLog) {
      const A lse = m + std::log(total);
      for (int64_t k = g.rank; k < n; k += g.size) ys[k] = convert<T>(A(load(xs, k) - lse));
    } else {
      const A inv = A(1) / total;
      for (int64_t k = g.rank; k < n; k += g.size)
        ys[k] = convert<T>(A(scalar<Op::Exp>(A(load(xs, k) - m)) * inv));
    }
  }
}

// Softmax along an inner axis of x viewed as [outer, n, inner]: one thread
// per (outer, inner) row of stride inner (neighbouring threads read
// neighbouring elements).
template <typename T, bool kLog>
__global__ void softmax_strided(const T* x, T* y, int64_t outer, int64_t n, int64_t inner) {
  using A = acc_t<T>;
  KILN_GRID_LOOP(job, outer * inner) {
    const int64_t o = job / inner, i = job - o * inner;
    const T* xs = x + o * n * inner + i;
    T* ys = y + o * n * inner + i;
    A m = neg_inf<A>();
    for (int64_t k = 0; k < n; ++k) {
      const A v = load(xs, k * inner);
      m = v > m ? v : m;
    }
    A total = 0;
    for (int64_t k = 0; k < n; ++k) total += scalar<Op::Exp>(A(load(xs, k * inner) - m));
    if constexpr (kLog) {
      const A lse = m + std::log(total);
      for (int64_t k = 0; k < n; ++k) ys[k * inner] = convert<T>(A(load(xs, k * inner) - lse));
    } else {
      const A inv = A(1) / total;
      for (int64_t k = 0; k < n; ++k)
        ys[k * inner] = convert<T>(A(scalar<Op::Exp>(A(load(xs, k * inner) - m)) * inv));
    }
  }
}

void softmax_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                    ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const int ax = p.attrs<AxisAttrs>().axis;
  const Shape& sh = in[0].shape();
  int64_t outer = 1, inner = 1;
  const int64_t n = sh[ax];
  for (int i = 0; i < ax; ++i) outer *= sh[i];
  for (size_t i = ax + 1; i < sh.size(); ++i) inner *= sh[i];
  const bool log = p.op() == Op::LogSoftmax;
  visit_float(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    const T* x = ptr<T>(in[0]);
    T* y = out_ptr<T>(out);
    if (outer * n * inner == 0) return;
    if (inner == 1) {
      for_rows(outer, n, [&](auto w, unsigned grid, int threads) {
        constexpr bool kWarp = decltype(w)::value;
        if (log)
          KILN_LAUNCH(grid, threads, 0, s, softmax_rows<T, true, kWarp>)(x, y, outer, n);
        else
          KILN_LAUNCH(grid, threads, 0, s, softmax_rows<T, false, kWarp>)(x, y, outer, n);
        check_launch("softmax");
      });
    } else {
      const unsigned grid = blocks_for(outer * inner);
      if (log)
        KILN_LAUNCH(grid, 256, 0, s, softmax_strided<T, true>)(x, y, outer, n, inner);
      else
        KILN_LAUNCH(grid, 256, 0, s, softmax_strided<T, false>)(x, y, outer, n, inner);
      check_launch("softmax");
    }
  });
}

// ---- layer norm ----

// Mean and 1/sqrt(var + eps) of a row of c (biased variance, two passes, as
// the cpu's row_stats), given to every thread of g.
template <bool kWarp, typename T, typename A>
__device__ inline void row_stats(const Group<kWarp>& g, const T* x, int64_t c, double eps, A* red,
                                 A& mean, A& rstd) {
  A s = 0;
  for (int64_t k = g.rank; k < c; k += g.size) s += load(x, k);
  mean = g.sum(s, red) / A(c);
  A v = 0;
  for (int64_t k = g.rank; k < c; k += g.size) {
    const A d = load(x, k) - mean;
    v += d * d;
  }
  v = g.sum(v, red);
  rstd = A(1) / std::sqrt(v / A(c) + A(eps));
}

// y = (x - mean) * rstd [* gamma + beta] over rows of c.
template <typename T, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kRowThreads : 1024) layer_norm_rows(const T* x, const T* gamma, const T* beta, T* y, int64_t rows,
                                int64_t c, double eps) {
  using A = acc_t<T>;
  KILN_SHARED(A, red, [66]);
  const Group<kWarp> g;
  for (int64_t r = g.first; r < rows; r += g.step) {
    const T* xs = x + r * c;
    T* ys = y + r * c;
    A mean, rstd;
    row_stats(g, xs, c, eps, red, mean, rstd);
    if (gamma) {
      for (int64_t k = g.rank; k < c; k += g.size)
        ys[k] = convert<T>(A((load(xs, k) - mean) * rstd * load(gamma, k) + load(beta, k)));
    } else {
      for (int64_t k = g.rank; k < c; k += g.size)
        ys[k] = convert<T>(A((load(xs, k) - mean) * rstd));
    }
  }
}

// Inputs x, gamma, beta or x alone.
void layer_norm_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                       ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const double eps = p.attrs<NormAttrs>().eps;
  const int64_t c = in[0].shape().back(), rows = c ? in[0].size() / c : 0;
  const bool affine = in.size() == 3;
  if (affine) {
    require_dtype(p, in[1], in[0].dtype(), "weight");
    require_dtype(p, in[2], in[0].dtype(), "bias");
  }
  visit_float(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    const T* x = ptr<T>(in[0]);
    const T* gamma = affine ? ptr<T>(in[1]) : nullptr;
    const T* beta = affine ? ptr<T>(in[2]) : nullptr;
    T* y = out_ptr<T>(out);
    if (rows == 0) return;
    for_rows(rows, c, [&](auto w, unsigned grid, int threads) {
      KILN_LAUNCH(grid, threads, 0, s, layer_norm_rows<T, decltype(w)::value>)
      (x, gamma, beta, y, rows, c, eps);
      check_launch("layer_norm");
    });
  });
}

// dx = rstd * (dŷ - mean(dŷ) - x̂ * mean(dŷ * x̂)), with dŷ = dy * gamma;
// with a residual r, dx is rounded to T and then r + dx stored (as the
// unfused Add).
template <typename T, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kRowThreads : 1024) layer_norm_grad_rows(const T* x, const T* gamma, const T* dy, const T* res, T* dx,
                                     int64_t rows, int64_t c, double eps) {
  using A = acc_t<T>;
  KILN_SHARED(A, red, [66]);
  const Group<kWarp> g;
  for (int64_t r = g.first; r < rows; r += g.step) {
    const T* xs = x + r * c;
    const T* dys = dy + r * c;
    T* dxs = dx + r * c;
    A mean, rstd;
    row_stats(g, xs, c, eps, red, mean, rstd);
    A s1 = 0, s2 = 0;
    for (int64_t k = g.rank; k < c; k += g.size) {
      A d = load(dys, k);
      if (gamma) d = d * load(gamma, k);
      s1 += d;
      s2 += d * (load(xs, k) - mean);
    }
    g.sum2(s1, s2, red);
    s2 *= rstd;
    s1 /= A(c);
    s2 /= A(c);
    for (int64_t k = g.rank; k < c; k += g.size) {
      A d = load(dys, k);
      if (gamma) d = d * load(gamma, k);
      T v = convert<T>(A(rstd * (d - s1 - (load(xs, k) - mean) * rstd * s2)));
      if (res) v = convert<T>(A(load(res, r * c + k) + convert<A>(v)));
      dxs[k] = v;
    }
  }
}

// Inputs x, [gamma,] dy[, r] (r with NormAttrs::residual).
void layer_norm_grad_kernel(const KernelContext& ctx, const Primitive& p,
                            const std::vector<Array>& in, ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const auto& attrs = p.attrs<NormAttrs>();
  const size_t n_in = in.size() - (attrs.residual ? 1 : 0);
  const bool affine = n_in == 3;
  const Array& x = in[0];
  const Array& dy = in[n_in - 1];
  const int64_t c = x.shape().back(), rows = c ? x.size() / c : 0;
  if (affine) require_dtype(p, in[1], x.dtype(), "weight");
  require_dtype(p, dy, x.dtype(), "gradient");
  if (attrs.residual) require_dtype(p, in.back(), x.dtype(), "residual");
  visit_float(x.dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    const T* gamma = affine ? ptr<T>(in[1]) : nullptr;
    const T* res = attrs.residual ? ptr<T>(in.back()) : nullptr;
    T* dx = out_ptr<T>(out);
    if (rows == 0) return;
    for_rows(rows, c, [&](auto w, unsigned grid, int threads) {
      KILN_LAUNCH(grid, threads, 0, s, layer_norm_grad_rows<T, decltype(w)::value>)
      (ptr<T>(x), gamma, ptr<T>(dy), res, dx, rows, c, attrs.eps);
      check_launch("layer_norm_grad");
    });
  });
}

// Each row's mean and rstd into stats[2r], stats[2r + 1].
template <typename T, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kRowThreads : 1024) row_stats_rows(const T* x, acc_t<T>* stats, int64_t rows, int64_t c, double eps) {
  using A = acc_t<T>;
  KILN_SHARED(A, red, [66]);
  const Group<kWarp> g;
  for (int64_t r = g.first; r < rows; r += g.step) {
    A mean, rstd;
    row_stats(g, x + r * c, c, eps, red, mean, rstd);
    if (g.rank == 0) {
      stats[2 * r] = mean;
      stats[2 * r + 1] = rstd;
    }
  }
}

// Column sums of dy * x̂ and of dy over one block of `per` rows (blockIdx.y)
// and 32 columns (blockIdx.x): kParamLanes threads per column each sum every
// kParamLanes-th row (each term computed in the compute type, as the cpu's,
// and added in f64), then their sums are added in order into
// part[block][0 or 1][column].
constexpr int kParamLanes = 8;
template <typename T>
__global__ void param_grad_partial(const T* x, const T* dy, const acc_t<T>* stats, double* part,
                                   int64_t rows, int64_t c, int64_t per) {
  using A = acc_t<T>;
  KILN_SHARED(double, sg, [kParamLanes][32]);
  KILN_SHARED(double, sb, [kParamLanes][32]);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  const int64_t b = blockIdx.y;
  const int64_t r1 = std::min(rows, (b + 1) * per);
  double fg = 0, fb = 0;
  if (k < c) {
    for (int64_t r = b * per + ty; r < r1; r += kParamLanes) {
      const A mean = stats[2 * r], rstd = stats[2 * r + 1];
      const A d = load(dy, r * c + k);
      fg += static_cast<double>(A(d * ((load(x, r * c + k) - mean) * rstd)));
      fb += static_cast<double>(d);
    }
  }
  sg[ty][tx] = fg;
  sb[ty][tx] = fb;
  __syncthreads();
  if (ty == 0 && k < c) {
    double gs = 0, bs = 0;
    for (int i = 0; i < kParamLanes; ++i) {
      gs += sg[i][tx];
      bs += sb[i][tx];
    }
    part[(2 * b) * c + k] = gs;
    part[(2 * b + 1) * c + k] = bs;
  }
}

// y[0][k], y[1][k]: the partial sums of column k added over the row blocks
// in order.
template <typename T>
__global__ void param_grad_finish(const double* part, T* y, int64_t blocks, int64_t c) {
  using A = acc_t<T>;
  KILN_GRID_LOOP(k, c) {
    double gs = 0, bs = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      gs += part[(2 * b) * c + k];
      bs += part[(2 * b + 1) * c + k];
    }
    y[k] = convert<T>(static_cast<A>(gs));
    y[c + k] = convert<T>(static_cast<A>(bs));
  }
}

// [2, C]: the sums over rows of dy * x̂ (gamma's gradient) and of dy (beta's):
// row statistics first, then partial sums per block of rows, then the blocks
// added in order — deterministic, no atomics.
void layer_norm_param_grad_kernel(const KernelContext& ctx, const Primitive& p,
                                  const std::vector<Array>& in, ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const double eps = p.attrs<NormAttrs>().eps;
  const Array &x = in[0], &dy = in[1];
  const int64_t c = x.shape().back(), rows = c ? x.size() / c : 0;
  require_dtype(p, dy, x.dtype(), "gradient");
  visit_float(x.dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    T* y = out_ptr<T>(out);
    if (c == 0) return;
    // Rows per block: at least 256, and few enough blocks for grid.y.
    const int64_t per = std::max<int64_t>(256, (rows + 65534) / 65535);
    const int64_t blocks = (rows + per - 1) / per;
    const size_t stats_bytes = static_cast<size_t>(rows) * 2 * sizeof(A);
    const size_t part_bytes = static_cast<size_t>(blocks) * 2 * c * sizeof(double);
    A* stats = nullptr;
    double* part = nullptr;
    if (rows > 0) {
      stats = static_cast<A*>(ctx.scratch->allocate(stats_bytes));
      part = static_cast<double*>(ctx.scratch->allocate(part_bytes));
      for_rows(rows, c, [&](auto w, unsigned grid, int threads) {
        KILN_LAUNCH(grid, threads, 0, s, row_stats_rows<T, decltype(w)::value>)
        (ptr<T>(x), stats, rows, c, eps);
        check_launch("layer_norm_param_grad");
      });
      const dim3 grid(static_cast<unsigned>((c + 31) / 32), static_cast<unsigned>(blocks));
      KILN_LAUNCH(grid, dim3(32, kParamLanes), 0, s, param_grad_partial<T>)
      (ptr<T>(x), ptr<T>(dy), stats, part, rows, c, per);
      check_launch("layer_norm_param_grad");
    }
    KILN_LAUNCH(blocks_for(c), 256, 0, s, param_grad_finish<T>)(part, y, blocks, c);
    check_launch("layer_norm_param_grad");
    if (rows > 0) {
      ctx.scratch->release(stats, stats_bytes);
      ctx.scratch->release(part, part_bytes);
    }
  });
}

// ---- softmax cross-entropy ----

// Labels as their device type (i32 or i64), as read_indices accepts.
template <typename F>
void visit_labels(const Array& labels, F&& f) {
  switch (labels.dtype()) {
    case DType::i32: return f(ptr<int32_t>(labels));
    case DType::i64: return f(ptr<int64_t>(labels));
    default: break;
  }
  fail("softmax_cross_entropy",
       std::string("indices must be i32 or i64, got ") + name_of(labels.dtype()));
}

// loss[r] = logsumexp(x[r]) - x[r, label[r]]; NaN where the label is outside
// [0, c) (the labels stay on the device: the cpu's check would wait for them).
template <typename T, typename I, typename O, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kRowThreads : 1024) sce_rows(const T* x, const I* labels, O* loss, int64_t rows, int64_t c) {
  using A = acc_t<T>;
  KILN_SHARED(A, red, [66]);
  const Group<kWarp> g;
  for (int64_t r = g.first; r < rows; r += g.step) {
    const T* xs = x + r * c;
    A m, total;
    g.max_and_sum_exp(xs, c, red, m, total);
    if (g.rank == 0) {
      const int64_t l = labels[r];
      const A v = l >= 0 && l < c ? A(m + std::log(total) - load(xs, l))
                                  : std::numeric_limits<A>::quiet_NaN();
      loss[r] = static_cast<O>(v);
    }
  }
}

// dx[r] = (softmax(x[r]) - onehot(label[r])) * dloss[r], the softmax term
// rounded to T before the label's dloss is taken off (as the cpu); a row
// whose label is outside [0, c) is NaN.
template <typename T, typename I, typename D, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kRowThreads : 1024) sce_grad_rows(const T* x, const I* labels, const D* dloss, T* dx, int64_t rows,
                              int64_t c) {
  using A = acc_t<T>;
  KILN_SHARED(A, red, [66]);
  const Group<kWarp> g;
  for (int64_t r = g.first; r < rows; r += g.step) {
    const T* xs = x + r * c;
    T* ds = dx + r * c;
    A m, total;
    g.max_and_sum_exp(xs, c, red, m, total);
    const A dl = static_cast<A>(convert<double>(dloss[r]));
    const int64_t l = labels[r];
    const bool bad = l < 0 || l >= c;
    const A scale = dl / total;
    for (int64_t k = g.rank; k < c; k += g.size) {
      T v = convert<T>(A(scalar<Op::Exp>(A(load(xs, k) - m)) * scale));
      if (k == l) v = convert<T>(A(convert<A>(v) - dl));
      if (bad) v = convert<T>(std::numeric_limits<A>::quiet_NaN());
      ds[k] = v;
    }
  }
}

// Labels for `rows` rows of c classes: c = 0 leaves no class to name.
void check_labels(const Primitive& p, const Array& logits, int64_t rows, int64_t c,
                  const Array& labels) {
  if (c == 0 && labels.size() > 0)
    fail("softmax_cross_entropy", "labels index an empty class axis (logits " +
                                      str(logits.shape()) + ")");
  if (c > 0 && labels.size() != rows)
    fail(p.name(), "labels " + str(labels.shape()) + " do not match logits " +
                       str(logits.shape()));
}

void sce_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const Array& logits = in[0];
  const int64_t c = logits.shape().back(), rows = c ? logits.size() / c : 0;
  check_labels(p, logits, rows, c, in[1]);
  visit_float(logits.dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    visit_labels(in[1], [&](auto labels) {
      using I = std::remove_const_t<std::remove_pointer_t<decltype(labels)>>;
      auto launch = [&](auto o) {
        using O = decltype(o);
        O* loss = out_ptr<O>(out);
        if (rows == 0) return;
        for_rows(rows, c, [&](auto w, unsigned grid, int threads) {
          KILN_LAUNCH(grid, threads, 0, s, sce_rows<T, I, O, decltype(w)::value>)
          (ptr<T>(logits), labels, loss, rows, c);
          check_launch("softmax_cross_entropy");
        });
      };
      if (out.dtype == DType::f64)
        launch(double{});
      else
        launch(float{});
    });
  });
}

// Inputs logits, labels, dloss (one per row, f32, f64 or bf16).
void sce_grad_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                     ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const Array& logits = in[0];
  const int64_t c = logits.shape().back(), rows = c ? logits.size() / c : 0;
  check_labels(p, logits, rows, c, in[1]);
  if (in[2].size() != rows)
    fail(p.name(), "loss gradient " + str(in[2].shape()) + " does not match logits " +
                       str(logits.shape()));
  visit_float(logits.dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    T* dx = out_ptr<T>(out);
    if (rows == 0) return;
    visit_labels(in[1], [&](auto labels) {
      using I = std::remove_const_t<std::remove_pointer_t<decltype(labels)>>;
      visit_float(in[2].dtype(), p.name(), [&](auto d) {
        using D = decltype(d);
        for_rows(rows, c, [&](auto w, unsigned grid, int threads) {
          KILN_LAUNCH(grid, threads, 0, s, sce_grad_rows<T, I, D, decltype(w)::value>)
          (ptr<T>(logits), labels, ptr<D>(in[2]), dx, rows, c);
          check_launch("softmax_cross_entropy_grad");
        });
      });
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

}  // namespace kiln::cuda
