// kiln cuda backend: fused multi-head softmax attention (Attention and
// AttentionGrad) over the packed qkv [B, T, 3, H, D], flash-attention style:
// the T×T scores never reach device memory.
//
// Every kernel works on one (batch, head) pair (blockIdx.x = b·H + h) and one
// tile of R "row" tokens (blockIdx.y), looping over the tokens in tiles of C
// "column" tokens. Tiles live in shared memory transposed, [DM][R + 4] (DM:
// the head dimension rounded up to 32, 64, 128 or 256, zero-filled, as are the
// tokens past T), so that each thread reads its rows and columns of a tile as
// short vectors. A thread owns RQ consecutive rows and, of a score tile, CK
// consecutive columns, of an accumulator row the dims cg + CG·k (cg: its
// column group, the CG = 8 neighbouring lanes that share its rows; their row
// maxima and sums are warp shuffles).
//
//  - Attention: rows are queries, columns keys; online softmax (running row
//    max and sum, the accumulator rescaled when the max grows); out [B,T,H,D].
//  - AttentionGrad (dV = Pᵀ dO, dP = dO Vᵀ, dS = P ⊙ (dP - rowsum(dP ⊙ P)),
//    dQ = scale · dS K, dK = scale · dSᵀ Q, as the cpu kernel), in two
//    kernels and no atomics (deterministic):
//      attention_dq: rows are queries. A first pass over the keys finds each
//        row's max m, sum l and rowsum(P ⊙ dP) (online, like the forward),
//        stored to scratch ([3][B·H·T]); a second pass recomputes P and dS
//        per key tile and accumulates dQ.
//      attention_dkv: rows are keys, columns queries: recomputes Sᵀ and dPᵀ
//        per query tile, P from the stored m and 1/l, and accumulates dK, dV.
// f32, f64 and bf16. bf16 is a storage type here: tiles are widened to f32
// as they are loaded into shared memory, everything is computed in f32 (the
// scores, softmax and statistics, P and dS, unrounded), and the outputs are
// rounded to bf16 as they are stored; half the global memory traffic of f32,
// the same arithmetic. attention_tc.cu runs bf16 on tensor cores instead
// (the default since the H200 check of 2026-12-04: ViT-B's jit bf16 step
// 30.2 ms against 32.7 ms, the same losses to 4e-4; these kernels with
// KILN_CUDA_BF16_ATTENTION=simt, and for head dims above 128).
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/cuda/attention.cuh"

namespace kiln::cuda {
namespace {
using attn::args_of;
using attn::AttnArgs;
using attn::dyn_smem;
using attn::launch;

// Device side.

// A kernel's tiling: head dims DM (>= D, zero-padded), R rows per block, C
// columns per tile, RQ rows per thread, CG column groups.
template <typename T_, int DM_, int R_, int C_, int RQ_, int CG_ = 8>
struct Tiling {
  using T = T_;
  static constexpr int DM = DM_, R = R_, C = C_, RQ = RQ_, CG = CG_;
  static constexpr int CK = C / CG;       // columns of a thread's score tile
  static constexpr int DPT = DM / CG;     // dims of a thread's accumulator rows
  static constexpr int NT = R / RQ * CG;  // threads per block
  static constexpr int SR = R + 4;        // row stride of a transposed row tile
  static constexpr int SC = C + 4;        // ... of a transposed column tile
  static_assert(R % RQ == 0 && C % CG == 0 && DM % CG == 0 && 32 % CG == 0);
  static_assert(NT % 32 == 0, "whole warps");
  static_assert(DM % 8 == 0 && R % 4 == 0 && C % 4 == 0, "load_t's and tile_acc's steps");
};

__device__ __forceinline__ float exp_of(float x) {
  return expf(x);
}
__device__ __forceinline__ double exp_of(double x) {
  return exp(x);
}

// v[0..N) = p[0..N) from shared memory, in the widest aligned vectors (p is
// aligned to the vector that N allows: every caller's offsets are multiples
// of N's vector width).
template <int N, typename T>
__device__ __forceinline__ void lds(const T* p, T (&v)[N]) {
  if constexpr (std::is_same_v<T, float> && N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) {
      const float4 x = reinterpret_cast<const float4*>(p)[k];
      v[4 * k] = x.x, v[4 * k + 1] = x.y, v[4 * k + 2] = x.z, v[4 * k + 3] = x.w;
    }
  } else if constexpr (std::is_same_v<T, float> && N % 2 == 0) {
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      const float2 x = reinterpret_cast<const float2*>(p)[k];
      v[2 * k] = x.x, v[2 * k + 1] = x.y;
    }
  } else if constexpr (std::is_same_v<T, double> && N % 2 == 0) {
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      const double2 x = reinterpret_cast<const double2*>(p)[k];
      v[2 * k] = x.x, v[2 * k + 1] = x.y;
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = p[k];
  }
}

// p[0..N) = v[0..N) in shared memory (alignment as lds).
template <int N, typename T>
__device__ __forceinline__ void sts(T* p, const T (&v)[N]) {
  if constexpr (std::is_same_v<T, float> && N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k)
      reinterpret_cast<float4*>(p)[k] =
          make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
  } else if constexpr (std::is_same_v<T, float> && N % 2 == 0) {
#pragma unroll
    for (int k = 0; k < N / 2; ++k)
      reinterpret_cast<float2*>(p)[k] = make_float2(v[2 * k], v[2 * k + 1]);
  } else if constexpr (std::is_same_v<T, double> && N % 2 == 0) {
#pragma unroll
    for (int k = 0; k < N / 2; ++k)
      reinterpret_cast<double2*>(p)[k] = make_double2(v[2 * k], v[2 * k + 1]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = v[k];
  }
}

// The larger of a and b; a NaN b is skipped (a never is NaN here), as the
// cpu's row maximum skips NaN scores.
template <typename T>
__device__ __forceinline__ T max_of(T a, T b) {
  return b > a ? b : a;
}

// Max and sum over the CG lanes of a column group set (lanes that differ in
// their low log2(CG) bits: the threads that share rows).
template <int CG, typename T>
__device__ __forceinline__ T group_max(T v) {
#pragma unroll
  for (int m = CG / 2; m > 0; m >>= 1) v = max_of(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}
template <int CG, typename T>
__device__ __forceinline__ T group_sum(T v) {
#pragma unroll
  for (int m = CG / 2; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Tile X (n valid rows `stride` apart in global memory, `dim` valid dims;
// zero elsewhere; stored as G, widened to K::T) into xt [K::DM][S]
// transposed: xt[d·S + r] = X[r][d] for r < ROWS. A warp loads 4 rows × 8
// consecutive dims (32-byte pieces of rows in f32) and, with S = 4 mod 32,
// stores them to 32 distinct banks.
template <class K, int ROWS, typename G>
__device__ __forceinline__ void load_t(const G* __restrict__ g, int64_t stride, int n, int dim,
                                       typename K::T* xt, int S) {
  using T = typename K::T;
  constexpr int kPieces = K::DM / 8;
  for (int idx = threadIdx.x; idx < K::DM * ROWS; idx += K::NT) {
    const int piece = idx >> 5;
    const int d = (piece % kPieces) * 8 + (idx & 7);
    const int r = (piece / kPieces) * 4 + ((idx >> 3) & 3);
    T v = T(0);
    if (r < n && d < dim) v = convert<T>(g[static_cast<int64_t>(r) * stride + d]);
    xt[d * S + r] = v;
  }
}

// What a block and its threads work on: the (batch, head) of blockIdx.x, the
// tile of K::R row tokens from row0 (blockIdx.y), and per thread RQ rows from
// r0 and a column group cg (score columns c0.., accumulator dims cg + CG·k).
template <class K, typename S>
struct Block {
  AttnArgs<S> a;  // (a copy: a reference to a kernel parameter would put it in local memory)
  int b, h, row0, cg, r0, c0;
  int64_t e, ld;  // a token's q (k, v, dO, out) row: H·D; its qkv row: 3·H·D

  __device__ explicit Block(const AttnArgs<S>& args)
      : a(args),
        b(static_cast<int>(blockIdx.x) / args.heads),
        h(static_cast<int>(blockIdx.x) % args.heads),
        row0(static_cast<int>(blockIdx.y) * K::R),
        cg(static_cast<int>(threadIdx.x) % K::CG),
        r0(static_cast<int>(threadIdx.x) / K::CG * K::RQ),
        c0(cg * K::CK),
        e(static_cast<int64_t>(args.heads) * args.dim),
        ld(3 * e) {}

  // Loads the tile of ROWS tokens from t0 of this head's q (part 0), k (1) or
  // v (2), transposed into xt (row stride sx).
  template <int ROWS>
  __device__ __forceinline__ void load_qkv(int part, int t0, typename K::T* xt, int sx) const {
    load_t<K, ROWS>(a.qkv + token(t0) * ld + part * e + head_offset(), ld, a.tokens - t0, a.dim, xt,
                    sx);
  }
  // ... of this head's dO.
  template <int ROWS>
  __device__ __forceinline__ void load_dout(int t0, typename K::T* xt, int sx) const {
    load_t<K, ROWS>(a.dout + token(t0) * e + head_offset(), e, a.tokens - t0, a.dim, xt, sx);
  }
  // Calls f(i, k, y, d) for each of this thread's rows i whose token exists
  // and each of its dims d = cg + CG·k < D, y: the token's row of a.out at
  // this head (rows `stride` apart: e for [B, T, H, D], ld for [B, T, 3, H, D]).
  template <class F>
  __device__ __forceinline__ void store_rows(int64_t stride, F f) const {
#pragma unroll
    for (int i = 0; i < K::RQ; ++i) {
      const int t = row0 + r0 + i;
      if (t >= a.tokens) continue;
      S* y = a.out + token(t) * stride + head_offset();
#pragma unroll
      for (int k = 0; k < K::DPT; ++k) {
        const int d = cg + K::CG * k;
        if (d < a.dim) f(i, k, y, d);
      }
    }
  }

 private:
  __device__ __forceinline__ int64_t token(int t) const {
    return static_cast<int64_t>(b) * a.tokens + t;
  }
  __device__ __forceinline__ int64_t head_offset() const {
    return static_cast<int64_t>(h) * a.dim;
  }
};

// acc[i][j] += Σ_d at[d][r0 + i] · bt[d][c0 + j]: a thread's RQ × CK block
// of the scores of transposed tiles at [DM][sa] and bt [DM][sb].
template <class K, typename T>
__device__ __forceinline__ void tile_dot(const T* at, int sa, const T* bt, int sb, int r0, int c0,
                                         T (&acc)[K::RQ][K::CK]) {
#pragma unroll 4
  for (int d = 0; d < K::DM; ++d) {
    T a[K::RQ], b[K::CK];
    lds(at + d * sa + r0, a);
    lds(bt + d * sb + c0, b);
#pragma unroll
    for (int i = 0; i < K::RQ; ++i)
#pragma unroll
      for (int j = 0; j < K::CK; ++j) acc[i][j] += a[i] * b[j];
  }
}

// w[(c0 + j)·s + r0 + i] = x[i][j]: a thread's score block into a [C][s]
// tile (transposed: a column's values for all rows are contiguous).
template <class K, typename T>
__device__ __forceinline__ void store_t(T* w, int s, int r0, int c0, const T (&x)[K::RQ][K::CK]) {
#pragma unroll
  for (int j = 0; j < K::CK; ++j) {
    T v[K::RQ];
#pragma unroll
    for (int i = 0; i < K::RQ; ++i) v[i] = x[i][j];
    sts(w + (c0 + j) * s + r0, v);
  }
}

// o[i][k] += Σ_c w[c][r0 + i] · zt[cg + CG·k][c] over the first `cols`
// columns (a multiple of 4, at most C; those past it weigh 0): a thread's
// rows of (weights [C][sw]) times (a transposed tile zt [DM][sz]).
template <class K, typename T>
__device__ __forceinline__ void tile_acc(const T* w, int sw, const T* zt, int sz, int r0, int cg,
                                         int cols, T (&o)[K::RQ][K::DPT]) {
#pragma unroll 2
  for (int c = 0; c < cols; c += 4) {
    T wv[4][K::RQ];
#pragma unroll
    for (int u = 0; u < 4; ++u) lds(w + (c + u) * sw + r0, wv[u]);
#pragma unroll
    for (int k = 0; k < K::DPT; ++k) {
      T z[4];
      lds(zt + (cg + K::CG * k) * sz + c, z);
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int i = 0; i < K::RQ; ++i) o[i][k] += wv[u][i] * z[u];
    }
  }
}

// The columns of a tile that tile_acc reads when `valid` of them are tokens
// (a ragged last tile: T = 197 leaves 5).
template <class K>
__device__ __forceinline__ int used_cols(int valid) {
  return valid >= K::C ? K::C : (valid + 3) & ~3;
}

// Scores of a thread's block: scale · s where the column (key) c0 + j is
// below `valid`, -inf past T.
template <class K, typename T>
__device__ __forceinline__ void scale_mask(T (&s)[K::RQ][K::CK], T scale, int c0, int valid) {
#pragma unroll
  for (int i = 0; i < K::RQ; ++i)
#pragma unroll
    for (int j = 0; j < K::CK; ++j)
      s[i][j] = c0 + j < valid ? s[i][j] * scale : -std::numeric_limits<T>::infinity();
}

// One step of the online softmax for row i of a thread: the row's running
// max m grows to cover the tile's scores s (NaN-free max; the exponent's
// offset mu is 0 while the max is -inf, so that exp(-inf - mu) = 0); returns
// the factor alpha by which the sums and accumulators so far are rescaled, and
// turns s into exp(s - mu).
template <class K, typename T>
__device__ __forceinline__ T online_step(T (&s)[K::CK], T& m) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma unroll
  for (int j = 0; j < K::CK; ++j) mx = max_of(mx, s[j]);
  mx = group_max<K::CG>(mx);
  const T mn = max_of(m, mx);
  const T mu = mn == -std::numeric_limits<T>::infinity() ? T(0) : mn;
  const T alpha = exp_of(m - mu);
  m = mn;
#pragma unroll
  for (int j = 0; j < K::CK; ++j) s[j] = exp_of(s[j] - mu);
  return alpha;
}

// Attention: out[b, t, h, :] = Σ_j softmax_j(scale · q_t · k_j) v_j. Rows are
// queries, columns keys. Shared: qt [DM][SR], kt, vt [DM][SC], pt [C][SR].
template <class K, typename S>
__global__ void __launch_bounds__(K::NT) attention_fwd(AttnArgs<S> a) {
  using T = typename K::T;
  static_assert(std::is_same_v<T, acc_t<S>>);
  constexpr int DM = K::DM, C = K::C, RQ = K::RQ, CG = K::CG, CK = K::CK, DPT = K::DPT, SR = K::SR,
                SC = K::SC;
  T* qt = dyn_smem<T>();
  T* kt = qt + DM * SR;
  T* vt = kt + DM * SC;
  T* pt = vt + DM * SC;
  const Block<K, S> blk(a);
  const int Tn = a.tokens, r0 = blk.r0, c0 = blk.c0;

  blk.template load_qkv<K::R>(0, blk.row0, qt, SR);
  T m[RQ], l[RQ], o[RQ][DPT];
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    m[i] = -std::numeric_limits<T>::infinity();
    l[i] = T(0);
#pragma unroll
    for (int k = 0; k < DPT; ++k) o[i][k] = T(0);
  }
  for (int k0 = 0; k0 < Tn; k0 += C) {
    blk.template load_qkv<C>(1, k0, kt, SC);
    blk.template load_qkv<C>(2, k0, vt, SC);
    __syncthreads();
    T s[RQ][CK] = {};
    tile_dot<K>(qt, SR, kt, SC, r0, c0, s);
    scale_mask<K>(s, a.scale, c0, Tn - k0);
#pragma unroll
    for (int i = 0; i < RQ; ++i) {
      const T alpha = online_step<K>(s[i], m[i]);
      l[i] *= alpha;
#pragma unroll
      for (int j = 0; j < CK; ++j) l[i] += s[i][j];
#pragma unroll
      for (int k = 0; k < DPT; ++k) o[i][k] *= alpha;
    }
    store_t<K>(pt, SR, r0, c0, s);
    __syncthreads();
    tile_acc<K>(pt, SR, vt, SC, r0, blk.cg, used_cols<K>(Tn - k0), o);
    __syncthreads();  // before the next tile overwrites kt, vt, pt
  }
#pragma unroll
  for (int i = 0; i < RQ; ++i) {  // (every lane takes part in the sums' shuffles)
    const T inv = T(1) / group_sum<CG>(l[i]);
#pragma unroll
    for (int k = 0; k < DPT; ++k) o[i][k] *= inv;
  }
  blk.store_rows(blk.e, [&](int i, int k, S* y, int d) { y[d] = convert<S>(o[i][k]); });
}

// AttentionGrad, dQ and the row statistics: rows are queries, columns keys.
// Shared: qt, ot (dO) [DM][SR], kt, vt [DM][SC], st (dS) [C][SR].
template <class K, typename S>
__global__ void __launch_bounds__(K::NT) attention_dq(AttnArgs<S> a) {
  using T = typename K::T;
  static_assert(std::is_same_v<T, acc_t<S>>);
  constexpr int DM = K::DM, C = K::C, RQ = K::RQ, CG = K::CG, CK = K::CK, DPT = K::DPT, SR = K::SR,
                SC = K::SC;
  T* qt = dyn_smem<T>();
  T* ot = qt + DM * SR;
  T* kt = ot + DM * SR;
  T* vt = kt + DM * SC;
  T* st = vt + DM * SC;
  const Block<K, S> blk(a);
  const int Tn = a.tokens, r0 = blk.r0, c0 = blk.c0;
  // The scores' and dP's tiles of the keys from k0: s = Q Kᵀ, dp = dO Vᵀ.
  auto scores = [&](int k0, T(&s)[RQ][CK], T(&dp)[RQ][CK]) {
    blk.template load_qkv<C>(1, k0, kt, SC);
    blk.template load_qkv<C>(2, k0, vt, SC);
    __syncthreads();
    tile_dot<K>(qt, SR, kt, SC, r0, c0, s);
    tile_dot<K>(ot, SR, vt, SC, r0, c0, dp);
  };

  blk.template load_qkv<K::R>(0, blk.row0, qt, SR);
  blk.template load_dout<K::R>(blk.row0, ot, SR);
  // Pass 1: per row the max m, the sum l of exp(s - m) and c = Σ exp(s - m)·dP.
  T m[RQ], l[RQ], c[RQ];
#pragma unroll
  for (int i = 0; i < RQ; ++i) m[i] = -std::numeric_limits<T>::infinity(), l[i] = c[i] = T(0);
  for (int k0 = 0; k0 < Tn; k0 += C) {
    T s[RQ][CK] = {}, dp[RQ][CK] = {};
    scores(k0, s, dp);
    scale_mask<K>(s, a.scale, c0, Tn - k0);
#pragma unroll
    for (int i = 0; i < RQ; ++i) {
      const T alpha = online_step<K>(s[i], m[i]);
      l[i] *= alpha;
      c[i] *= alpha;
#pragma unroll
      for (int j = 0; j < CK; ++j) l[i] += s[i][j], c[i] += s[i][j] * dp[i][j];
    }
    __syncthreads();  // before the next tile overwrites kt, vt
  }
  // The statistics: mu (m, or 0 for -inf), 1/l and D = rowsum(P ⊙ dP).
  T mu[RQ], il[RQ], dr[RQ];
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    mu[i] = m[i] == -std::numeric_limits<T>::infinity() ? T(0) : m[i];
    il[i] = T(1) / group_sum<CG>(l[i]);
    dr[i] = group_sum<CG>(c[i]) * il[i];
    const int t = blk.row0 + r0 + i;
    if (blk.cg == 0 && t < Tn) {
      const int64_t at = static_cast<int64_t>(blockIdx.x) * Tn + t;
      a.stats[at] = mu[i];
      a.stats[a.rows + at] = il[i];
      a.stats[2 * a.rows + at] = dr[i];
    }
  }
  // Pass 2: dS = P ⊙ (dP - D) per key tile; dQ += dS K.
  T dq[RQ][DPT];
#pragma unroll
  for (int i = 0; i < RQ; ++i)
#pragma unroll
    for (int k = 0; k < DPT; ++k) dq[i][k] = T(0);
  for (int k0 = 0; k0 < Tn; k0 += C) {
    T s[RQ][CK] = {}, dp[RQ][CK] = {};
    scores(k0, s, dp);
#pragma unroll
    for (int i = 0; i < RQ; ++i)
#pragma unroll
      for (int j = 0; j < CK; ++j) {
        const T p = c0 + j < Tn - k0 ? exp_of(s[i][j] * a.scale - mu[i]) * il[i] : T(0);
        s[i][j] = p * (dp[i][j] - dr[i]);
      }
    store_t<K>(st, SR, r0, c0, s);
    __syncthreads();
    tile_acc<K>(st, SR, kt, SC, r0, blk.cg, used_cols<K>(Tn - k0), dq);
    __syncthreads();  // before the next tile overwrites kt, vt, st
  }
  blk.store_rows(blk.ld, [&](int i, int k, S* y, int d) { y[d] = convert<S>(dq[i][k] * a.scale); });
}

// AttentionGrad, dK and dV: rows are keys, columns queries (Sᵀ = K Qᵀ and
// dPᵀ = V dOᵀ per query tile, P from attention_dq's statistics). Shared: kt,
// vt [DM][SR], qt, ot (dO) [DM][SC], pt (P), st (dS) [C][SR].
template <class K, typename S>
__global__ void __launch_bounds__(K::NT) attention_dkv(AttnArgs<S> a) {
  using T = typename K::T;
  static_assert(std::is_same_v<T, acc_t<S>>);
  constexpr int DM = K::DM, C = K::C, RQ = K::RQ, CK = K::CK, DPT = K::DPT, SR = K::SR, SC = K::SC;
  T* kt = dyn_smem<T>();
  T* vt = kt + DM * SR;
  T* qt = vt + DM * SR;
  T* ot = qt + DM * SC;
  T* pt = ot + DM * SC;
  T* st = pt + C * SR;
  const Block<K, S> blk(a);
  const int Tn = a.tokens, r0 = blk.r0, c0 = blk.c0;
  const T* stats = a.stats + static_cast<int64_t>(blockIdx.x) * Tn;

  blk.template load_qkv<K::R>(1, blk.row0, kt, SR);
  blk.template load_qkv<K::R>(2, blk.row0, vt, SR);
  T dk[RQ][DPT], dv[RQ][DPT];
#pragma unroll
  for (int i = 0; i < RQ; ++i)
#pragma unroll
    for (int k = 0; k < DPT; ++k) dk[i][k] = dv[i][k] = T(0);
  for (int q0 = 0; q0 < Tn; q0 += C) {
    blk.template load_qkv<C>(0, q0, qt, SC);
    blk.template load_dout<C>(q0, ot, SC);
    // This thread's columns' statistics (0 past T, where P is set to 0).
    T mu[CK], il[CK], dr[CK];
#pragma unroll
    for (int j = 0; j < CK; ++j) {
      const int t = q0 + c0 + j;
      const bool in = t < Tn;
      mu[j] = in ? stats[t] : T(0);
      il[j] = in ? stats[a.rows + t] : T(0);
      dr[j] = in ? stats[2 * a.rows + t] : T(0);
    }
    __syncthreads();
    T s[RQ][CK] = {}, dp[RQ][CK] = {};
    tile_dot<K>(kt, SR, qt, SC, r0, c0, s);
    tile_dot<K>(vt, SR, ot, SC, r0, c0, dp);
#pragma unroll
    for (int i = 0; i < RQ; ++i)
#pragma unroll
      for (int j = 0; j < CK; ++j) {
        const T p = c0 + j < Tn - q0 ? exp_of(s[i][j] * a.scale - mu[j]) * il[j] : T(0);
        s[i][j] = p;
        dp[i][j] = p * (dp[i][j] - dr[j]);
      }
    store_t<K>(pt, SR, r0, c0, s);
    store_t<K>(st, SR, r0, c0, dp);
    __syncthreads();
    tile_acc<K>(pt, SR, ot, SC, r0, blk.cg, used_cols<K>(Tn - q0), dv);
    tile_acc<K>(st, SR, qt, SC, r0, blk.cg, used_cols<K>(Tn - q0), dk);
    __syncthreads();  // before the next tile overwrites qt, ot, pt, st
  }
  blk.store_rows(blk.ld, [&](int i, int k, S* y, int d) {
    y[blk.e + d] = convert<S>(dk[i][k] * a.scale);
    y[2 * blk.e + d] = convert<S>(dv[i][k]);
  });
}

// Host side.

// The tiling for head dim D <= DM: for f32 up to D = 64 (ViT), 64 rows per
// block of 128 threads and column tiles of 32 (T = 197 pads to 224 columns,
// not 256); smaller tiles where DM grows, and for f64 (the gradient checks'
// precision); within ~100 KiB of shared memory.
template <typename T, int DM>
struct TilingFor;
template <>
struct TilingFor<float, 32> : Tiling<float, 32, 64, 32, 4> {};
template <>
struct TilingFor<float, 64> : Tiling<float, 64, 64, 32, 4> {};
template <>
struct TilingFor<float, 128> : Tiling<float, 128, 32, 32, 2> {};
template <>
struct TilingFor<float, 256> : Tiling<float, 256, 16, 16, 2> {};
template <>
struct TilingFor<double, 32> : Tiling<double, 32, 32, 32, 2> {};
template <>
struct TilingFor<double, 64> : Tiling<double, 64, 32, 32, 2> {};
template <>
struct TilingFor<double, 128> : Tiling<double, 128, 16, 16, 1> {};
template <>
struct TilingFor<double, 256> : Tiling<double, 256, 8, 8, 1> {};

// f(TilingFor<T, DM>{}) for the smallest DM >= D.
template <typename T, typename F>
void visit_tiling(int64_t d, const char* who, F&& f) {
  if (d <= 32) return f(TilingFor<T, 32>{});
  if (d <= 64) return f(TilingFor<T, 64>{});
  if (d <= 128) return f(TilingFor<T, 128>{});
  if (d <= 256) return f(TilingFor<T, 256>{});
  fail(who, "head_dim " + std::to_string(d) + " has no cuda kernel (at most 256)");
}

void attention_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                      ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const Shape& sh = in[0].shape();
  attn::visit_dtype(in[0].dtype(), p.name(), [&](auto t) {
    using S = decltype(t);
    using T = acc_t<S>;
    S* y = out_ptr<S>(out);
    if (numel(out.shape) == 0) return;
    AttnArgs<S> a = args_of<S>(in[0], p);
    a.out = y;
    if constexpr (std::is_same_v<S, __nv_bfloat16>) {
      if (attn::tensor_core_attention(sh[4], p.name()))
        return attn::attention_fwd_tc(ctx, s, a, sh[0] * sh[3], p.name());
    }
    visit_tiling<T>(sh[4], p.name(), [&](auto tiling) {
      using K = decltype(tiling);
      const size_t smem = sizeof(T) * (K::DM * K::SR + 2 * K::DM * K::SC + K::C * K::SR);
      launch<S>(attention_fwd<K, S>, ctx, s, sh[0] * sh[3], (sh[1] + K::R - 1) / K::R, K::NT, smem,
                a, p.name(), "attention_fwd");
    });
  });
}

void attention_grad_kernel(const KernelContext& ctx, const Primitive& p,
                           const std::vector<Array>& in, ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const Shape& sh = in[0].shape();
  attn::visit_dtype(in[0].dtype(), p.name(), [&](auto t) {
    using S = decltype(t);
    using T = acc_t<S>;
    S* y = out_ptr<S>(out);
    if (numel(out.shape) == 0) return;
    AttnArgs<S> a = args_of<S>(in[0], p);
    a.dout = ptr<S>(in[1]);
    a.out = y;
    const size_t stat_bytes = 3 * static_cast<size_t>(a.rows) * sizeof(T);
    a.stats = static_cast<T*>(ctx.scratch->allocate(stat_bytes));
    // Released once both kernels are queued (stream-ordered), or on a failed launch.
    struct Release {
      Allocator* alloc;
      void* mem;
      size_t bytes;
      ~Release() { alloc->release(mem, bytes); }
    } release{ctx.scratch, a.stats, stat_bytes};
    const int64_t bh = sh[0] * sh[3];
    if constexpr (std::is_same_v<S, __nv_bfloat16>) {
      if (attn::tensor_core_attention(sh[4], p.name()))
        return attn::attention_grad_tc(ctx, s, a, bh, p.name());
    }
    visit_tiling<T>(sh[4], p.name(), [&](auto tiling) {
      using K = decltype(tiling);
      const int64_t tiles = (sh[1] + K::R - 1) / K::R;
      const size_t dq_smem = sizeof(T) * (2 * K::DM * K::SR + 2 * K::DM * K::SC + K::C * K::SR);
      const size_t dkv_smem =
          sizeof(T) * (2 * K::DM * K::SR + 2 * K::DM * K::SC + 2 * K::C * K::SR);
      launch<S>(attention_dq<K, S>, ctx, s, bh, tiles, K::NT, dq_smem, a, p.name(), "attention_dq");
      launch<S>(attention_dkv<K, S>, ctx, s, bh, tiles, K::NT, dkv_smem, a, p.name(),
                "attention_dkv");
    });
  });
}

}  // namespace

void register_attention(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Attention)] = attention_kernel;
  t.kernels[static_cast<int>(Op::AttentionGrad)] = attention_grad_kernel;
}

}  // namespace kiln::cuda
