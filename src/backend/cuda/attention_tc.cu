// kiln cuda backend: the fused attention in bf16 on tensor cores (Attention
// and AttentionGrad over the packed qkv [B, T, 3, H, D], as attention.cu's
// kernels, whose structure these follow): every GEMM of a tile — S = Q Kᵀ,
// O += P V, dP = dO Vᵀ, dQ += dS K, and, with rows of keys, Sᵀ = K Qᵀ,
// dPᵀ = V dOᵀ, dV += Pᵀ dO, dK += dSᵀ Q — runs on WMMA 16x16x16 bf16
// fragments with f32 sums; the softmax, its statistics and its gradient stay
// f32, and P and dS are rounded to bf16 for the GEMMs that take them (as the
// cpu's bf16 kernels do). No T×T in device memory.
//
// A block is 4 warps over 64 row tokens of one (batch, head) pair
// (blockIdx.x = b·H + h, blockIdx.y: the tile of rows); each warp owns 16
// rows, and loops over the tokens in tiles of 64 columns. Tiles of q, k, v
// and dO live in shared memory row-major [tokens][DM + 8] (DM: the head dim
// rounded up to 32, 64 or 128, zero-filled, as are tokens past T); a GEMM's
// f32 result goes through a per-warp [16][64 or DM + 4] scratch, where each
// lane reads row lane / 2 and half of the columns (lane % 2), the softmax's
// row statistics combining the two halves with one shuffle. The forward
// keeps its output rows in those lanes' registers (the online softmax
// rescales them per tile); the backward's dQ, dK and dV stay in WMMA
// accumulators. Needs sm_80 or later (the build targets sm_90).
#include <mma.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

#include "backend/cuda/attention.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "attention_tc.cu: bf16 WMMA fragments need sm_80 or later"
#endif

namespace kiln::cuda::attn {
namespace {

using namespace nvcuda;
using bf16_t = __nv_bfloat16;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // row tokens per block
constexpr int kCols = 64;           // column tokens per tile
constexpr float kInf = std::numeric_limits<float>::infinity();

// Strides (in elements) of the shared tiles for padded head dim DM.
template <int DM_>
struct Tc {
  static constexpr int DM = DM_;
  static constexpr int LD = DM + 8;                           // bf16 [tokens][LD] tiles
  static constexpr int LP = kCols + 8;                        // bf16 [16][LP] P, dS
  static constexpr int LS = (kCols > DM ? kCols : DM) + 4;    // f32 [16][LS] scratch
  static constexpr int HC = kCols / 2, HD = DM / 2;           // a lane's half of a row
  static constexpr int TILE = kCols * LD, ROWS = kRows * LD;  // bf16 tile sizes
  static constexpr int P = 16 * LP, Y = 16 * LS;              // per-warp sizes
  static_assert(DM % 16 == 0 && LD % 8 == 0 && LP % 8 == 0 && LS % 4 == 0, "WMMA's ldm");
  // Every region below starts 32-byte aligned (load/store_matrix_sync).
  static_assert((TILE * 2) % 32 == 0 && (ROWS * 2) % 32 == 0 && (P * 2) % 32 == 0 &&
                (Y * 4) % 32 == 0);
};

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <bool kColMajor>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t,
                             std::conditional_t<kColMajor, wmma::col_major, wmma::row_major>>;

__device__ __forceinline__ float max_of(float a, float b) {
  return b > a ? b : a;  // NaN b skipped, as the other kernels' row maxima
}

// x[r][d] (row stride LD) = the r-th of the `n` valid token rows from g
// (`stride` apart), dims d < dim; zero elsewhere up to ROWS × DM.
template <class L, int ROWS>
__device__ __forceinline__ void load_rows(const bf16_t* __restrict__ g, int64_t stride, int n,
                                          int dim, bf16_t* x) {
  for (int i = threadIdx.x; i < ROWS * L::DM; i += kThreads) {
    const int r = i / L::DM, d = i % L::DM;
    x[r * L::LD + d] = r < n && d < dim ? g[r * stride + d] : __float2bfloat16_rn(0.0f);
  }
}

// y [16][N] (f32, row stride ly) = a [16][KD] (bf16, row stride la) · B, B
// [KD][N] read from b: with kBT, b holds Bᵀ row-major (b[n·lb + k]: a tile of
// tokens × dims, for products with a transposed tile), else B row-major
// (b[k·lb + n]).
template <int KD, int N, bool kBT>
__device__ __forceinline__ void warp_gemm(const bf16_t* a, int la, const bf16_t* b, int lb,
                                          float* y, int ly) {
#pragma unroll
  for (int n = 0; n < N; n += 16) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < KD; k += 16) {
      FragA fa;
      FragB<kBT> fb;
      wmma::load_matrix_sync(fa, a + k, la);
      wmma::load_matrix_sync(fb, kBT ? b + n * lb + k : b + k * lb + n, lb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(y + n, acc, ly, wmma::mem_row_major);
  }
}

// acc[n / 16] += a [16][KD] · b [KD][N] (both bf16 row-major).
template <int KD, int N>
__device__ __forceinline__ void warp_gemm_acc(const bf16_t* a, int la, const bf16_t* b, int lb,
                                              FragC (&acc)[N / 16]) {
#pragma unroll
  for (int k = 0; k < KD; k += 16) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + k, la);
#pragma unroll
    for (int n = 0; n < N; n += 16) {
      FragB<false> fb;
      wmma::load_matrix_sync(fb, b + k * lb + n, lb);
      wmma::mma_sync(acc[n / 16], fa, fb, acc[n / 16]);
    }
  }
}

template <int N>
__device__ __forceinline__ void zero(FragC (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) wmma::fill_fragment(acc[i], 0.0f);
}

// Where a block's work is: its (batch, head), its first row token, and this
// lane's row (of its warp's 16) and half of the columns.
struct Where {
  int b, h, row0, warp, r, half;
  int64_t e, ld;  // a token's row of q (k, v, dO, out): H·D; of qkv: 3·H·D
  __device__ Where(int heads, int dim)
      : b(static_cast<int>(blockIdx.x) / heads),
        h(static_cast<int>(blockIdx.x) % heads),
        row0(static_cast<int>(blockIdx.y) * kRows),
        warp(static_cast<int>(threadIdx.x) / 32),
        r(static_cast<int>(threadIdx.x) % 32 / 2),
        half(static_cast<int>(threadIdx.x) % 2),
        e(static_cast<int64_t>(heads) * dim),
        ld(3 * e) {}
  // Token t's row of part p (0 q, 1 k, 2 v) of qkv at this head.
  __device__ __forceinline__ const bf16_t* qkv(const AttnArgs<bf16_t>& a, int t, int p) const {
    return a.qkv + (static_cast<int64_t>(b) * a.tokens + t) * ld + p * e +
           static_cast<int64_t>(h) * a.dim;
  }
  // ... of dO.
  __device__ __forceinline__ const bf16_t* dout(const AttnArgs<bf16_t>& a, int t) const {
    return a.dout + (static_cast<int64_t>(b) * a.tokens + t) * e + static_cast<int64_t>(h) * a.dim;
  }
  // ... of the output ([B, T, H, D] rows e apart, or [B, T, 3, H, D] ld apart).
  __device__ __forceinline__ bf16_t* out(const AttnArgs<bf16_t>& a, int t, int64_t stride) const {
    return a.out + (static_cast<int64_t>(b) * a.tokens + t) * stride +
           static_cast<int64_t>(h) * a.dim;
  }
};

// One step of the online softmax for this lane's half row of a score tile
// in y (f32, row stride LS): the row's running max m (both halves', one
// shuffle; NaN-free; the exponent's offset mu is 0 while the max is -inf, so
// that exp(-inf - mu) = 0) grows to cover scale · y over the first `valid`
// columns (-inf past them); p = exp(scale · y - mu); returns the factor alpha
// by which the sums so far are rescaled.
template <class L>
__device__ __forceinline__ float online_step(const float* y, const Where& w, int valid, float scale,
                                             float& m, float (&p)[L::HC]) {
  float mx = -kInf;
#pragma unroll
  for (int j = 0; j < L::HC; ++j) {
    const int c = w.half * L::HC + j;
    p[j] = c < valid ? y[w.r * L::LS + c] * scale : -kInf;
    mx = max_of(mx, p[j]);
  }
  mx = max_of(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  const float mn = max_of(m, mx);
  const float mu = mn == -kInf ? 0.0f : mn;
  const float alpha = expf(m - mu);
  m = mn;
#pragma unroll
  for (int j = 0; j < L::HC; ++j) p[j] = expf(p[j] - mu);
  return alpha;
}

// Stores accumulators acc (16 × DM) to this warp's scratch y and writes this
// lane's row (token t, when it exists) and half of the dims, times `mul`, to
// part `part` of the output row (`stride` apart).
template <class L>
__device__ __forceinline__ void store_acc(FragC (&acc)[L::DM / 16], float* y, const Where& w,
                                          const AttnArgs<bf16_t>& a, int t, int64_t stride,
                                          int part, float mul) {
#pragma unroll
  for (int n = 0; n < L::DM / 16; ++n)
    wmma::store_matrix_sync(y + 16 * n, acc[n], L::LS, wmma::mem_row_major);
  __syncwarp();
  if (t >= a.tokens) return;
  bf16_t* dst = w.out(a, t, stride) + part * w.e;
#pragma unroll
  for (int k = 0; k < L::HD; ++k) {
    const int d = w.half * L::HD + k;
    if (d < a.dim) dst[d] = __float2bfloat16_rn(y[w.r * L::LS + d] * mul);
  }
}

// Attention. Shared: qs [64][LD], ks, vs [64][LD]; per warp ps [16][LP],
// ys [16][LS].
template <class L>
__global__ void __launch_bounds__(kThreads) attention_fwd_tc_kernel(AttnArgs<bf16_t> a) {
  bf16_t* qs = dyn_smem<bf16_t>();
  bf16_t* ks = qs + L::ROWS;
  bf16_t* vs = ks + L::TILE;
  const Where w(a.heads, a.dim);
  bf16_t* ps = vs + L::TILE + w.warp * L::P;
  float* ys = reinterpret_cast<float*>(vs + L::TILE + kWarps * L::P) + w.warp * L::Y;
  const int Tn = a.tokens;
  const bf16_t* qw = qs + w.warp * 16 * L::LD;  // this warp's rows of q

  load_rows<L, kRows>(w.qkv(a, w.row0, 0), w.ld, Tn - w.row0, a.dim, qs);
  float m = -kInf, l = 0.0f, o[L::HD];
#pragma unroll
  for (int k = 0; k < L::HD; ++k) o[k] = 0.0f;
  for (int k0 = 0; k0 < Tn; k0 += kCols) {
    __syncthreads();  // every warp is done with the previous tile
    load_rows<L, kCols>(w.qkv(a, k0, 1), w.ld, Tn - k0, a.dim, ks);
    load_rows<L, kCols>(w.qkv(a, k0, 2), w.ld, Tn - k0, a.dim, vs);
    __syncthreads();
    warp_gemm<L::DM, kCols, true>(qw, L::LD, ks, L::LD, ys, L::LS);
    __syncwarp();
    float p[L::HC];
    const float alpha = online_step<L>(ys, w, Tn - k0, a.scale, m, p);
    l *= alpha;
#pragma unroll
    for (int j = 0; j < L::HC; ++j) {
      l += p[j];
      ps[w.r * L::LP + w.half * L::HC + j] = __float2bfloat16_rn(p[j]);
    }
#pragma unroll
    for (int k = 0; k < L::HD; ++k) o[k] *= alpha;
    __syncwarp();
    warp_gemm<kCols, L::DM, false>(ps, L::LP, vs, L::LD, ys, L::LS);
    __syncwarp();
#pragma unroll
    for (int k = 0; k < L::HD; ++k) o[k] += ys[w.r * L::LS + w.half * L::HD + k];
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  const float inv = 1.0f / l;
  const int t = w.row0 + w.warp * 16 + w.r;
  if (t >= Tn) return;
  bf16_t* y = w.out(a, t, w.e);
#pragma unroll
  for (int k = 0; k < L::HD; ++k) {
    const int d = w.half * L::HD + k;
    if (d < a.dim) y[d] = __float2bfloat16_rn(o[k] * inv);
  }
}

// AttentionGrad, dQ and the row statistics (rows: queries). Shared: qs, os
// (dO) [64][LD], ks, vs [64][LD]; per warp ps (dS) [16][LP], ys (S), zs (dP)
// [16][LS].
template <class L>
__global__ void __launch_bounds__(kThreads) attention_dq_tc_kernel(AttnArgs<bf16_t> a) {
  bf16_t* qs = dyn_smem<bf16_t>();
  bf16_t* os = qs + L::ROWS;
  bf16_t* ks = os + L::ROWS;
  bf16_t* vs = ks + L::TILE;
  const Where w(a.heads, a.dim);
  bf16_t* ps = vs + L::TILE + w.warp * L::P;
  float* ys = reinterpret_cast<float*>(vs + L::TILE + kWarps * L::P) + 2 * w.warp * L::Y;
  float* zs = ys + L::Y;
  const int Tn = a.tokens;
  const bf16_t* qw = qs + w.warp * 16 * L::LD;
  const bf16_t* ow = os + w.warp * 16 * L::LD;
  // The scores and dP of the key tile from k0, in ys and zs.
  auto scores = [&](int k0) {
    __syncthreads();  // every warp is done with the previous tile
    load_rows<L, kCols>(w.qkv(a, k0, 1), w.ld, Tn - k0, a.dim, ks);
    load_rows<L, kCols>(w.qkv(a, k0, 2), w.ld, Tn - k0, a.dim, vs);
    __syncthreads();
    warp_gemm<L::DM, kCols, true>(qw, L::LD, ks, L::LD, ys, L::LS);
    warp_gemm<L::DM, kCols, true>(ow, L::LD, vs, L::LD, zs, L::LS);
    __syncwarp();
  };

  load_rows<L, kRows>(w.qkv(a, w.row0, 0), w.ld, Tn - w.row0, a.dim, qs);
  load_rows<L, kRows>(w.dout(a, w.row0), w.e, Tn - w.row0, a.dim, os);
  // Pass 1: the row's max m, sum l of exp(s - m) and c = Σ exp(s - m)·dP.
  float m = -kInf, l = 0.0f, c = 0.0f;
  for (int k0 = 0; k0 < Tn; k0 += kCols) {
    scores(k0);
    float p[L::HC];
    const float alpha = online_step<L>(ys, w, Tn - k0, a.scale, m, p);
    l *= alpha;
    c *= alpha;
#pragma unroll
    for (int j = 0; j < L::HC; ++j) {
      l += p[j];
      c += p[j] * zs[w.r * L::LS + w.half * L::HC + j];
    }
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  c += __shfl_xor_sync(0xffffffffu, c, 1);
  // The statistics: mu (m, or 0 for -inf), 1/l and D = rowsum(P ⊙ dP).
  const float mu = m == -kInf ? 0.0f : m, il = 1.0f / l, dr = c * il;
  const int t = w.row0 + w.warp * 16 + w.r;
  if (w.half == 0 && t < Tn) {
    const int64_t at = static_cast<int64_t>(blockIdx.x) * Tn + t;
    a.stats[at] = mu;
    a.stats[a.rows + at] = il;
    a.stats[2 * a.rows + at] = dr;
  }
  // Pass 2: dS = P ⊙ (dP - D) per key tile; dQ += dS K.
  FragC dq[L::DM / 16];
  zero(dq);
  for (int k0 = 0; k0 < Tn; k0 += kCols) {
    scores(k0);
#pragma unroll
    for (int j = 0; j < L::HC; ++j) {
      const int col = w.half * L::HC + j, at = w.r * L::LS + col;
      const float p = col < Tn - k0 ? expf(ys[at] * a.scale - mu) * il : 0.0f;
      ps[w.r * L::LP + col] = __float2bfloat16_rn(p * (zs[at] - dr));
    }
    __syncwarp();
    warp_gemm_acc<kCols, L::DM>(ps, L::LP, ks, L::LD, dq);
  }
  store_acc<L>(dq, ys, w, a, t, w.ld, 0, a.scale);
}

// AttentionGrad, dK and dV (rows: keys, columns: queries; P from dq's
// statistics). Shared: ks, vs [64][LD], qs, os (dO) [64][LD]; per warp ps
// (Pᵀ), ds (dSᵀ) [16][LP], ys (Sᵀ), zs (dPᵀ) [16][LS]; st: the query tile's
// statistics [3][64].
template <class L>
__global__ void __launch_bounds__(kThreads) attention_dkv_tc_kernel(AttnArgs<bf16_t> a) {
  bf16_t* ks = dyn_smem<bf16_t>();
  bf16_t* vs = ks + L::ROWS;
  bf16_t* qs = vs + L::ROWS;
  bf16_t* os = qs + L::TILE;
  const Where w(a.heads, a.dim);
  bf16_t* ps = os + L::TILE + 2 * w.warp * L::P;
  bf16_t* ds = ps + L::P;
  float* ys = reinterpret_cast<float*>(os + L::TILE + 2 * kWarps * L::P) + 2 * w.warp * L::Y;
  float* zs = ys + L::Y;
  float* st = reinterpret_cast<float*>(os + L::TILE + 2 * kWarps * L::P) + 2 * kWarps * L::Y;
  const int Tn = a.tokens;
  const float* stats = a.stats + static_cast<int64_t>(blockIdx.x) * Tn;
  const bf16_t* kw = ks + w.warp * 16 * L::LD;
  const bf16_t* vw = vs + w.warp * 16 * L::LD;

  load_rows<L, kRows>(w.qkv(a, w.row0, 1), w.ld, Tn - w.row0, a.dim, ks);
  load_rows<L, kRows>(w.qkv(a, w.row0, 2), w.ld, Tn - w.row0, a.dim, vs);
  FragC dk[L::DM / 16], dv[L::DM / 16];
  zero(dk);
  zero(dv);
  for (int q0 = 0; q0 < Tn; q0 += kCols) {
    __syncthreads();  // every warp is done with the previous tile
    load_rows<L, kCols>(w.qkv(a, q0, 0), w.ld, Tn - q0, a.dim, qs);
    load_rows<L, kCols>(w.dout(a, q0), w.e, Tn - q0, a.dim, os);
    for (int i = threadIdx.x; i < kCols; i += kThreads) {  // 0 past T, where P is 0
      const bool in = q0 + i < Tn;
      st[i] = in ? stats[q0 + i] : 0.0f;
      st[kCols + i] = in ? stats[a.rows + q0 + i] : 0.0f;
      st[2 * kCols + i] = in ? stats[2 * a.rows + q0 + i] : 0.0f;
    }
    __syncthreads();
    warp_gemm<L::DM, kCols, true>(kw, L::LD, qs, L::LD, ys, L::LS);
    warp_gemm<L::DM, kCols, true>(vw, L::LD, os, L::LD, zs, L::LS);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < L::HC; ++j) {
      const int q = w.half * L::HC + j, at = w.r * L::LS + q;
      const float p = q < Tn - q0 ? expf(ys[at] * a.scale - st[q]) * st[kCols + q] : 0.0f;
      ps[w.r * L::LP + q] = __float2bfloat16_rn(p);
      ds[w.r * L::LP + q] = __float2bfloat16_rn(p * (zs[at] - st[2 * kCols + q]));
    }
    __syncwarp();
    warp_gemm_acc<kCols, L::DM>(ps, L::LP, os, L::LD, dv);
    warp_gemm_acc<kCols, L::DM>(ds, L::LP, qs, L::LD, dk);
  }
  const int t = w.row0 + w.warp * 16 + w.r;
  store_acc<L>(dk, ys, w, a, t, w.ld, 1, a.scale);
  __syncwarp();  // the lanes have read dK from ys
  store_acc<L>(dv, ys, w, a, t, w.ld, 2, 1.0f);
}

// f(Tc<DM>{}) for the smallest DM in {32, 64, 128} that holds head dim d.
template <typename F>
void visit_tc(int64_t d, F&& f) {
  if (d <= 32) return f(Tc<32>{});
  if (d <= 64) return f(Tc<64>{});
  return f(Tc<128>{});
}

int64_t row_tiles(const AttnArgs<bf16_t>& a) {
  return (a.tokens + kRows - 1) / kRows;
}

}  // namespace

bool tensor_core_attention(int64_t head_dim, const char* who) {
  const char* e = std::getenv("KILN_CUDA_BF16_ATTENTION");
  const std::string v = e ? e : "";
  if (v != "" && v != "simt" && v != "tensor-cores")
    fail(who, "KILN_CUDA_BF16_ATTENTION is '" + v + "', expected tensor-cores or simt");
  return v != "simt" && head_dim <= 128;
}

void attention_fwd_tc(const KernelContext& ctx, cudaStream_t s, AttnArgs<bf16_t> a, int64_t bh,
                      const char* who) {
  visit_tc(a.dim, [&](auto tiling) {
    using L = decltype(tiling);
    const size_t smem = 2 * (L::ROWS + 2 * L::TILE + kWarps * L::P) + 4 * kWarps * L::Y;
    launch<bf16_t>(attention_fwd_tc_kernel<L>, ctx, s, bh, row_tiles(a), kThreads, smem, a, who,
                   "attention_fwd_tc");
  });
}

void attention_grad_tc(const KernelContext& ctx, cudaStream_t s, AttnArgs<bf16_t> a, int64_t bh,
                       const char* who) {
  visit_tc(a.dim, [&](auto tiling) {
    using L = decltype(tiling);
    const size_t dq_smem = 2 * (2 * L::ROWS + 2 * L::TILE + kWarps * L::P) + 4 * 2 * kWarps * L::Y;
    const size_t dkv_smem =
        2 * (2 * L::ROWS + 2 * L::TILE + 2 * kWarps * L::P) + 4 * (2 * kWarps * L::Y + 3 * kCols);
    launch<bf16_t>(attention_dq_tc_kernel<L>, ctx, s, bh, row_tiles(a), kThreads, dq_smem, a, who,
                   "attention_dq_tc");
    launch<bf16_t>(attention_dkv_tc_kernel<L>, ctx, s, bh, row_tiles(a), kThreads, dkv_smem, a, who,
                   "attention_dkv_tc");
  });
}

}  // namespace kiln::cuda::attn
