// kiln cuda backend: reductions — Sum (f32 accumulation for bf16 and f32, f64
// for f64, int64 for integers), Max (NaN propagates; -inf for an all -inf
// slice) and Argmax (i32; the first maximum, a NaN beats any number) — over
// any sorted axes; Cumsum and Argsort along one axis.
//
// As on the cpu, the input is viewed as [outer, reduced, inner] where the
// reduced axes form one group: rows (inner == 1) take 1, 32 or 256 threads
// each; columns (inner > 1) are read coalesced along inner by blocks that
// each sum a chunk of the reduced axis. Where rows or columns are too few to
// fill the GPU, Sum and Max split the reduced axis into chunks whose partial
// results a second pass combines; the chunking depends on the shape only, so
// the order of a float sum is the same on every run and every GPU. Reduced
// axes that are not adjacent take a general kernel (a warp per output).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_common.cuh"
#include "backend/views.h"
#include "ops/scalar_math.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
// Sum and Max split the reduced axis until about this many blocks (or row
// jobs) run: a constant, not the GPU's size, so that results do not depend
// on the device.
constexpr int64_t kTargetJobs = 1024;

// ---- the reductions: a state, its identity, adding element number `idx`
// of a slice, combining two states (of disjoint parts), and the result ----

template <typename A>
__host__ __device__ inline A lowest_of() {
  if constexpr (std::is_floating_point_v<A>)
    return -std::numeric_limits<A>::infinity();
  else
    return std::numeric_limits<A>::lowest();
}

template <typename T>
struct SumR {
  using A = std::conditional_t<std::is_integral_v<T>, int64_t, acc_t<T>>;
  using S = A;
  static constexpr bool kSplit = true;
  __device__ static S init() { return A(0); }
  template <typename In>
  __device__ static S add(S s, In v, int64_t) {
    return s + convert<A>(v);
  }
  __device__ static S combine(S a, S b) { return a + b; }
  template <typename Out>
  __device__ static Out result(S s) {
    return convert<Out>(s);
  }
};

// NaN propagates (as NumPy, JAX and PyTorch); the identity is -inf for floats.
template <typename T>
struct MaxR {
  using A = acc_t<T>;
  using S = A;
  static constexpr bool kSplit = true;
  __device__ static S init() { return lowest_of<A>(); }
  template <typename In>
  __device__ static S add(S s, In v, int64_t) {
    return combine(s, convert<A>(v));
  }
  __device__ static S combine(S a, S b) { return (b > a || b != b) ? b : a; }
  template <typename Out>
  __device__ static Out result(S s) {
    return convert<Out>(s);
  }
};

template <typename A>
struct ArgState {
  A v;
  int32_t i;  // kNone: no element yet
};

// The first index of the maximum, where any NaN beats every number and the
// first NaN wins (the cpu's rule, for slices combined in any order).
template <typename T>
struct ArgmaxR {
  using A = acc_t<T>;
  using S = ArgState<A>;
  static constexpr bool kSplit = false;
  static constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  // Whether (v, i) comes before b.
  __device__ static bool beats(A v, int32_t i, const S& b) {
    const bool vn = v != v, bn = b.v != b.v;
    if (vn || bn) return vn && (!bn || i < b.i);
    return v > b.v || (v == b.v && i < b.i);
  }
  __device__ static S init() { return S{lowest_of<A>(), kNone}; }
  template <typename In>
  __device__ static S add(S s, In v, int64_t idx) {
    const A a = convert<A>(v);
    const int32_t i = static_cast<int32_t>(idx);
    return beats(a, i, s) ? S{a, i} : s;
  }
  __device__ static S combine(S a, S b) { return beats(b.v, b.i, a) ? b : a; }
  template <typename Out>
  __device__ static Out result(S s) {
    return static_cast<Out>(s.i == kNone ? 0 : s.i);
  }
};

template <typename S>
__device__ inline S shfl_down(S v, int delta) {
  if constexpr (std::is_arithmetic_v<S>) {
    return __shfl_down_sync(0xffffffffu, v, delta);
  } else {
    S r;
    r.v = __shfl_down_sync(0xffffffffu, v.v, delta);
    r.i = __shfl_down_sync(0xffffffffu, v.i, delta);
    return r;
  }
}

// Lane 0 gets the combination of the warp's 32 states (a fixed tree).
template <typename R>
__device__ inline typename R::S warp_reduce(typename R::S v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = R::combine(v, shfl_down(v, o));
  return v;
}

// ---- rows: x is [rows, len]; job j = (row, chunk) reduces elements
// [chunk * seg, min(len, (chunk + 1) * seg)) of its row into y[j] ----
template <int TPR, typename R, typename In, typename Out>
__global__ void row_reduce(const In* x, Out* y, int64_t jobs, int64_t len, int64_t chunks,
                           int64_t seg) {
  using S = typename R::S;
  constexpr int kJobsPerBlock = kThreads / TPR;
  KILN_SHARED(S, part, [kThreads / 32]);
  const int lane = threadIdx.x % TPR;
  const int slot = threadIdx.x / TPR;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kJobsPerBlock; base < jobs;
       base += static_cast<int64_t>(gridDim.x) * kJobsPerBlock) {
    const int64_t job = base + slot;
    S acc = R::init();
    if (job < jobs) {
      const int64_t row = job / chunks, c = job - row * chunks;
      const int64_t b = c * seg, e = b + seg < len ? b + seg : len;
      const In* p = x + row * len;
      for (int64_t j = b + lane; j < e; j += TPR) acc = R::add(acc, p[j], j);
    }
    if constexpr (TPR == 1) {
      if (job < jobs) y[job] = R::template result<Out>(acc);
    } else if constexpr (TPR == 32) {
      acc = warp_reduce<R>(acc);
      if (lane == 0 && job < jobs) y[job] = R::template result<Out>(acc);
    } else {
      static_assert(TPR == kThreads, "row_reduce: 1, 32 or all threads per row");
      acc = warp_reduce<R>(acc);
      if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
      __syncthreads();
      if (threadIdx.x < 32) {
        S v = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : R::init();
        v = warp_reduce<R>(v);
        if (threadIdx.x == 0 && job < jobs) y[job] = R::template result<Out>(v);
      }
      __syncthreads();  // part is reused by the next job
    }
  }
}

template <typename R, typename In, typename Out>
void launch_rows(cudaStream_t st, int tpr, const In* x, Out* y, int64_t jobs, int64_t len,
                 int64_t chunks, int64_t seg) {
  const unsigned blocks = blocks_for(jobs * tpr, kThreads);
  if (tpr == 1)
    KILN_LAUNCH(blocks, kThreads, 0, st, row_reduce<1, R>)(x, y, jobs, len, chunks, seg);
  else if (tpr == 32)
    KILN_LAUNCH(blocks, kThreads, 0, st, row_reduce<32, R>)(x, y, jobs, len, chunks, seg);
  else
    KILN_LAUNCH(blocks, kThreads, 0, st, row_reduce<kThreads, R>)(x, y, jobs, len, chunks, seg);
  check_launch("row_reduce");
}

int threads_per_row(int64_t len) {
  return len <= 16 ? 1 : len <= 4096 ? 32 : kThreads;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

template <typename R, typename T, typename Out>
void reduce_rows(const KernelContext& ctx, cudaStream_t st, const T* x, Out* y, int64_t rows,
                 int64_t len) {
  using A = typename R::S;
  const int tpr = threads_per_row(len);
  int64_t chunks = 1;
  if constexpr (R::kSplit) {
    if (tpr == kThreads && rows < kTargetJobs)
      chunks = std::min(ceil_div(kTargetJobs, rows), ceil_div(len, 16 * kThreads));
  }
  if (chunks <= 1) return launch_rows<R>(st, tpr, x, y, rows, len, 1, len);
  if constexpr (R::kSplit) {
    const int64_t seg = ceil_div(len, chunks);
    chunks = ceil_div(len, seg);
    const size_t bytes = static_cast<size_t>(rows * chunks) * sizeof(A);
    A* part = static_cast<A*>(ctx.scratch->allocate(bytes));
    launch_rows<R>(st, tpr, x, part, rows * chunks, len, chunks, seg);
    launch_rows<R>(st, threads_per_row(chunks), static_cast<const A*>(part), y, rows, chunks, 1,
                   chunks);
    ctx.scratch->release(part, bytes);
  }
}

// ---- columns: x is [outer, len, inner], inner > 1. A block takes bx
// adjacent columns (a power of two, at most 32) and by = 256 / bx rows at a
// time of one chunk [c * seg, min(len, (c + 1) * seg)) of the reduced axis;
// its by partial states per column are combined by a tree in shared memory
// and y[(o * chunks + c) * inner + i] gets the chunk's result ----
template <typename R, typename In, typename Out>
__global__ void col_reduce(const In* x, Out* y, int64_t outer, int64_t len, int64_t inner,
                           int64_t chunks, int64_t seg, int bx_log2) {
  using S = typename R::S;
  KILN_SHARED(S, sm, [kThreads]);
  const int bx = 1 << bx_log2, by = kThreads >> bx_log2;
  const int tx = threadIdx.x & (bx - 1), ty = threadIdx.x >> bx_log2;
  const int64_t tiles = (inner + bx - 1) / bx;
  const int64_t blocks = outer * tiles * chunks;
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int64_t c = blk % chunks, t = blk / chunks;
    const int64_t o = t / tiles, i = (t - o * tiles) * bx + tx;
    S acc = R::init();
    if (i < inner) {
      const int64_t b = c * seg, e = b + seg < len ? b + seg : len;
      const In* p = x + (o * len + b + ty) * inner + i;
      const int64_t step = static_cast<int64_t>(by) * inner;
      for (int64_t r = b + ty; r < e; r += by, p += step) acc = R::add(acc, *p, r);
    }
    sm[threadIdx.x] = acc;
    __syncthreads();
    for (int h = by / 2; h > 0; h >>= 1) {
      if (ty < h) sm[threadIdx.x] = R::combine(sm[threadIdx.x], sm[threadIdx.x + h * bx]);
      __syncthreads();
    }
    if (ty == 0 && i < inner) y[(o * chunks + c) * inner + i] = R::template result<Out>(sm[tx]);
    __syncthreads();  // sm is reused by the next block's work
  }
}

template <typename R, typename T, typename Out>
void reduce_cols(const KernelContext& ctx, cudaStream_t st, const T* x, Out* y, int64_t outer,
                 int64_t len, int64_t inner) {
  using A = typename R::S;
  int bx_log2 = 0;
  while (bx_log2 < 5 && (int64_t{1} << bx_log2) < inner) ++bx_log2;
  const int64_t by = kThreads >> bx_log2;
  const int64_t tiles = outer * ceil_div(inner, int64_t{1} << bx_log2);
  auto launch = [&](const auto* in, auto* out, int64_t n, int64_t chunks, int64_t seg) {
    const int64_t blocks = std::min<int64_t>(tiles * chunks, 65535LL * 8);
    KILN_LAUNCH(static_cast<unsigned>(blocks), kThreads, 0, st, col_reduce<R>)
    (in, out, outer, n, inner, chunks, seg, bx_log2);
    check_launch("col_reduce");
  };
  int64_t chunks = 1;
  if constexpr (R::kSplit) {
    if (tiles < kTargetJobs)
      chunks = std::min(ceil_div(kTargetJobs, tiles), std::max<int64_t>(1, len / (8 * by)));
  }
  if (chunks <= 1) return launch(x, y, len, 1, len);
  if constexpr (R::kSplit) {
    const int64_t seg = ceil_div(len, chunks);
    chunks = ceil_div(len, seg);
    const size_t bytes = static_cast<size_t>(outer * chunks * inner) * sizeof(A);
    A* part = static_cast<A*>(ctx.scratch->allocate(bytes));
    launch(x, part, len, chunks, seg);
    launch(static_cast<const A*>(part), y, chunks, 1, chunks);
    ctx.scratch->release(part, bytes);
  }
}

// ---- any axes: a warp per output element; element j of its slice (the
// reduced axes flattened in order) is at kept offset + red offset of j ----
template <typename R, typename In, typename Out>
__global__ void any_reduce(const In* x, Out* y, MultiStrides<1> kept, MultiStrides<1> red,
                           int64_t n_out, int64_t len) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
       o < n_out; o += warps) {
    int64_t base[1];
    offsets_of<int64_t>(o, kept, base);
    typename R::S acc = R::init();
    for (int64_t j = lane; j < len; j += 32) {
      int64_t off[1];
      offsets_of<int64_t>(j, red, off);
      acc = R::add(acc, x[base[0] + off[0]], j);
    }
    acc = warp_reduce<R>(acc);
    if (lane == 0) y[o] = R::template result<Out>(acc);
  }
}

template <typename R, typename T, typename Out>
void reduce_any(cudaStream_t st, const T* x, Out* y, const Shape& shape,
                const std::vector<int>& axes, int64_t n_out, const char* name) {
  const std::vector<int64_t> strides = row_major_strides(shape);
  Shape ks, rs;
  std::vector<int64_t> kst, rst;
  for (size_t d = 0; d < shape.size(); ++d) {
    const bool r = std::binary_search(axes.begin(), axes.end(), static_cast<int>(d));
    (r ? rs : ks).push_back(shape[d]);
    (r ? rst : kst).push_back(strides[d]);
  }
  const MultiStrides<1> kept = collapse_strides<1>(ks, {kst}, name);
  const MultiStrides<1> red = collapse_strides<1>(rs, {rst}, name);
  KILN_LAUNCH(blocks_for(n_out * 32, kThreads), kThreads, 0, st, any_reduce<R>)
  (x, y, kept, red, n_out, numel(rs));
  check_launch("any_reduce");
}

template <typename R, typename T, typename Out>
void run_reduce(const KernelContext& ctx, cudaStream_t st, const Primitive& p, const Array& x,
                ArrayNode& out) {
  const auto& axes = p.attrs<ReduceAttrs>().axes;
  Out* y = out_ptr<Out>(out);
  const int64_t n_out = numel(out.shape);
  if (n_out == 0) return;
  const T* xp = ptr<T>(x);
  ReduceView v;
  if (!reduce_view(x.shape(), axes, v))
    reduce_any<R>(st, xp, y, x.shape(), axes, n_out, p.name());
  else if (v.inner == 1)
    reduce_rows<R>(ctx, st, xp, y, v.outer, v.reduced);
  else
    reduce_cols<R>(ctx, st, xp, y, v.outer, v.reduced, v.inner);
}

void reduce_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                   ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  const DType dt = in[0].dtype();
  visit_dtype(dt, p.name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool>) {
      fail(p.name(), std::string("no cuda kernel for dtype ") + name_of(dt));
    } else {
      switch (p.op()) {
        case Op::Sum: return run_reduce<SumR<T>, T, T>(ctx, st, p, in[0], out);
        case Op::Max: return run_reduce<MaxR<T>, T, T>(ctx, st, p, in[0], out);
        case Op::Argmax: return run_reduce<ArgmaxR<T>, T, int32_t>(ctx, st, p, in[0], out);
        default: fail(p.name(), "not a reduction");
      }
    }
  });
}

// Cumsum: one thread per (outer, inner) line of the [outer, n, inner] view,
// adding its n elements in order (reversed: from the last) in the
// accumulation type, as the cpu does; consecutive threads take consecutive
// inner positions, so the loads of a warp are coalesced where inner > 1.
template <typename T>
__global__ void cumsum_lines(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n,
                             int64_t inner, bool reverse) {
  KILN_GRID_LOOP(line, outer * inner) {
    const int64_t o = line / inner, j = line % inner;
    acc_t<T> acc = acc_t<T>(0);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t at = ((reverse ? n - 1 - k : k) + o * n) * inner + j;
      acc += load(x, at);
      y[at] = convert<T>(acc);
    }
  }
}

void cumsum_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                   ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  const auto& a = p.attrs<ScanAttrs>();
  const ReduceView v = axis_view(in[0].shape(), a.axis);
  const int64_t outer = v.outer, n = v.reduced, inner = v.inner;
  visit_dtype(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool>) {
      fail(p.name(), "no cuda kernel for bool");
    } else {
      T* y = out_ptr<T>(out);
      if (outer * inner == 0 || n == 0) return;
      KILN_LAUNCH(blocks_for(outer * inner, kThreads), kThreads, 0, st, cumsum_lines<T>)
      (ptr<T>(in[0]), y, outer, n, inner, a.reverse);
      check_launch("cumsum_lines");
    }
  });
}

// Argsort: one thread per element, which counts the elements of its line
// that sort before it (sorts_before, ops/scalar_math.h; equal ones only from
// lower positions, so the order is stable) and stores its position at that
// rank. Quadratic in the line's length and free of scratch memory and of
// synchronization: meant for the lines kiln sorts (classes, tokens), where a
// line's loads are shared through the cache.
template <typename T>
__global__ void argsort_ranks(const T* __restrict__ x, int32_t* __restrict__ y, int64_t n,
                              int64_t inner, int64_t total, bool descending) {
  KILN_GRID_LOOP(i, total) {
    const int64_t at = i / inner % n, base = i / inner / n * n * inner + i % inner;
    const acc_t<T> v = load(x, i);
    int64_t rank = 0;
    for (int64_t k = 0; k < n; ++k) {
      const acc_t<T> w = load(x, base + k * inner);
      rank += sorts_before(w, v, descending) || (k < at && !sorts_before(v, w, descending));
    }
    y[base + rank * inner] = static_cast<int32_t>(at);
  }
}

void argsort_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                    ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  const auto& a = p.attrs<SortAttrs>();
  const ReduceView v = axis_view(in[0].shape(), a.axis);
  const int64_t outer = v.outer, n = v.reduced, inner = v.inner;
  visit_dtype(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool>) {
      fail(p.name(), "no cuda kernel for bool");
    } else {
      int32_t* y = out_ptr<int32_t>(out);
      const int64_t total = outer * n * inner;
      if (total == 0) return;
      KILN_LAUNCH(blocks_for(total, kThreads), kThreads, 0, st, argsort_ranks<T>)
      (ptr<T>(in[0]), y, n, inner, total, a.descending);
      check_launch("argsort_ranks");
    }
  });
}

}  // namespace

void register_reduce(KernelTable& t) {
  for (Op op : {Op::Sum, Op::Max, Op::Argmax}) t.kernels[static_cast<int>(op)] = reduce_kernel;
  t.kernels[static_cast<int>(Op::Cumsum)] = cumsum_kernel;
  t.kernels[static_cast<int>(Op::Argsort)] = argsort_kernel;
}

}  // namespace kiln::cuda
