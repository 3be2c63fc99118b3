// kiln cuda backend: elementwise kernels — unary, binary and comparison ops
// with NumPy broadcasting (each op's math is scalar<op> of ops/scalar.h, so
// that the GPU computes what the CPU does), Where and Cast between every
// pair of dtypes. (The views' entries, which run nothing, come from
// register_views_and_scalar_ops, as on every backend.)
#include <array>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_common.cuh"
#include "ops/op_facts.h"
#include "ops/scalar.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

[[noreturn]] void no_kernel(const Primitive& p, DType dt) {
  fail(p.name(), std::string("no cuda kernel for dtype ") + name_of(dt));
}

// V consecutive elements, loaded or stored as one access of at most 16 bytes.
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename T, int K>
struct Inputs {
  const T* p[K];
};

// y[i] = f(x_0[.], ..., x_{K-1}[.]) for every element i of the (contiguous)
// output, input k read at its strides s.stride[k] (0 where it is broadcast).
// Each thread takes chunks of V consecutive elements. V > 1 only where the
// host checked (vector_ok) that the innermost axis is a multiple of V long,
// each input's innermost stride is 0 (bit k of `bcast`: one value for the
// whole chunk) or 1 (one aligned vector, its other strides multiples of V),
// and every pointer is aligned to its vectors. A thread reads a chunk before
// it writes it, so the output may be the memory of a same-shaped input.
template <int V, typename I, typename R, typename T, int K, typename F>
__global__ void map_kernel(R* y, Inputs<T, K> x, MultiStrides<K> s, I chunks, unsigned bcast,
                           F f) {
  for (I c = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<I>(blockDim.x) * gridDim.x) {
    I off[K];
    offsets_of<I>(c * V, s, off);
    T a[K][V];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (V == 1 || (bcast >> k & 1u)) {
        const T v = x.p[k][off[k]];
#pragma unroll
        for (int j = 0; j < V; ++j) a[k][j] = v;
      } else {
        const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(x.p[k] + off[k]);
#pragma unroll
        for (int j = 0; j < V; ++j) a[k][j] = v.v[j];
      }
    }
    Vec<R, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if constexpr (K == 1)
        r.v[j] = f(a[0][j]);
      else
        r.v[j] = f(a[0][j], a[1][j]);
    }
    *reinterpret_cast<Vec<R, V>*>(y + c * V) = r;
  }
}

bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Whether map_kernel may take chunks of V elements (see there); sets bcast.
template <int V, typename R, typename T, int K>
bool vector_ok(const MultiStrides<K>& s, const R* y, const Inputs<T, K>& x, unsigned& bcast) {
  bcast = 0;
  if (s.rank == 0 || s.shape[s.rank - 1] % V != 0 || !aligned(y, sizeof(R) * V)) return false;
  const int last = s.rank - 1;
  for (int k = 0; k < K; ++k) {
    if (s.stride[k][last] == 0) {
      bcast |= 1u << k;
      continue;
    }
    if (s.stride[k][last] != 1 || !aligned(x.p[k], sizeof(T) * V)) return false;
    for (int d = 0; d < last; ++d)
      if (s.stride[k][d] % V != 0) return false;
  }
  return true;
}

// Runs map_kernel over out's shape, inputs in[0..K) (of element type T, each
// broadcast to out's shape) and output element type R.
template <typename R, typename T, int K, typename F>
void map(cudaStream_t st, const char* name, ArrayNode& out, const std::vector<Array>& in, F f) {
  R* y = out_ptr<R>(out);
  const int64_t n = numel(out.shape);
  if (n == 0) return;
  Inputs<T, K> x;
  std::array<std::vector<int64_t>, K> strides;
  for (int k = 0; k < K; ++k) {
    x.p[k] = ptr<T>(in[k]);
    strides[k] = broadcast_strides(out.shape, in[k].shape());
  }
  const MultiStrides<K> s = collapse_strides<K>(out.shape, strides, name);
  constexpr int V = static_cast<int>(16 / (sizeof(T) > sizeof(R) ? sizeof(T) : sizeof(R)));
  unsigned bcast = 0;
  if (!fits_u32(s)) {
    KILN_LAUNCH(blocks_for(n, kThreads), kThreads, 0, st, map_kernel<1, int64_t>)
    (y, x, s, n, 0u, f);
  } else if (vector_ok<V>(s, y, x, bcast)) {
    const int64_t chunks = n / V;
    KILN_LAUNCH(blocks_for(chunks, kThreads), kThreads, 0, st, map_kernel<V, uint32_t>)
    (y, x, s, static_cast<uint32_t>(chunks), bcast, f);
  } else {
    KILN_LAUNCH(blocks_for(n, kThreads), kThreads, 0, st, map_kernel<1, uint32_t>)
    (y, x, s, static_cast<uint32_t>(n), 0u, f);
  }
  check_launch(name);
}

// ---- the element functions ----
template <Op op, typename T>
struct UnaryF {
  __device__ T operator()(T x) const { return convert<T>(scalar<op>(convert<acc_t<T>>(x))); }
};

template <Op op, typename T>
struct BinaryF {
  __device__ T operator()(T x, T y) const {
    using A = acc_t<T>;
    if constexpr (op == Op::Div && std::is_integral_v<A>) {
      // The cpu fails on a zero divisor, checked on the host before its
      // kernel runs; reading the divisor here would wait for the GPU, so a
      // zero divisor gives 0 instead (the hardware's quotient is unspecified).
      if (y == T(0)) return T(0);
    }
    return convert<T>(scalar<op>(convert<A>(x), convert<A>(y)));
  }
};

template <Op op, typename T>
struct CompareF {
  __device__ bool operator()(T x, T y) const {
    using A = acc_t<T>;
    return scalar<op>(convert<A>(x), convert<A>(y));
  }
};

// As the host's convert() (core/array.cpp): to bool through f32 (f32(v) != 0),
// to bf16 through f32 rounded to nearest even, otherwise C++'s static_cast
// (from bf16 through f32).
template <typename To, typename From>
struct CastF {
  __device__ To operator()(From v) const {
    if constexpr (std::is_same_v<To, bool>)
      return convert<float>(v) != 0.0f;
    else
      return convert<To>(v);
  }
};

// ---- kernels ----

// Neg, ReLU and Abs also run on integers; the other unary ops on floats.
void unary_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                  ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const DType dt = in[0].dtype();
  visit_dtype(dt, p.name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      no_kernel(p, dt);
    } else {
      visit_scalar(p.op(), p.name(), [&](auto o) {
        constexpr Op kOp = decltype(o)::value;
        if constexpr (op_kind(kOp) != OpKind::Unary)
          fail(p.name(), "not a unary primitive");
        else if constexpr (std::is_floating_point_v<A> || op_has(kOp, kIntegers))
          map<T, T, 1>(s, p.name(), out, in, UnaryF<kOp, T>{});
        else
          no_kernel(p, dt);
      });
    }
  });
}

void binary_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                   ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const DType dt = in[0].dtype();
  visit_dtype(dt, p.name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool>) {
      no_kernel(p, dt);
    } else {
      visit_scalar(p.op(), p.name(), [&](auto o) {
        constexpr Op kOp = decltype(o)::value;
        if constexpr (op_kind(kOp) == OpKind::Binary)
          map<T, T, 2>(s, p.name(), out, in, BinaryF<kOp, T>{});
        else
          fail(p.name(), "not a binary primitive");
      });
    }
  });
}

void compare_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                    ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  visit_dtype(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    visit_scalar(p.op(), p.name(), [&](auto o) {
      constexpr Op kOp = decltype(o)::value;
      if constexpr (op_kind(kOp) == OpKind::Compare)
        map<bool, T, 2>(s, p.name(), out, in, CompareF<kOp, T>{});
      else
        fail(p.name(), "not a comparison primitive");
    });
  });
}

// y = c ? a : b over the broadcast shape (operands 0, 1, 2: c, a, b).
template <typename I, typename T>
__global__ void where_kernel(T* y, const bool* c, const T* a, const T* b, MultiStrides<3> s,
                             I n) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<I>(blockDim.x) * gridDim.x) {
    I off[3];
    offsets_of<I>(i, s, off);
    y[i] = c[off[0]] ? a[off[1]] : b[off[2]];
  }
}

void where_kernel_host(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                       ArrayNode& out) {
  cudaStream_t st = begin(ctx);
  visit_dtype(in[1].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    T* y = out_ptr<T>(out);
    const int64_t n = numel(out.shape);
    if (n == 0) return;
    std::array<std::vector<int64_t>, 3> strides;
    for (int k = 0; k < 3; ++k) strides[k] = broadcast_strides(out.shape, in[k].shape());
    const MultiStrides<3> s = collapse_strides<3>(out.shape, strides, p.name());
    const bool* c = ptr<bool>(in[0]);
    const T* a = ptr<T>(in[1]);
    const T* b = ptr<T>(in[2]);
    if (fits_u32(s))
      KILN_LAUNCH(blocks_for(n, kThreads), kThreads, 0, st, where_kernel<uint32_t>)
      (y, c, a, b, s, static_cast<uint32_t>(n));
    else
      KILN_LAUNCH(blocks_for(n, kThreads), kThreads, 0, st, where_kernel<int64_t>)
      (y, c, a, b, s, n);
    check_launch("where");
  });
}

// Float-to-integer casts of NaN or of values outside the integer's range are
// undefined in C++; the GPU saturates them (NaN gives 0), x86 CPUs give the
// lowest integer.
void cast_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const DType from = in[0].dtype(), to = out.dtype;
  if (from == to) {
    void* y = alloc_output(out);
    if (in[0].nbytes() > 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(y, in[0].raw(), in[0].nbytes(), cudaMemcpyDeviceToDevice, s));
    return;
  }
  visit_dtype(from, "cast", [&](auto f) {
    using From = decltype(f);
    visit_dtype(to, "cast", [&](auto t) {
      using To = decltype(t);
      if constexpr (!std::is_same_v<From, To>)
        map<To, From, 1>(s, "cast", out, in, CastF<To, From>{});
    });
  });
}

}  // namespace

void register_elementwise(KernelTable& t) {
  register_views_and_scalar_ops(t, unary_kernel, binary_kernel, compare_kernel);
  t.kernels[static_cast<int>(Op::Where)] = where_kernel_host;
  t.kernels[static_cast<int>(Op::Cast)] = cast_kernel;
}

}  // namespace kiln::cuda
