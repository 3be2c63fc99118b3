// kiln cuda backend: layout kernels — Reshape (an alias of its input),
// Transpose (32x32 shared-memory tiles where the last two axes swap),
// BroadcastTo, Concatenate, Slice and SliceGrad (strided copies that move
// elements in units of up to 16 bytes where contiguity and alignment allow),
// Take and ScatterAdd along an axis, OneHot, and DynamicSlice and
// DynamicUpdateSlice (starts read on the device).
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_common.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uint64_t>(bytes) == 0;
}

// Calls f(U{}) with the unsigned type of `bytes` bytes (uint4 for 16): the
// unit the copy kernels move.
template <typename F>
void visit_unit(int64_t bytes, const char* op, F&& f) {
  switch (bytes) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
    case 16: return f(uint4{});
  }
  fail(op, "unsupported element size " + std::to_string(bytes));
}

// The widest unit (at most 16 bytes, a power of two) that divides `bytes`
// and to which every pointer is aligned.
int64_t widest_unit(int64_t bytes, std::initializer_list<const void*> ptrs) {
  for (int64_t u = 16; u > 1; u /= 2) {
    if (bytes % u != 0) continue;
    bool ok = true;
    for (const void* p : ptrs) ok = ok && aligned(p, u);
    if (ok) return u;
  }
  return 1;
}

// dst[off0(i)] = src[off1(i)] for every element i of s's shape.
template <typename I, typename U>
__global__ void copy_kernel(U* dst, const U* src, MultiStrides<2> s, I n) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<I>(blockDim.x) * gridDim.x) {
    I off[2];
    offsets_of<I>(i, s, off);
    dst[off[0]] = src[off[1]];
  }
}

// Copies every element (of es bytes) of `shape` from src, read at element
// strides `sst`, to dst, written at element strides `dstr`. Where the
// innermost axis is contiguous on both sides the copy moves wider units.
void strided_copy(cudaStream_t st, void* dst, const void* src, int64_t es, const Shape& shape,
                  std::vector<int64_t> dstr, std::vector<int64_t> sstr, const char* name) {
  const int64_t n = numel(shape);
  if (n == 0) return;
  MultiStrides<2> s = collapse_strides<2>(shape, {std::move(dstr), std::move(sstr)}, name);
  int64_t unit = es;
  const int last = s.rank - 1;
  if (s.rank > 0 && s.stride[0][last] == 1 && s.stride[1][last] == 1) {
    for (int64_t u = 16; u > es; u /= 2) {
      const int64_t f = u / es;
      bool ok = s.shape[last] % f == 0 && aligned(dst, u) && aligned(src, u);
      for (int d = 0; ok && d < last; ++d)
        ok = s.stride[0][d] % f == 0 && s.stride[1][d] % f == 0;
      if (ok) {
        unit = u;
        break;
      }
    }
    const int64_t f = unit / es;
    s.shape[last] /= f;
    for (int d = 0; d < last; ++d) {
      s.stride[0][d] /= f;
      s.stride[1][d] /= f;
    }
  }
  const int64_t units = n / (unit / es);
  visit_unit(unit, name, [&](auto u) {
    using U = decltype(u);
    U* y = static_cast<U*>(dst);
    const U* x = static_cast<const U*>(src);
    if (fits_u32(s))
      KILN_LAUNCH(blocks_for(units, kThreads), kThreads, 0, st, copy_kernel<uint32_t>)
      (y, x, s, static_cast<uint32_t>(units));
    else
      KILN_LAUNCH(blocks_for(units, kThreads), kThreads, 0, st, copy_kernel<int64_t>)
      (y, x, s, units);
    check_launch(name);
  });
}

// ---- Transpose ----

// dst[b, m, n] = src[batch offset of b + n * M + m] for an output of
// [batches, M, N]: 32x32 tiles through shared memory, so that both the reads
// (along m) and the writes (along n) are coalesced.
template <typename U>
__global__ void transpose_tiles(U* dst, const U* src, MultiStrides<1> batch, int64_t batches,
                                int64_t M, int64_t N) {
  KILN_SHARED(U, tile, [32][33]);
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t tm = (M + 31) / 32, tn = (N + 31) / 32;
  for (int64_t t = blockIdx.x; t < batches * tm * tn; t += gridDim.x) {
    const int64_t b = t / (tm * tn), r = t - b * (tm * tn);
    const int64_t m0 = (r / tn) * 32, n0 = (r % tn) * 32;
    int64_t boff[1];
    offsets_of<int64_t>(b, batch, boff);
    const U* s = src + boff[0];
    U* d = dst + b * M * N;
    for (int k = ty; k < 32; k += kThreads / 32) {
      const int64_t n = n0 + k, m = m0 + tx;
      if (n < N && m < M) tile[k][tx] = s[n * M + m];
    }
    __syncthreads();
    for (int k = ty; k < 32; k += kThreads / 32) {
      const int64_t m = m0 + k, n = n0 + tx;
      if (m < M && n < N) d[m * N + n] = tile[tx][k];
    }
    __syncthreads();
  }
}

void transpose_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                      ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  const auto& perm = p.attrs<PermAttrs>().perm;
  const int64_t es = static_cast<int64_t>(size_of(out.dtype));
  void* y = alloc_output(out);
  if (numel(out.shape) == 0) return;
  const void* x = in[0].raw();
  const std::vector<int64_t> in_strides = row_major_strides(in[0].shape());
  std::vector<int64_t> src(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) src[i] = in_strides[perm[i]];
  const std::vector<int64_t> dst = row_major_strides(out.shape);
  const MultiStrides<2> s = collapse_strides<2>(out.shape, {dst, src}, p.name());
  const int r = s.rank;
  // The last two output axes [M, N] read from input axes laid out [N, M]
  // (a batched matrix transpose): tiles, the batch axes at any strides.
  if (r >= 2 && s.stride[1][r - 2] == 1 && s.stride[1][r - 1] == s.shape[r - 2] &&
      s.shape[r - 2] >= 16 && s.shape[r - 1] >= 16 && es <= 8) {
    const int64_t M = s.shape[r - 2], N = s.shape[r - 1];
    Shape bshape(s.shape, s.shape + (r - 2));
    std::vector<int64_t> bstr(s.stride[1], s.stride[1] + (r - 2));
    const MultiStrides<1> batch = collapse_strides<1>(bshape, {bstr}, p.name());
    const int64_t batches = numel(bshape);
    const int64_t tiles = batches * ((M + 31) / 32) * ((N + 31) / 32);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tiles, 65535LL * 8));
    visit_unit(es, p.name(), [&](auto u) {
      using U = decltype(u);
      KILN_LAUNCH(blocks, kThreads, 0, st, transpose_tiles<U>)
      (static_cast<U*>(y), static_cast<const U*>(x), batch, batches, M, N);
      check_launch("transpose_tiles");
    });
    return;
  }
  strided_copy(st, y, x, es, out.shape, dst, src, p.name());
}

// ---- BroadcastTo, Concatenate, Slice, SliceGrad ----

void broadcast_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                      ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  void* y = alloc_output(out);
  if (numel(out.shape) == 0) return;
  strided_copy(st, y, in[0].raw(), static_cast<int64_t>(size_of(out.dtype)), out.shape,
               row_major_strides(out.shape), broadcast_strides(out.shape, in[0].shape()), p.name());
}

// Each input is copied into its columns of out viewed as [outer, total * inner].
void concatenate_kernel(const KernelContext& ctx, const Primitive& p,
                        const std::vector<Array>& in, ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  const int ax = p.attrs<AxisAttrs>().axis;
  const int64_t es = static_cast<int64_t>(size_of(out.dtype));
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < ax; ++i) outer *= out.shape[i];
  for (size_t i = ax + 1; i < out.shape.size(); ++i) inner *= out.shape[i];
  char* y = static_cast<char*>(alloc_output(out));
  if (numel(out.shape) == 0) return;
  const int64_t row = out.shape[ax] * inner;
  int64_t pos = 0;
  for (const Array& x : in) {
    const int64_t chunk = x.shape()[ax] * inner;
    if (chunk > 0)
      strided_copy(st, y + pos * es, x.raw(), es, {outer, chunk}, {row, 1}, {chunk, 1}, p.name());
    pos += chunk;
  }
}

// Element j of the sliced array is element start + j * step of the full one:
// its offset in the full array and the full array's strides along the slice.
int64_t slice_offset(const SliceAttrs& s) {
  const std::vector<int64_t> full = row_major_strides(s.full);
  int64_t off = 0;
  for (size_t i = 0; i < full.size(); ++i) off += s.start[i] * full[i];
  return off;
}
std::vector<int64_t> slice_strides(const SliceAttrs& s) {
  std::vector<int64_t> st = row_major_strides(s.full);
  for (size_t i = 0; i < st.size(); ++i) st[i] *= s.step[i];
  return st;
}

void slice_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                  ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  const auto& s = p.attrs<SliceAttrs>();
  const int64_t es = static_cast<int64_t>(size_of(out.dtype));
  void* y = alloc_output(out);
  if (numel(out.shape) == 0) return;
  const char* x = static_cast<const char*>(in[0].raw()) + slice_offset(s) * es;
  strided_copy(st, y, x, es, out.shape, row_major_strides(out.shape), slice_strides(s), p.name());
}

// Zeros of the full shape, the gradient written where the slice came from.
void slice_grad_kernel(const KernelContext& ctx, const Primitive& p,
                       const std::vector<Array>& in, ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  const auto& s = p.attrs<SliceAttrs>();
  const int64_t es = static_cast<int64_t>(size_of(out.dtype));
  char* y = static_cast<char*>(alloc_output(out));
  const int64_t n = numel(out.shape);
  if (n == 0) return;
  KILN_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<size_t>(n * es), st));
  const Shape& g = in[0].shape();
  if (numel(g) == 0) return;
  strided_copy(st, y + slice_offset(s) * es, in[0].raw(), es, g, slice_strides(s),
               row_major_strides(g), p.name());
}

// ---- Take, ScatterAdd, OneHot ----

template <typename F>
void visit_index(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    default: fail(op, std::string("indices must be i32 or i64, got ") + name_of(dt));
  }
}

// Index v of an axis of length dim, negative ones counted from the end (as
// the cpu's read_indices with wrap).
__device__ inline int64_t wrap_index(int64_t v, int64_t dim) {
  return v < 0 ? v + dim : v;
}

// y[o, j, i] = x[o, idx[j], i] over [outer, n, inner] in units U (inner:
// units per row). An index outside [-dim, dim) is clamped into [0, dim).
template <typename I, typename U, typename Ix>
__global__ void take_rows(U* y, const U* x, const Ix* idx, I total, I n, I dim, I inner) {
  for (I e = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<I>(blockDim.x) * gridDim.x) {
    const I t = e / inner, i = e - t * inner;
    const I o = t / n, j = t - o * n;
    int64_t v = wrap_index(static_cast<int64_t>(idx[j]), static_cast<int64_t>(dim));
    v = v < 0 ? 0 : (v >= static_cast<int64_t>(dim) ? static_cast<int64_t>(dim) - 1 : v);
    y[e] = x[(o * dim + static_cast<I>(v)) * inner + i];
  }
}

// Take along an axis. The cpu reads the indices on the host and fails on one
// outside [-dim, dim); reading them here would wait for the GPU, so the
// kernel clamps such an index into range instead (as XLA's gather does).
void take_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  const int ax = p.attrs<AxisAttrs>().axis;
  const Array &a = in[0], &idx = in[1];
  const int64_t es = static_cast<int64_t>(size_of(a.dtype()));
  int64_t outer = 1, inner = 1;
  const int64_t dim = a.shape()[ax], n = idx.size();
  for (int i = 0; i < ax; ++i) outer *= a.shape()[i];
  for (size_t i = ax + 1; i < a.ndim(); ++i) inner *= a.shape()[i];
  void* y = alloc_output(out);
  visit_index(idx.dtype(), "take", [&](auto t) {
    using Ix = decltype(t);
    if (numel(out.shape) == 0) return;
    if (dim == 0) fail("take", "index at position 0 is outside [0, 0): the axis is empty");
    const void* x = a.raw();
    const int64_t unit = widest_unit(inner * es, {x, y});
    const int64_t row = inner * es / unit;  // units per row
    const int64_t total = outer * n * row;
    const bool small = total < (int64_t{1} << 31) && outer * dim * row < (int64_t{1} << 31);
    visit_unit(unit, "take", [&](auto u) {
      using U = decltype(u);
      U* yu = static_cast<U*>(y);
      const U* xu = static_cast<const U*>(x);
      const Ix* ix = ptr<Ix>(idx);
      if (small)
        KILN_LAUNCH(blocks_for(total, kThreads), kThreads, 0, st, take_rows<uint32_t>)
        (yu, xu, ix, static_cast<uint32_t>(total), static_cast<uint32_t>(n),
         static_cast<uint32_t>(dim), static_cast<uint32_t>(row));
      else
        KILN_LAUNCH(blocks_for(total, kThreads), kThreads, 0, st, take_rows<int64_t>)
        (yu, xu, ix, total, n, dim, row);
      check_launch("take");
    });
  });
}

template <typename T>
__device__ inline void atomic_add(T* p, T v) {
  if constexpr (std::is_same_v<T, int64_t>)
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  else
    atomicAdd(p, v);
}

// One thread per (o, i) column of y [outer, dim, inner]: the updates of
// column i are added in index order, each sum rounded to T as on the cpu
// (the same values, bit for bit). Indices outside [-dim, dim) are skipped.
template <typename T, typename Ix>
__global__ void scatter_columns(T* y, const T* u, const Ix* idx, int64_t outer, int64_t n,
                                int64_t dim, int64_t inner) {
  KILN_GRID_LOOP(q, outer * inner) {
    const int64_t o = q / inner, i = q - o * inner;
    T* dst = y + o * dim * inner + i;
    const T* src = u + o * n * inner + i;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t v = wrap_index(static_cast<int64_t>(idx[j]), dim);
      if (v < 0 || v >= dim) continue;
      dst[v * inner] = convert<T>(convert<acc_t<T>>(dst[v * inner]) +
                                  convert<acc_t<T>>(src[j * inner]));
    }
  }
}

// One thread per update element, added with an atomic (float sums in no
// fixed order). Indices outside [-dim, dim) are skipped.
template <typename T, typename Ix>
__global__ void scatter_atomic(T* y, const T* u, const Ix* idx, int64_t total, int64_t n,
                               int64_t dim, int64_t inner) {
  KILN_GRID_LOOP(e, total) {
    const int64_t t = e / inner, i = e - t * inner;
    const int64_t o = t / n, j = t - o * n;
    const int64_t v = wrap_index(static_cast<int64_t>(idx[j]), dim);
    if (v < 0 || v >= dim) continue;
    atomic_add(y + (o * dim + v) * inner + i, u[e]);
  }
}

// ScatterAdd of updates [outer, n, inner] into zeros [outer, dim, inner].
// The cpu fails on an index outside [-dim, dim) (read on the host); here
// such an update is dropped (as XLA's scatter does), since reading the
// indices would wait for the GPU. With enough columns for each to take its
// updates in order (deterministic, the cpu's rounding), one thread per
// column; otherwise atomics.
void scatter_add_kernel(const KernelContext& ctx, const Primitive& p,
                        const std::vector<Array>& in, ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  const auto& s = p.attrs<ScatterAttrs>();
  const Array &idx = in[0], &upd = in[1];
  int64_t outer = 1, inner = 1;
  const int64_t dim = s.shape[s.axis], n = idx.size();
  for (int i = 0; i < s.axis; ++i) outer *= s.shape[i];
  for (size_t i = s.axis + 1; i < s.shape.size(); ++i) inner *= s.shape[i];
  visit_index(idx.dtype(), "scatter_add", [&](auto t) {
    using Ix = decltype(t);
    visit_dtype(upd.dtype(), p.name(), [&](auto v) {
      using T = decltype(v);
      if constexpr (std::is_same_v<T, bool>) {
        fail(p.name(), std::string("no cuda kernel for dtype ") + name_of(upd.dtype()));
      } else {
        T* y = out_ptr<T>(out);
        const int64_t size = numel(s.shape);
        if (size == 0) return;
        KILN_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<size_t>(size) * sizeof(T), st));
        const int64_t total = outer * n * inner;
        if (total == 0) return;
        const T* u = ptr<T>(upd);
        const Ix* ix = ptr<Ix>(idx);
        const int64_t columns = outer * inner;
        if (n <= 1024 || n <= 64 * columns) {
          KILN_LAUNCH(blocks_for(columns, kThreads), kThreads, 0, st, scatter_columns)
          (y, u, ix, outer, n, dim, inner);
          check_launch("scatter_columns");
        } else {
          KILN_LAUNCH(blocks_for(total, kThreads), kThreads, 0, st, scatter_atomic)
          (y, u, ix, total, n, dim, inner);
          check_launch("scatter_atomic");
        }
      }
    });
  });
}

// ---- DynamicSlice, DynamicUpdateSlice ----

// A window of sizes `size` in an array of shape `full`, at starts read on
// the device (so that no launch waits for them), each clamped to
// [0, full - size] as the cpu's window_starts does.
struct Window {
  int rank = 0;
  int64_t full[kMaxDims] = {}, size[kMaxDims] = {};
};

Window window_of(const Shape& full, const Shape& size, const char* op) {
  if (full.size() > static_cast<size_t>(kMaxDims))
    fail(op, "takes at most " + std::to_string(kMaxDims) + " axes on cuda, got " + str(full));
  Window w;
  w.rank = static_cast<int>(full.size());
  for (int d = 0; d < w.rank; ++d) {
    w.full[d] = full[d];
    w.size[d] = size[d];
  }
  return w;
}

// Element e of the window (row-major over its sizes): its offset in the
// full array.
template <typename Ix>
__device__ inline int64_t window_offset(const Window& w, const Ix* starts, int64_t e) {
  int64_t off = 0, stride = 1;
  for (int d = w.rank - 1; d >= 0; --d) {
    const int64_t j = e % w.size[d], hi = w.full[d] - w.size[d];
    e /= w.size[d];
    const int64_t s = static_cast<int64_t>(starts[d]);
    off += ((s < 0 ? 0 : s > hi ? hi : s) + j) * stride;
    stride *= w.full[d];
  }
  return off;
}

// into false: dst[e] = src[offset(e)] (DynamicSlice); true: dst[offset(e)]
// = src[e] (DynamicUpdateSlice's update).
template <typename U, typename Ix>
__global__ void window_copy(U* dst, const U* src, const Ix* starts, Window w, int64_t n,
                            bool into) {
  KILN_GRID_LOOP(e, n) {
    const int64_t o = window_offset(w, starts, e);
    if (into) {
      dst[o] = src[e];
    } else {
      dst[e] = src[o];
    }
  }
}

void launch_window_copy(cudaStream_t st, void* dst, const void* src, const Array& starts,
                        const Window& w, int64_t n, size_t es, bool into, const char* op) {
  visit_index(starts.dtype(), op, [&](auto t) {
    using Ix = decltype(t);
    visit_unit(static_cast<int64_t>(es), op, [&](auto u) {
      using U = decltype(u);
      KILN_LAUNCH(blocks_for(n, kThreads), kThreads, 0, st, window_copy<U, Ix>)
      (static_cast<U*>(dst), static_cast<const U*>(src), ptr<Ix>(starts), w, n, into);
      check_launch(op);
    });
  });
}

void dynamic_slice_kernel(const KernelContext& ctx, const Primitive& p,
                          const std::vector<Array>& in, ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  void* y = alloc_output(out);
  const int64_t n = numel(out.shape);
  if (n == 0) return;
  launch_window_copy(st, y, in[0].raw(), in[1], window_of(in[0].shape(), out.shape, p.name()), n,
                     size_of(out.dtype), false, p.name());
}

// x, with update written over the window: the output may be x's memory (in
// place) or, where the window is all of x, update's.
void dynamic_update_slice_kernel(const KernelContext& ctx, const Primitive& p,
                                 const std::vector<Array>& in, ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  const Array &x = in[0], &u = in[1];
  void* y = alloc_output(out);
  const int64_t n = numel(out.shape);
  const size_t bytes = static_cast<size_t>(n) * size_of(out.dtype);
  if (u.size() == n) {
    if (n > 0 && y != u.raw())
      KILN_CUDA_CHECK(cudaMemcpyAsync(y, u.raw(), bytes, cudaMemcpyDeviceToDevice, st));
    return;
  }
  if (y != x.raw())
    KILN_CUDA_CHECK(cudaMemcpyAsync(y, x.raw(), bytes, cudaMemcpyDeviceToDevice, st));
  if (u.size() == 0) return;
  launch_window_copy(st, y, u.raw(), in[2], window_of(x.shape(), u.shape(), p.name()), u.size(),
                     size_of(out.dtype), true, p.name());
}

// y[i, d] = labels[i] == d; a label outside [0, depth) gives a row of zeros.
template <typename T, typename Ix>
__global__ void one_hot_rows(T* y, const Ix* labels, int64_t total, int64_t depth) {
  KILN_GRID_LOOP(e, total) {
    const int64_t i = e / depth, d = e - i * depth;
    y[e] = convert<T>(static_cast<int64_t>(labels[i]) == d ? 1 : 0);
  }
}

void one_hot_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                    ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  const int64_t depth = p.attrs<OneHotAttrs>().depth;
  visit_index(in[0].dtype(), "one_hot", [&](auto t) {
    using Ix = decltype(t);
    visit_dtype(out.dtype, p.name(), [&](auto v) {
      using T = decltype(v);
      T* y = out_ptr<T>(out);
      const int64_t total = numel(out.shape);
      if (total == 0) return;
      KILN_LAUNCH(blocks_for(total, kThreads), kThreads, 0, st, one_hot_rows)
      (y, ptr<Ix>(in[0]), total, depth);
      check_launch("one_hot");
    });
  });
}

// The output shares the input's storage.
void reshape_kernel(const KernelContext&, const Primitive&, const std::vector<Array>& in,
                    ArrayNode& out) {
  out.buffer = in[0].node()->buffer;
  out.offset = in[0].node()->offset;
}

}  // namespace

void register_layout(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Reshape)] = reshape_kernel;
  t.kernels[static_cast<int>(Op::Transpose)] = transpose_kernel;
  t.kernels[static_cast<int>(Op::BroadcastTo)] = broadcast_kernel;
  t.kernels[static_cast<int>(Op::Concatenate)] = concatenate_kernel;
  t.kernels[static_cast<int>(Op::Slice)] = slice_kernel;
  t.kernels[static_cast<int>(Op::SliceGrad)] = slice_grad_kernel;
  t.kernels[static_cast<int>(Op::Take)] = take_kernel;
  t.kernels[static_cast<int>(Op::ScatterAdd)] = scatter_add_kernel;
  t.kernels[static_cast<int>(Op::OneHot)] = one_hot_kernel;
  t.kernels[static_cast<int>(Op::DynamicSlice)] = dynamic_slice_kernel;
  t.kernels[static_cast<int>(Op::DynamicUpdateSlice)] = dynamic_update_slice_kernel;
}

}  // namespace kiln::cuda
