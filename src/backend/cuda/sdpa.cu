// kiln cuda backend: Sdpa and SdpaGrad, attention over separate q [B, T, H, D]
// and k, v [B, S, H, D] with a causal mask (query i sees keys j <= i + S - T)
// and an additive bias [B|1, H|1, T|1, S|1] (f32 for f32 and bf16, f64 for
// f64). One block per (batch·head, query) row in the forward: the row's
// scores over the keys it sees in shared memory (a causal row computes only
// those), their softmax, then P V. The backward as AttentionGrad's, in two
// kernels and no atomics (deterministic):
//   sdpa_dq: per query row, P and dP = dO Vᵀ over the keys it sees,
//     dS = P ⊙ (dP - rowsum(P ⊙ dP)), dQ = scale · dS K; the row's softmax
//     max, 1/l and rowsum(P ⊙ dP) go to scratch;
//   sdpa_dkv: per key row, P and dS over the queries that see it (from those
//     statistics), dK = scale · dSᵀ Q, dV = Pᵀ dO.
// Computed in f32 (f32, bf16) or f64 (f64); bf16 is a storage type here. A
// query that sees no key gets zeros and passes no gradient on.
//
// These are the simple kernels (a row of scores per block, rows read from
// global memory per key), not attention.cu's tiled flash-attention ones:
// they make the primitive run on every backend; tiling them is future work.
#include <limits>
#include <string>
#include <type_traits>

#include "backend/cuda/attention.cuh"
#include "ops/scalar.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 128;

// What a launch reads and writes, in storage type S (computed in T).
template <typename S>
struct SdpaArgs {
  using T = acc_t<S>;
  const S *q, *k, *v, *dout;
  const T* bias;                   // null: none
  int64_t bias_b, bias_h, bias_t;  // its strides (0 where broadcast); keys:
  int64_t bias_s;                  // 1, or 0 where broadcast
  S* out;                          // Sdpa: [B, T, H, D]; SdpaGrad: [B, T + 2S, H, D]
  T* stats;                        // SdpaGrad: per query row (b·H + h)·T + i, `rows` apart: the
             // softmax's max (0 where -inf), 1/l (0: no key seen), rowsum(P ⊙ dP)
  int64_t rows;
  int t, s, heads, dim;
  bool causal;
  T scale;

  __device__ int visible(int i) const {  // query i sees keys [0, visible(i))
    if (!causal) return s;
    const int n = i + 1 + s - t;
    return n < 0 ? 0 : n > s ? s : n;
  }
  __device__ int64_t e() const { return static_cast<int64_t>(heads) * dim; }
  __device__ T bias_of(int b, int h, int i, int j) const {
    return bias ? bias[b * bias_b + h * bias_h + i * bias_t + j * bias_s] : T(0);
  }
};

template <typename A>
__device__ inline A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

// The block's total (kMax: maximum, NaNs skipped) of each thread's v, given
// to every thread; red: shared, 33 values (blockDim.x a multiple of 32, at
// most 1024). The first barrier also orders any earlier use of red.
template <bool kMax, typename A>
__device__ inline A block_reduce(A v, A* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const A w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? (w > v ? w : v) : v + w;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A w = lane < warps ? red[lane] : (kMax ? neg_inf<A>() : A(0));
    for (int o = 16; o > 0; o >>= 1) {
      const A x = __shfl_xor_sync(0xffffffffu, w, o);
      w = kMax ? (x > w ? x : w) : w + x;
    }
    if (lane == 0) red[32] = w;
  }
  __syncthreads();
  return red[32];
}

template <typename T>
__device__ inline T* smem() {
  KILN_DYNAMIC_SHARED(unsigned char, sdpa_smem, 16);
  return reinterpret_cast<T*>(sdpa_smem);
}

// x · y over `dim` values: x in shared memory (computed type), y in global
// memory (storage type).
template <typename T, typename S>
__device__ inline T dot(const T* x, const S* y, int dim) {
  T acc = 0;
  for (int d = 0; d < dim; ++d) acc += x[d] * load(y, d);
  return acc;
}

// p[0, n) = exp(scale · q kⱼ + bias - mu) for query i of (b, h), n = the keys
// it sees; returns mu (the row's max, 0 where it is -inf) and sets inv to
// 1 / Σ p (0 for a row of no key or only -inf scores; NaN where a score is).
template <typename S, typename T>
__device__ T row_probabilities(const SdpaArgs<S>& a, int b, int h, int i, const T* qs, T* p, int n,
                               T* red, T& inv) {
  const S* kb = a.k + static_cast<int64_t>(b) * a.s * a.e() + static_cast<int64_t>(h) * a.dim;
  T m = neg_inf<T>();
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const T sc = dot(qs, kb + j * a.e(), a.dim) * a.scale + a.bias_of(b, h, i, j);
    p[j] = sc;
    m = sc > m ? sc : m;
  }
  m = block_reduce<true>(m, red);
  const T mu = m == neg_inf<T>() ? T(0) : m;
  T l = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) l += (p[j] = scalar<Op::Exp>(T(p[j] - mu)));
  l = block_reduce<false>(l, red);
  inv = l == T(0) ? T(0) : T(1) / l;
  return mu;
}

// Loads `dim` values of a global row into shared memory.
template <typename S, typename T>
__device__ inline void load_row(const S* g, int dim, T* x) {
  for (int d = threadIdx.x; d < dim; d += blockDim.x) x[d] = load(g, d);
}

// Grid (B·H, T). Shared: q [dim], p [S].
template <typename S>
__global__ void __launch_bounds__(kThreads) sdpa_fwd(SdpaArgs<S> a) {
  using T = acc_t<S>;
  KILN_SHARED(T, red, [33]);
  const int b = blockIdx.x / a.heads, h = blockIdx.x % a.heads, i = blockIdx.y;
  const int64_t row = (static_cast<int64_t>(b) * a.t + i) * a.e() + static_cast<int64_t>(h) * a.dim;
  T* qs = smem<T>();
  T* p = qs + a.dim;
  load_row(a.q + row, a.dim, qs);
  __syncthreads();
  const int n = a.visible(i);
  T inv;
  row_probabilities(a, b, h, i, qs, p, n, red, inv);
  const S* vb = a.v + static_cast<int64_t>(b) * a.s * a.e() + static_cast<int64_t>(h) * a.dim;
  for (int d = threadIdx.x; d < a.dim; d += blockDim.x) {
    T acc = 0;
    for (int j = 0; j < n; ++j) acc += p[j] * load(vb + j * a.e(), d);
    a.out[row + d] = convert<S>(T(acc * inv));
  }
}

// Grid (B·H, T). Shared: q, dO [dim], p, dS [S].
template <typename S>
__global__ void __launch_bounds__(kThreads) sdpa_dq(SdpaArgs<S> a) {
  using T = acc_t<S>;
  KILN_SHARED(T, red, [33]);
  const int b = blockIdx.x / a.heads, h = blockIdx.x % a.heads, i = blockIdx.y;
  const int64_t e = a.e(), hd = static_cast<int64_t>(h) * a.dim;
  const int64_t row = (static_cast<int64_t>(b) * a.t + i) * e + hd;
  T* qs = smem<T>();
  T* dos = qs + a.dim;
  T* p = dos + a.dim;
  T* ds = p + a.s;
  load_row(a.q + row, a.dim, qs);
  load_row(a.dout + row, a.dim, dos);
  __syncthreads();
  const int n = a.visible(i);
  T inv;
  const T mu = row_probabilities(a, b, h, i, qs, p, n, red, inv);
  const S* vb = a.v + static_cast<int64_t>(b) * a.s * e + hd;
  T total = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    p[j] *= inv;
    ds[j] = dot(dos, vb + j * e, a.dim);  // dP
    total += p[j] * ds[j];
  }
  total = block_reduce<false>(total, red);
  for (int j = threadIdx.x; j < n; j += blockDim.x) ds[j] = p[j] * (ds[j] - total);
  __syncthreads();
  const S* kb = a.k + static_cast<int64_t>(b) * a.s * e + hd;
  S* dq = a.out + (static_cast<int64_t>(b) * (a.t + 2 * a.s) + i) * e + hd;
  for (int d = threadIdx.x; d < a.dim; d += blockDim.x) {
    T acc = 0;
    for (int j = 0; j < n; ++j) acc += ds[j] * load(kb + j * e, d);
    dq[d] = convert<S>(T(acc * a.scale));
  }
  if (threadIdx.x == 0) {
    const int64_t r = static_cast<int64_t>(blockIdx.x) * a.t + i;
    a.stats[r] = mu;
    a.stats[a.rows + r] = inv;
    a.stats[2 * a.rows + r] = total;
  }
}

// Grid (B·H, S), after sdpa_dq. Shared: k, v [dim], p, dS [T].
template <typename S>
__global__ void __launch_bounds__(kThreads) sdpa_dkv(SdpaArgs<S> a) {
  using T = acc_t<S>;
  const int b = blockIdx.x / a.heads, h = blockIdx.x % a.heads, j = blockIdx.y;
  const int64_t e = a.e(), hd = static_cast<int64_t>(h) * a.dim;
  const int64_t key = (static_cast<int64_t>(b) * a.s + j) * e + hd;
  T* ks = smem<T>();
  T* vs = ks + a.dim;
  T* p = vs + a.dim;
  T* ds = p + a.t;
  load_row(a.k + key, a.dim, ks);
  load_row(a.v + key, a.dim, vs);
  __syncthreads();
  // The queries that see key j: i >= j - (S - T) under the causal mask.
  const int first = a.causal ? (j - (a.s - a.t) > 0 ? j - (a.s - a.t) : 0) : 0;
  const S* qb = a.q + static_cast<int64_t>(b) * a.t * e + hd;
  const S* dob = a.dout + static_cast<int64_t>(b) * a.t * e + hd;
  const T* stats = a.stats + static_cast<int64_t>(blockIdx.x) * a.t;
  for (int i = first + threadIdx.x; i < a.t; i += blockDim.x) {
    const T inv = stats[a.rows + i];
    T pij = 0, dsij = 0;
    if (inv != T(0)) {  // NaN rows pass NaN on, as on the other backends
      const T sc = dot(ks, qb + i * e, a.dim) * a.scale + a.bias_of(b, h, i, j);
      pij = scalar<Op::Exp>(T(sc - stats[i])) * inv;
      dsij = pij * (dot(vs, dob + i * e, a.dim) - stats[2 * a.rows + i]);
    }
    p[i] = pij;
    ds[i] = dsij;
  }
  __syncthreads();
  S* dk = a.out + (static_cast<int64_t>(b) * (a.t + 2 * a.s) + a.t + j) * e + hd;
  S* dv = dk + static_cast<int64_t>(a.s) * e;
  for (int d = threadIdx.x; d < a.dim; d += blockDim.x) {
    T gk = 0, gv = 0;
    for (int i = first; i < a.t; ++i) {
      gk += ds[i] * load(qb + i * e, d);
      gv += p[i] * load(dob + i * e, d);
    }
    dk[d] = convert<S>(T(gk * a.scale));
    dv[d] = convert<S>(T(gv));
  }
}

template <typename S>
SdpaArgs<S> sdpa_args(const Primitive& p, const std::vector<Array>& in, size_t bias_at, S* out) {
  using T = acc_t<S>;
  const SdpaAttrs& at = p.attrs<SdpaAttrs>();
  const Shape &q = in[0].shape(), &k = in[1].shape();
  SdpaArgs<S> a{};
  a.q = ptr<S>(in[0]);
  a.k = ptr<S>(in[1]);
  a.v = ptr<S>(in[2]);
  a.out = out;
  a.t = static_cast<int>(q[1]);
  a.s = static_cast<int>(k[1]);
  a.heads = static_cast<int>(q[2]);
  a.dim = static_cast<int>(q[3]);
  a.rows = q[0] * q[2] * q[1];
  a.causal = at.causal;
  a.scale = static_cast<T>(at.scale);
  if (at.bias) {
    const Shape& bs = in[bias_at].shape();
    a.bias = ptr<T>(in[bias_at]);
    a.bias_s = bs[3] == 1 ? 0 : 1;
    a.bias_t = bs[2] == 1 ? 0 : bs[3];
    a.bias_h = bs[1] == 1 ? 0 : bs[2] * bs[3];
    a.bias_b = bs[0] == 1 ? 0 : bs[1] * bs[2] * bs[3];
  }
  return a;
}

void sdpa_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  attn::visit_dtype(in[0].dtype(), p.name(), [&](auto tag) {
    using S = decltype(tag);
    using T = acc_t<S>;
    S* y = out_ptr<S>(out);
    if (numel(out.shape) == 0) return;
    const SdpaArgs<S> a = sdpa_args<S>(p, in, 3, y);
    const size_t smem = sizeof(T) * (static_cast<size_t>(a.dim) + a.s);
    attn::launch_kernel(sdpa_fwd<S>, ctx, s, in[0].shape()[0] * a.heads, a.t, kThreads, smem, a,
                        p.name(), "sdpa_fwd", 33 * sizeof(T));
  });
}

void sdpa_grad_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                      ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  attn::visit_dtype(in[0].dtype(), p.name(), [&](auto tag) {
    using S = decltype(tag);
    using T = acc_t<S>;
    S* y = out_ptr<S>(out);
    if (numel(out.shape) == 0) return;
    SdpaArgs<S> a = sdpa_args<S>(p, in, 4, y);
    a.dout = ptr<S>(in[3]);
    const int64_t bh = in[0].shape()[0] * a.heads;
    if (a.t == 0) {  // no query: dK and dV are zeros
      KILN_CUDA_CHECK(cudaMemsetAsync(y, 0, numel(out.shape) * sizeof(S), s));
      return;
    }
    const size_t stat_bytes = 3 * static_cast<size_t>(a.rows) * sizeof(T);
    a.stats = static_cast<T*>(ctx.scratch->allocate(stat_bytes));
    // Released once both kernels are queued (stream-ordered), or on a failed launch.
    struct Release {
      Allocator* alloc;
      void* mem;
      size_t bytes;
      ~Release() { alloc->release(mem, bytes); }
    } release{ctx.scratch, a.stats, stat_bytes};
    const size_t dq_smem = sizeof(T) * (2 * static_cast<size_t>(a.dim) + 2 * a.s);
    const size_t dkv_smem = sizeof(T) * (2 * static_cast<size_t>(a.dim) + 2 * a.t);
    attn::launch_kernel(sdpa_dq<S>, ctx, s, bh, a.t, kThreads, dq_smem, a, p.name(), "sdpa_dq",
                        33 * sizeof(T));
    if (a.s > 0)
      attn::launch_kernel(sdpa_dkv<S>, ctx, s, bh, a.s, kThreads, dkv_smem, a, p.name(),
                          "sdpa_dkv");
  });
}

}  // namespace

void register_sdpa(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Sdpa)] = sdpa_kernel;
  t.kernels[static_cast<int>(Op::SdpaGrad)] = sdpa_grad_kernel;
}

}  // namespace kiln::cuda
