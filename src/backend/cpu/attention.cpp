// kiln cpu backend: fused multi-head softmax attention, forward and backward.
//
// qkv is [B, T, 3, H, D] (one linear layer's output): the query, key and value
// of head h for token t are rows of D values, 3·H·D apart from token to token.
// Each (batch, head) pair is one job; the jobs are split over the threads and
// each runs its GEMMs single-threaded on strided views of qkv, so the heads
// are never transposed into place. The T×T scores stay in a per-thread buffer
// (cache-resident at ViT's T = 197) and are never stored: the backward
// recomputes them, which costs one T×T×D GEMM per job and saves B·H·T² values
// of memory per layer. In bf16 on a CPU with a bf16 unit (AMX or
// AVX512-BF16) and head dims that are multiples of 32, the GEMMs run on
// kiln's own tile kernels (tiles.h) on operands laid out per job, rather than
// on oneMKL, which spends a third of its time at these sizes packing them on
// AMX and ran them at 0.14 TFLOP/s on AVX512-BF16, against 0.40 for oneDNN's
// GEMMs on the same unit.
#include "backend/cpu/avx512.h"  // first: see its note on GCC's warnings

#include <limits>
#include <utility>

#include "backend/cpu/kernels.h"
#include "backend/cpu/sgemm.h"
#include "backend/cpu/tiles.h"

namespace kiln::cpu {
namespace {

// C[m,n] = alpha · op(A)[m,k] · op(B)[k,n], row-major with leading dimensions
// (op(X) = Xᵀ when its flag is set; then X is stored [k,m] or [n,k]).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, float beta = 0) {
  sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, "attention");
}

// f64: the reference precision of the gradient checks.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double* c, int64_t ldc, double beta = 0) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * c[i * ldc + j]);
    }
}

// ---- row kernels of the softmax and its gradient, over one row of t scores.
// The generic ones are loops the compiler vectorizes (f64, and f32 without
// AVX-512); with AVX-512 the f32 ones below are written out: 16 lanes with a
// masked tail (T = 197 leaves 5 scores after 12 vectors, which the compiler
// ran as scalar exps), horizontal sums and maxima by shuffles, and an exp
// that takes 2^n from vscalefps.
using bits = uint16_t;  // bf16 storage

template <typename T>
T row_max(const T* r, int64_t t) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < t; ++j) m = r[j] > m ? r[j] : m;
  return m;
}
// r = exp(r - m); returns the sum of r.
template <typename T>
T exp_row(T* r, int64_t t, T m) {
  T total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < t; ++j) {
    r[j] = fast_exp(r[j] - m);
    total += r[j];
  }
  return total;
}
#if !KILN_CPU_AVX512
// e = bf16(exp(r - m)); returns the sum of exp(r - m), unrounded.
float exp_row_bf16(const float* r, int64_t t, float m, bits* e) {
  float total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < t; ++j) {
    const float x = fast_exp(r[j] - m);
    e[j] = narrow_bf16(x);
    total += x;
  }
  return total;
}
#endif
template <typename T>
void scale_row(T* r, int64_t t, T c) {
#pragma omp simd
  for (int64_t j = 0; j < t; ++j) r[j] *= c;
}
#if !KILN_CPU_AVX512
// r *= c, and y = bf16(r).
void scale_row_bf16(float* r, int64_t t, float c, bits* y) {
#pragma omp simd
  for (int64_t j = 0; j < t; ++j) {
    r[j] *= c;
    y[j] = narrow_bf16(r[j]);
  }
}
#endif
template <typename T>
T dot_row(const T* a, const T* b, int64_t t) {
  T dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < t; ++j) dot += a[j] * b[j];
  return dot;
}
// dp = p ⊙ (dp - dot)
template <typename T>
void softmax_grad_row(const T* p, T* dp, int64_t t, T dot) {
#pragma omp simd
  for (int64_t j = 0; j < t; ++j) dp[j] = p[j] * (dp[j] - dot);
}
#if !KILN_CPU_AVX512
// ds = bf16(p ⊙ (dp - dot))
void softmax_grad_row_bf16(const float* p, const float* dp, int64_t t, float dot, bits* ds) {
#pragma omp simd
  for (int64_t j = 0; j < t; ++j) ds[j] = narrow_bf16(p[j] * (dp[j] - dot));
}
#endif

#if KILN_CPU_AVX512
float row_max(const float* r, int64_t t) {
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m = lowest;
  for (int64_t j = 0; j < t; j += 16)
    m = _mm512_max_ps(m, _mm512_mask_loadu_ps(lowest, avx512::lanes(t - j), r + j));
  return _mm512_reduce_max_ps(m);
}
float exp_row(float* r, int64_t t, float m) {
  const __m512 vm = _mm512_set1_ps(m);
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < t; j += 16) {
    const __mmask16 k = avx512::lanes(t - j);
    const __m512 e = avx512::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, r + j), vm));
    _mm512_mask_storeu_ps(r + j, k, e);
    total = _mm512_mask_add_ps(total, k, total, e);
  }
  return _mm512_reduce_add_ps(total);
}
float exp_row_bf16(const float* r, int64_t t, float m, bits* e) {
  const __m512 vm = _mm512_set1_ps(m);
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < t; j += 16) {
    const __mmask16 k = avx512::lanes(t - j);
    const __m512 x = avx512::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, r + j), vm));
    _mm256_mask_storeu_epi16(e + j, k, avx512::to_bf16(x));
    total = _mm512_mask_add_ps(total, k, total, x);
  }
  return _mm512_reduce_add_ps(total);
}
void scale_row(float* r, int64_t t, float c) {
  const __m512 vc = _mm512_set1_ps(c);
  for (int64_t j = 0; j < t; j += 16) {
    const __mmask16 k = avx512::lanes(t - j);
    _mm512_mask_storeu_ps(r + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, r + j), vc));
  }
}
void scale_row_bf16(float* r, int64_t t, float c, bits* y) {
  const __m512 vc = _mm512_set1_ps(c);
  for (int64_t j = 0; j < t; j += 16) {
    const __mmask16 k = avx512::lanes(t - j);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, r + j), vc);
    _mm512_mask_storeu_ps(r + j, k, x);
    _mm256_mask_storeu_epi16(y + j, k, avx512::to_bf16(x));
  }
}
float dot_row(const float* a, const float* b, int64_t t) {
  __m512 dot = _mm512_setzero_ps();
  for (int64_t j = 0; j < t; j += 16) {
    const __mmask16 k = avx512::lanes(t - j);
    dot = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + j), _mm512_maskz_loadu_ps(k, b + j), dot);
  }
  return _mm512_reduce_add_ps(dot);
}
void softmax_grad_row(const float* p, float* dp, int64_t t, float dot) {
  const __m512 vd = _mm512_set1_ps(dot);
  for (int64_t j = 0; j < t; j += 16) {
    const __mmask16 k = avx512::lanes(t - j);
    const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + j), vd);
    _mm512_mask_storeu_ps(dp + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + j), x));
  }
}
void softmax_grad_row_bf16(const float* p, const float* dp, int64_t t, float dot, bits* ds) {
  const __m512 vd = _mm512_set1_ps(dot);
  for (int64_t j = 0; j < t; j += 16) {
    const __mmask16 k = avx512::lanes(t - j);
    const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + j), vd);
    _mm256_mask_storeu_epi16(ds + j, k,
                             avx512::to_bf16(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + j), x)));
  }
}
#endif

// Row-wise softmax of s [t, t] in place.
template <typename T>
void softmax_rows(T* s, int64_t t) {
  for (int64_t i = 0; i < t; ++i) {
    T* r = s + i * t;
    scale_row(r, t, T(1) / exp_row(r, t, row_max(r, t)));
  }
}

// dS = P ⊙ (dP - rowsum(dP ⊙ P)), row by row in place of dP [t, t].
template <typename T>
void softmax_grad_rows(const T* p, T* dp, int64_t t) {
  for (int64_t i = 0; i < t; ++i)
    softmax_grad_row(p + i * t, dp + i * t, t, dot_row(p + i * t, dp + i * t, t));
}

struct Dims {
  int64_t b, t, h, d;
  int64_t e() const { return h * d; }
};

Dims dims_of(const Array& qkv) {
  const Shape& s = qkv.shape();
  return {s[0], s[1], s[3], s[4]};
}

// The rows of a backward job (batch bi, head hi): q, k, v in qkv and dq, dk,
// dv in dqkv (rows 3·H·D apart), dO in dout (rows H·D apart).
template <typename T>
struct JobRows {
  int64_t bi, hi;
  const T *q, *k, *v, *d_o;
  T *dq, *dk, *dv;
  JobRows(const T* qkv, const T* dout, T* dqkv, const Dims& g, int64_t job)
      : bi(job / g.h), hi(job % g.h) {
    const int64_t base = bi * g.t * 3 * g.e() + hi * g.d;
    q = qkv + base, k = q + g.e(), v = q + 2 * g.e();
    dq = dqkv + base, dk = dq + g.e(), dv = dq + 2 * g.e();
    d_o = dout + bi * g.t * g.e() + hi * g.d;
  }
};

// P = softmax(scale · Q Kᵀ) for job (batch bi, head hi) into p [t, t].
template <typename T>
void probabilities(const T* qkv, const Dims& g, int64_t bi, int64_t hi, T scale, T* p) {
  const int64_t ld = 3 * g.e();
  const T* q = qkv + bi * g.t * ld + hi * g.d;
  gemm(false, true, g.t, g.t, g.d, scale, q, ld, q + g.e(), ld, p, g.t);
  softmax_rows(p, g.t);
}

template <typename T>
void attention_typed(const Array& qkv_a, const AttentionAttrs& at, T* out) {
  const Dims g = dims_of(qkv_a);
  const T* qkv = qkv_a.data<T>();
  const int64_t ld = 3 * g.e();
  parallel_for(g.b * g.h, 4 * g.t * g.t * g.d, [&](int64_t j0, int64_t j1) {
    std::vector<T> p(g.t * g.t);
    for (int64_t job = j0; job < j1; ++job) {
      int64_t bi = job / g.h, hi = job % g.h;
      probabilities(qkv, g, bi, hi, static_cast<T>(at.scale), p.data());
      const T* v = qkv + bi * g.t * ld + 2 * g.e() + hi * g.d;
      gemm(false, false, g.t, g.d, g.t, T(1), p.data(), g.t, v, ld,
           out + bi * g.t * g.e() + hi * g.d, g.e());
    }
  });
}

// With P = softmax(S), S = scale · Q Kᵀ and O = P V:
//   dV = Pᵀ dO, dP = dO Vᵀ, dS = P ⊙ (dP - rowsum(dP ⊙ P)),
//   dQ = scale · dS K, dK = scale · dSᵀ Q.
template <typename T>
void attention_grad_typed(const Array& qkv_a, const Array& dout_a, const AttentionAttrs& at,
                          T* dqkv) {
  const Dims g = dims_of(qkv_a);
  const T* qkv = qkv_a.data<T>();
  const T* dout = dout_a.data<T>();
  const int64_t ld = 3 * g.e();
  const T scale = static_cast<T>(at.scale);
  parallel_for(g.b * g.h, 10 * g.t * g.t * g.d, [&](int64_t j0, int64_t j1) {
    std::vector<T> p(g.t * g.t), dp(g.t * g.t);
    for (int64_t job = j0; job < j1; ++job) {
      const JobRows<T> jr(qkv, dout, dqkv, g, job);
      const int64_t bi = jr.bi, hi = jr.hi;
      const T *q = jr.q, *k = jr.k, *v = jr.v, *d_o = jr.d_o;
      T *dq = jr.dq, *dk = jr.dk, *dv = jr.dv;
      probabilities(qkv, g, bi, hi, scale, p.data());
      gemm(true, false, g.t, g.d, g.t, T(1), p.data(), g.t, d_o, g.e(), dv, ld);
      gemm(false, true, g.t, g.t, g.d, T(1), d_o, g.e(), v, ld, dp.data(), g.t);
      softmax_grad_rows(p.data(), dp.data(), g.t);
      gemm(false, false, g.t, g.d, g.t, scale, dp.data(), g.t, k, ld, dq, ld);
      gemm(true, false, g.t, g.d, g.t, scale, dp.data(), g.t, q, ld, dk, ld);
    }
  });
}

// ---- bf16: bf16 qkv, dout and outputs; the GEMMs multiply bf16 values and
// sum in f32 (gemm_bf16: oneMKL's bf16 GEMM on AMX or AVX512-BF16, else
// widened to f32), the scores, softmax and its gradient stay f32, and P (the
// forward's unnormalized E) and dS are rounded to bf16 for the GEMMs that
// take them, as flash attention and PyTorch's bf16 SDPA on the CPU do.
void gemm16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const bits* a,
            int64_t lda, const bits* b, int64_t ldb, float* c, int64_t ldc, float beta = 0) {
  gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, "attention");
}

// Rows [t, d] of f32 into bf16 rows `ld` apart, row i times c[i] (or 1 if c
// is null).
void store_rows(const float* x, int64_t t, int64_t d, bits* y, int64_t ld,
                const float* c = nullptr) {
  for (int64_t i = 0; i < t; ++i) {
    const float ci = c ? c[i] : 1.0f;
    const float* xi = x + i * d;
    bits* yi = y + i * ld;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) yi[j] = narrow_bf16(xi[j] * ci);
  }
}

// S = scale · Q Kᵀ for job (batch bi, head hi) into s [t, t], f32.
void scores16(const bits* qkv, const Dims& g, int64_t bi, int64_t hi, float scale, float* s) {
  const int64_t ld = 3 * g.e();
  const bits* q = qkv + bi * g.t * ld + hi * g.d;
  gemm16(false, true, g.t, g.t, g.d, scale, q, ld, q + g.e(), ld, s, g.t);
}

// The forward normalizes late, as flash attention does: E = exp(S - rowmax)
// goes to bf16 straight from the exp, O = E V, and each row of O is scaled
// by 1 / rowsum(E) as it is rounded to bf16.
void attention_bf16(const Array& qkv_a, const AttentionAttrs& at, bits* out) {
  const Dims g = dims_of(qkv_a);
  const bits* qkv = static_cast<const bits*>(qkv_a.raw());
  const int64_t ld = 3 * g.e();
  parallel_for(g.b * g.h, 4 * g.t * g.t * g.d, [&](int64_t j0, int64_t j1) {
    std::vector<float> s(g.t * g.t), o(g.t * g.d), inv(g.t);
    std::vector<bits> e16(g.t * g.t);
    for (int64_t job = j0; job < j1; ++job) {
      int64_t bi = job / g.h, hi = job % g.h;
      scores16(qkv, g, bi, hi, static_cast<float>(at.scale), s.data());
      for (int64_t i = 0; i < g.t; ++i) {
        const float* r = s.data() + i * g.t;
        inv[i] = 1.0f / exp_row_bf16(r, g.t, row_max(r, g.t), e16.data() + i * g.t);
      }
      const bits* v = qkv + bi * g.t * ld + 2 * g.e() + hi * g.d;
      gemm16(false, false, g.t, g.d, g.t, 1.0f, e16.data(), g.t, v, ld, o.data(), g.d);
      store_rows(o.data(), g.t, g.d, out + bi * g.t * g.e() + hi * g.d, g.e(), inv.data());
    }
  });
}

void attention_grad_bf16(const Array& qkv_a, const Array& dout_a, const AttentionAttrs& at,
                         bits* dqkv) {
  const Dims g = dims_of(qkv_a);
  const bits* qkv = static_cast<const bits*>(qkv_a.raw());
  const bits* dout = static_cast<const bits*>(dout_a.raw());
  const int64_t ld = 3 * g.e();
  const float scale = static_cast<float>(at.scale);
  parallel_for(g.b * g.h, 10 * g.t * g.t * g.d, [&](int64_t j0, int64_t j1) {
    std::vector<float> p(g.t * g.t), dp(g.t * g.t), o(g.t * g.d);
    std::vector<bits> p16(g.t * g.t);
    for (int64_t job = j0; job < j1; ++job) {
      const JobRows<bits> jr(qkv, dout, dqkv, g, job);
      const int64_t bi = jr.bi, hi = jr.hi;
      const bits *q = jr.q, *k = jr.k, *v = jr.v, *d_o = jr.d_o;
      bits *dq = jr.dq, *dk = jr.dk, *dv = jr.dv;
      scores16(qkv, g, bi, hi, scale, p.data());
      for (int64_t i = 0; i < g.t; ++i) {  // P in f32 and in bf16
        float* r = p.data() + i * g.t;
        scale_row_bf16(r, g.t, 1.0f / exp_row(r, g.t, row_max(r, g.t)), p16.data() + i * g.t);
      }
      gemm16(true, false, g.t, g.d, g.t, 1.0f, p16.data(), g.t, d_o, g.e(), o.data(), g.d);
      store_rows(o.data(), g.t, g.d, dv, ld);
      gemm16(false, true, g.t, g.t, g.d, 1.0f, d_o, g.e(), v, ld, dp.data(), g.t);
      for (int64_t i = 0; i < g.t; ++i) {  // dS in bf16, in P's buffer
        const float *pr = p.data() + i * g.t, *dr = dp.data() + i * g.t;
        softmax_grad_row_bf16(pr, dr, g.t, dot_row(pr, dr, g.t), p16.data() + i * g.t);
      }
      gemm16(false, false, g.t, g.d, g.t, scale, p16.data(), g.t, k, ld, o.data(), g.d);
      store_rows(o.data(), g.t, g.d, dq, ld);
      gemm16(true, false, g.t, g.d, g.t, scale, p16.data(), g.t, q, ld, o.data(), g.d);
      store_rows(o.data(), g.t, g.d, dk, ld);
    }
  });
}

#if KILN_CPU_AVX512
// ---- bf16 on kiln's tile kernels (tiles.h: AMX or AVX512-BF16): the same
// products, sums and roundings as above, with the operands laid out per job
// as the kernels take them (a few µs of shuffles a job where oneMKL packs
// each GEMM's operands itself): A row-major, B in the pair layout, both
// zero-padded to whole tiles (16 rows and columns, 32 along k), which the
// buffers of a thread keep from their allocation (each job writes only
// inside its sizes).

inline __mmask32 lanes32(int64_t n) {
  return n >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << n) - 1);
}

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Rows [rows, cols] (ld apart) into dst (ldd apart).
void copy_rows(const bits* src, int64_t ld, int64_t rows, int64_t cols, bits* dst, int64_t ldd) {
  for (int64_t i = 0; i < rows; ++i) std::memcpy(dst + i * ldd, src + i * ld, cols * sizeof(bits));
}

// B [k, n] (rows ld apart) in the pair layout: dst row r interleaves rows 2r
// and 2r + 1 (zeros past k).
void pair_rows(const bits* src, int64_t ld, int64_t k, int64_t n, bits* dst, int64_t ldd) {
  alignas(64) static const uint16_t lo_hi[64] = {
      0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
      11, 43, 12, 44, 13, 45, 14, 46, 15, 47, 16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53,
      22, 54, 23, 55, 24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(lo_hi), hi = _mm512_load_si512(lo_hi + 32);
  for (int64_t r = 0; 2 * r < k; ++r) {
    const bits* s0 = src + 2 * r * ld;
    const bool odd = 2 * r + 1 == k;
    bits* d = dst + r * ldd;
    for (int64_t j = 0; j < n; j += 32) {
      const __mmask32 m = lanes32(n - j);
      const __m512i x0 = _mm512_maskz_loadu_epi16(m, s0 + j);
      const __m512i x1 = odd ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi16(m, s0 + ld + j);
      const int64_t count = 2 * std::min<int64_t>(32, n - j);
      _mm512_mask_storeu_epi16(d + 2 * j, lanes32(count), _mm512_permutex2var_epi16(x0, lo, x1));
      if (count > 32)
        _mm512_mask_storeu_epi16(d + 2 * j + 32, lanes32(count - 32),
                                 _mm512_permutex2var_epi16(x0, hi, x1));
    }
  }
}

// The permutes of transpose16: for stage st (blocks of s = 8 >> st lanes),
// the new row with bit s clear (keep) and set (take), from rows x and y
// (lanes 16 + l of y).
struct TransposeIndices {
  alignas(64) int idx[4][2][16];
  constexpr TransposeIndices() : idx() {
    for (int st = 0; st < 4; ++st) {
      const int s = 8 >> st;
      for (int l = 0; l < 16; ++l) {
        idx[st][0][l] = (l & s) ? 16 + l - s : l;
        idx[st][1][l] = (l & s) ? 16 + l : l + s;
      }
    }
  }
};
constexpr TransposeIndices kTranspose;

// Transposes 16 x 16 32-bit lanes in place: r[i][l] <- r[l][i]. Four
// stages of block swaps (8, 4, 2, 1 lanes), two permutes per row pair each;
// every index a constant, so that r stays in registers.
template <int St, int... I>
__attribute__((always_inline)) inline void transpose_stage(__m512i (&r)[16],
                                                           std::integer_sequence<int, I...>) {
  constexpr int s = 8 >> St;
  const __m512i keep = _mm512_load_si512(kTranspose.idx[St][0]);
  const __m512i take = _mm512_load_si512(kTranspose.idx[St][1]);
  auto swap = [&](auto i) {
    constexpr int a = decltype(i)::value;
    if constexpr (!(a & s)) {
      const __m512i x = r[a], y = r[a + s];
      r[a] = _mm512_permutex2var_epi32(x, keep, y);
      r[a + s] = _mm512_permutex2var_epi32(x, take, y);
    }
  };
  (swap(std::integral_constant<int, I>{}), ...);
}
__attribute__((always_inline)) inline void transpose16(__m512i (&r)[16]) {
  constexpr auto rows = std::make_integer_sequence<int, 16>{};
  transpose_stage<0>(r, rows);
  transpose_stage<1>(r, rows);
  transpose_stage<2>(r, rows);
  transpose_stage<3>(r, rows);
}

// Row i of a 16-row block that starts at row i0 of n: the mask m, or none
// past n (masked loads and stores neither read nor write there, nor fault).
inline __mmask16 row_mask(int64_t i0, int i, int64_t n, __mmask16 m) {
  return i0 + i < n ? m : __mmask16(0);
}

// Bᵀ for M [n, k] (rows ld apart, k even) in the pair layout: dst row r holds
// M[j][2r], M[j][2r + 1] for each row j (a transpose of 32-bit pairs).
void pair_cols(const bits* src, int64_t ld, int64_t n, int64_t k, bits* dst, int64_t ldd) {
  __m512i r[16];
  for (int64_t j0 = 0; j0 < n; j0 += 16)
    for (int64_t c0 = 0; c0 < k; c0 += 32) {
      const __mmask16 m = avx512::lanes((k - c0) / 2), rows = avx512::lanes(n - j0);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = _mm512_maskz_loadu_epi32(row_mask(j0, i, n, m), src + (j0 + i) * ld + c0);
      transpose16(r);
#pragma GCC unroll 16
      for (int p = 0; p < 16; ++p)
        _mm512_mask_storeu_epi32(dst + (c0 / 2 + p) * ldd + 2 * j0, row_mask(c0, 2 * p, k, rows),
                                 r[p]);
    }
}

// Mᵀ for M [rows, cols] (rows ld apart, cols even) into dst [cols][ldd].
void transpose_rows(const bits* src, int64_t ld, int64_t rows, int64_t cols, bits* dst,
                    int64_t ldd) {
  __m512i r[16];
  for (int64_t i0 = 0; i0 < rows; i0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 32) {
      const __mmask16 m = avx512::lanes((cols - c0) / 2), out = avx512::lanes(rows - i0);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = _mm512_maskz_loadu_epi32(row_mask(i0, i, rows, m), src + (i0 + i) * ld + c0);
      transpose16(r);  // r[p]: columns c0 + 2p and c0 + 2p + 1 of rows i0..i0 + 15
#pragma GCC unroll 16
      for (int p = 0; p < 16; ++p) {
        const __mmask16 w = row_mask(c0, 2 * p, cols, out);
        _mm256_mask_storeu_epi16(dst + (c0 + 2 * p) * ldd + i0, w, _mm512_cvtepi32_epi16(r[p]));
        _mm256_mask_storeu_epi16(dst + (c0 + 2 * p + 1) * ldd + i0, w,
                                 _mm512_cvtepi32_epi16(_mm512_srli_epi32(r[p], 16)));
      }
    }
}

// y[i][c] = bf16(alpha · x[c][i]) for i < rows, c < cols: x [cols][ldx] f32
// (ldx >= rows rounded up to 16), y rows ld apart; rounded by avx512::to_bf16.
void store_transposed(const float* x, int64_t ldx, int64_t rows, int64_t cols, float alpha, bits* y,
                      int64_t ld) {
  const __m512 va = _mm512_set1_ps(alpha);
  __m512i r[16];
  for (int64_t i0 = 0; i0 < rows; i0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const __mmask16 m = avx512::lanes(cols - c0);
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c)
        r[c] = _mm512_maskz_loadu_epi32(row_mask(c0, c, cols, 0xffff), x + (c0 + c) * ldx + i0);
      transpose16(r);  // r[i]: columns c0..c0 + 15 of row i0 + i
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        _mm256_mask_storeu_epi16(y + (i0 + i) * ld + c0, row_mask(i0, i, rows, m),
                                 avx512::to_bf16(_mm512_mul_ps(_mm512_castsi512_ps(r[i]), va)));
    }
}

// 2^x for 16 lanes, x = n + f with n = floor(x) and f in [0, 1): 2^f by a
// polynomial of degree 5 (relative error below 1.8e-7, as exp16's), times
// 2^n by vscalefps. With the scale and the row's max folded into one FMA
// before it, exp(scale · s - scale · max) costs 9 operations where
// exp16 after a separate pass of scaling took 16 (the tile path's softmax,
// forward and backward). x is clamped at -150 (2^-150 rounds to 0), so that
// -inf gives 0; NaN stays NaN.
inline __m512 exp2_16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);  // returns the second operand for NaN
#if defined(__AVX512DQ__)
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
#else
  const __m512 f =
      _mm512_sub_ps(x, _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
#endif
  __m512 p = _mm512_set1_ps(0.0018775782082229853f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.008989342488348484f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05582631006836891f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24015362560749054f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931530833244324f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999999403953552f));
  return _mm512_scalef_ps(p, x);  // p · 2^floor(x)
}

// The softmax's exponentials of a row of raw scores r (t of them): x =
// exp(scale · (r - max)) as 2^(c · r - c · max), c = scale · log2(e), for a
// row whose max is m.
struct ScaledExp {
  __m512 c, b;
  ScaledExp(float scale, float m) {
    const float cs = scale * 1.44269504088896341f;
    c = _mm512_set1_ps(cs);
    b = _mm512_set1_ps(-cs * m);
  }
  __m512 operator()(__m512 r) const { return exp2_16(_mm512_fmadd_ps(r, c, b)); }
};

// e = bf16(x) for the row's x; returns the sum of x, unrounded.
float scaled_exp_row_bf16(const float* r, int64_t t, const ScaledExp& ex, bits* e) {
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < t; j += 16) {
    const __mmask16 k = avx512::lanes(t - j);
    const __m512 x = ex(_mm512_maskz_loadu_ps(k, r + j));
    _mm256_mask_storeu_epi16(e + j, k, avx512::to_bf16(x));
    total = _mm512_mask_add_ps(total, k, total, x);
  }
  return _mm512_reduce_add_ps(total);
}

// r = x in place; returns the sum of x.
float scaled_exp_row(float* r, int64_t t, const ScaledExp& ex) {
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < t; j += 16) {
    const __mmask16 k = avx512::lanes(t - j);
    const __m512 x = ex(_mm512_maskz_loadu_ps(k, r + j));
    _mm512_mask_storeu_ps(r + j, k, x);
    total = _mm512_mask_add_ps(total, k, total, x);
  }
  return _mm512_reduce_add_ps(total);
}

// store_rows for the tile path: rows [t, d] of f32 (d a multiple of 16)
// into bf16 rows `ld` apart, row i times c[i] (or times c0 where c is null),
// rounded by avx512::to_bf16 as store_transposed rounds.
void store_rows16(const float* x, int64_t t, int64_t d, bits* y, int64_t ld, const float* c,
                  float c0 = 1.0f) {
  for (int64_t i = 0; i < t; ++i) {
    const __m512 ci = _mm512_set1_ps(c ? c[i] : c0);
    for (int64_t j = 0; j < d; j += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i * ld + j),
                          avx512::to_bf16(_mm512_mul_ps(_mm512_loadu_ps(x + i * d + j), ci)));
  }
}

// Prefetches into L2 the d values (bf16) at p: a row of the next job's, one
// row per row of the current job's softmax. A job's q, k, v (and dO) rows
// are 3·H·D (H·D) values apart, too far apart for the hardware's stride
// prefetcher, and came from memory a row at a time as the next job packed
// them: ViT-S's attention at batch 32, two threads, forward 3.90 -> 3.40
// ms and backward 10.7 -> 8.8 ms with this and exp2_16
// (bench/results/2026-12-07-attention-prefetch/).
inline void prefetch_row(const bits* p, int64_t d) {
  for (int64_t j = 0; j < d; j += 32)
    _mm_prefetch(reinterpret_cast<const char*>(p + j), _MM_HINT_T1);
}

// A job's tile sizes and buffers (one set per thread, zeroed once).
struct TileJob {
  int64_t t, d, tp, tk;  // tokens, head dim, tokens rounded to 16 and to 32
  std::vector<bits> qa, ka, kb, pa, pb, dta;
  std::vector<float> s, dp, o, c2;
  std::vector<float> inv;
  explicit TileJob(const Dims& g, bool backward)
      : t(g.t), d(g.d), tp(round_up(g.t, 16)), tk(round_up(g.t, 32)) {
    qa.assign(tp * d, 0);   // a [t, d] operand (Q, dO)
    kb.assign(tp * d, 0);   // pairs of Kᵀ or Vᵀ columns [d / 2][2 tp]
    pa.assign(tp * tk, 0);  // E, or dS: [tp][tk]
    ka.assign(tk * d, 0);   // pairs of V or K rows [tk / 2][2 d]
    s.assign(tp * tp, 0);
    o.assign(tp * d, 0);
    inv.assign(t, 0);
    if (backward) {
      pb.assign(tk * tp, 0);  // pairs of P or dS rows [tk / 2][2 tp]
      dta.assign(d * tk, 0);  // dOᵀ or Qᵀ [d][tk]
      dp.assign(tp * tp, 0);
      c2.assign(d * tp, 0);
    }
  }
  // S = Q Kᵀ (unscaled) for q, k rows ld apart, into s [tp][tp].
  void scores(const bits* q, const bits* k, int64_t ld) {
    copy_rows(q, ld, t, d, qa.data(), d);
    pair_cols(k, ld, t, d, kb.data(), 2 * tp);
    tiles::gemm(t, t, d, qa.data(), d, kb.data(), 2 * tp, s.data(), tp);
  }
  // o [tp][d] = pa [tp][tk] · (rows of x [t, d], ld apart)
  void times_rows(const bits* x, int64_t ld) {
    pair_rows(x, ld, t, d, ka.data(), 2 * d);
    tiles::gemm(t, d, t, pa.data(), tk, ka.data(), 2 * d, o.data(), d);
  }
  // c2 [d][tp] = (x [t, d], rows ld apart)ᵀ · pa [t, t], i.e. (paᵀ x)ᵀ
  void transposed_times_pa(const bits* x, int64_t ld) {
    transpose_rows(x, ld, t, d, dta.data(), tk);
    pair_rows(pa.data(), tk, t, t, pb.data(), 2 * tp);
    tiles::gemm(d, t, t, dta.data(), tk, pb.data(), 2 * tp, c2.data(), tp);
  }
};

void attention_bf16_tiles(const Array& qkv_a, const AttentionAttrs& at, bits* out) {
  const Dims g = dims_of(qkv_a);
  const bits* qkv = static_cast<const bits*>(qkv_a.raw());
  const int64_t ld = 3 * g.e();
  const float scale = static_cast<float>(at.scale);
  parallel_for(g.b * g.h, 4 * g.t * g.t * g.d, [&](int64_t j0, int64_t j1) {
    TileJob w(g, false);
    tiles::begin();
    auto q_of = [&](int64_t job) { return qkv + (job / g.h) * g.t * ld + (job % g.h) * g.d; };
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t bi = job / g.h, hi = job % g.h;
      const bits* q = q_of(job);
      w.scores(q, q + g.e(), ld);
      const bits* next = job + 1 < j1 ? q_of(job + 1) : nullptr;
      for (int64_t i = 0; i < g.t; ++i) {
        if (next) {
          prefetch_row(next + i * ld, g.d);
          prefetch_row(next + i * ld + g.e(), g.d);
          prefetch_row(next + i * ld + 2 * g.e(), g.d);
        }
        float* r = w.s.data() + i * w.tp;
        const ScaledExp ex(scale, row_max(r, g.t));
        w.inv[i] = 1.0f / scaled_exp_row_bf16(r, g.t, ex, w.pa.data() + i * w.tk);
      }
      w.times_rows(q + 2 * g.e(), ld);
      store_rows16(w.o.data(), g.t, g.d, out + bi * g.t * g.e() + hi * g.d, g.e(), w.inv.data());
    }
    tiles::end();
  });
}

void attention_grad_bf16_tiles(const Array& qkv_a, const Array& dout_a, const AttentionAttrs& at,
                               bits* dqkv) {
  const Dims g = dims_of(qkv_a);
  const bits* qkv = static_cast<const bits*>(qkv_a.raw());
  const bits* dout = static_cast<const bits*>(dout_a.raw());
  const int64_t ld = 3 * g.e();
  const float scale = static_cast<float>(at.scale);
  parallel_for(g.b * g.h, 10 * g.t * g.t * g.d, [&](int64_t j0, int64_t j1) {
    TileJob w(g, true);
    tiles::begin();
    for (int64_t job = j0; job < j1; ++job) {
      const JobRows<bits> jr(qkv, dout, dqkv, g, job);
      const bits *q = jr.q, *k = jr.k, *v = jr.v, *d_o = jr.d_o;
      bits *dq = jr.dq, *dk = jr.dk, *dv = jr.dv;
      w.scores(q, k, ld);
      const bool more = job + 1 < j1;
      const JobRows<bits> nr(qkv, dout, dqkv, g, more ? job + 1 : job);
      for (int64_t i = 0; i < g.t; ++i) {  // P in f32 (in s) and in bf16 (in pa)
        if (more) {
          prefetch_row(nr.q + i * ld, g.d);
          prefetch_row(nr.k + i * ld, g.d);
          prefetch_row(nr.v + i * ld, g.d);
          prefetch_row(nr.d_o + i * g.e(), g.d);
        }
        float* r = w.s.data() + i * w.tp;
        const ScaledExp ex(scale, row_max(r, g.t));
        scale_row_bf16(r, g.t, 1.0f / scaled_exp_row(r, g.t, ex), w.pa.data() + i * w.tk);
      }
      w.transposed_times_pa(d_o, g.e());  // dVᵀ = dOᵀ P
      store_transposed(w.c2.data(), w.tp, g.t, g.d, 1.0f, dv, ld);
      copy_rows(d_o, g.e(), g.t, g.d, w.qa.data(), g.d);  // dP = dO Vᵀ
      pair_cols(v, ld, g.t, g.d, w.kb.data(), 2 * w.tp);
      tiles::gemm(g.t, g.t, g.d, w.qa.data(), g.d, w.kb.data(), 2 * w.tp, w.dp.data(), w.tp);
      for (int64_t i = 0; i < g.t; ++i) {  // dS in bf16, in pa
        const float *pr = w.s.data() + i * w.tp, *dr = w.dp.data() + i * w.tp;
        softmax_grad_row_bf16(pr, dr, g.t, dot_row(pr, dr, g.t), w.pa.data() + i * w.tk);
      }
      w.times_rows(k, ld);  // dQ = scale · dS K
      store_rows16(w.o.data(), g.t, g.d, dq, ld, nullptr, scale);
      w.transposed_times_pa(q, ld);  // dKᵀ = Qᵀ dS
      store_transposed(w.c2.data(), w.tp, g.t, g.d, scale, dk, ld);
    }
    tiles::end();
  });
}
#endif

void attention_kernel(const KernelContext&, const Primitive& p,
                      const std::vector<Array>& in, ArrayNode& out) {
  check_sgemm_library();  // before the parallel region
  gemm_bf16_native();     // (its choice is made once, outside it)
  void* y = alloc_output(out);
  if (numel(out.shape) == 0) return;
  const AttentionAttrs& at = p.attrs<AttentionAttrs>();
  switch (in[0].dtype()) {
    case DType::f32: return attention_typed<float>(in[0], at, static_cast<float*>(y));
    case DType::f64: return attention_typed<double>(in[0], at, static_cast<double*>(y));
    case DType::bf16:
#if KILN_CPU_AVX512
      if (!tile_kernels().empty() && dims_of(in[0]).d % 32 == 0)
        return attention_bf16_tiles(in[0], at, static_cast<bits*>(y));
#endif
      return attention_bf16(in[0], at, static_cast<bits*>(y));
    default:
      fail(p.name(), std::string("needs f32, f64 or bf16 inputs, got ") + name_of(in[0].dtype()));
  }
}

void attention_grad_kernel(const KernelContext&, const Primitive& p,
                           const std::vector<Array>& in, ArrayNode& out) {
  check_sgemm_library();  // before the parallel region
  gemm_bf16_native();
  void* y = alloc_output(out);
  if (numel(out.shape) == 0) return;
  const AttentionAttrs& at = p.attrs<AttentionAttrs>();
  switch (in[0].dtype()) {
    case DType::f32: return attention_grad_typed<float>(in[0], in[1], at, static_cast<float*>(y));
    case DType::f64: return attention_grad_typed<double>(in[0], in[1], at, static_cast<double*>(y));
    case DType::bf16:
#if KILN_CPU_AVX512
      if (!tile_kernels().empty() && dims_of(in[0]).d % 32 == 0)
        return attention_grad_bf16_tiles(in[0], in[1], at, static_cast<bits*>(y));
#endif
      return attention_grad_bf16(in[0], in[1], at, static_cast<bits*>(y));
    default:
      fail(p.name(), std::string("needs f32, f64 or bf16 inputs, got ") + name_of(in[0].dtype()));
  }
}

// ---- Sdpa: q [B, T, H, D], k and v [B, S, H, D] (rows H·D apart in each),
// a causal mask and an additive bias. Blocks of kSdpaRows queries: a block
// computes the scores of the keys its last row sees and no more (a causal
// mask's upper blocks are skipped), [rows, keys] at a time in a per-thread
// buffer; the forward's jobs are (batch, head, block), the backward's
// (batch, head), whose dK and dV sum over the blocks.
constexpr int64_t kSdpaRows = 64;

struct SdpaDims {
  int64_t b, t, s, h, d;
  int64_t e() const { return h * d; }  // the row stride of q, k, v, dout, out
  int64_t blocks() const { return (t + kSdpaRows - 1) / kSdpaRows; }
};

SdpaDims sdpa_dims(const std::vector<Array>& in) {
  const Shape &q = in[0].shape(), &k = in[1].shape();
  return {q[0], q[1], k[1], q[2], q[3]};
}

// What query i of batch bi, head hi sees: keys [0, visible(i)) (all S, or
// with the causal mask those up to i + S - T), each score plus the bias
// [B|1, H|1, T|1, S|1] (type T: f32 for f32 and bf16, f64 for f64).
template <typename T>
struct SdpaMask {
  int64_t t, s;
  bool causal;
  const T* bias = nullptr;
  int64_t sb = 0, sh = 0, st = 0, ss = 0;  // its strides (0 where broadcast)
  SdpaMask(const SdpaDims& g, const SdpaAttrs& at, const std::vector<Array>& in, size_t bias_at)
      : t(g.t), s(g.s), causal(at.causal) {
    if (!at.bias) return;
    const Shape& bs = in[bias_at].shape();
    bias = in[bias_at].data<T>();
    ss = bs[3] == 1 ? 0 : 1;
    st = bs[2] == 1 ? 0 : bs[3];
    sh = bs[1] == 1 ? 0 : bs[2] * bs[3];
    sb = bs[0] == 1 ? 0 : bs[1] * bs[2] * bs[3];
  }
  int64_t visible(int64_t i) const { return causal ? std::clamp<int64_t>(i + 1 + s - t, 0, s) : s; }
  // The keys that rows [.., i1) read: those their last row sees.
  int64_t keys(int64_t i1) const { return visible(i1 - 1); }
  // Adds row i's bias to its scores r over the keys it sees (of the n
  // computed); returns how many it sees.
  int64_t apply(T* r, int64_t n, int64_t bi, int64_t hi, int64_t i) const {
    const int64_t vis = std::min(visible(i), n);
    if (!bias) return vis;
    const T* br = bias + bi * sb + hi * sh + i * st;
    if (ss) {
#pragma omp simd
      for (int64_t j = 0; j < vis; ++j) r[j] += br[j];
    } else {
      const T c = br[0];
#pragma omp simd
      for (int64_t j = 0; j < vis; ++j) r[j] += c;
    }
    return vis;
  }
};

// 1 / the sum of a row's exponentials: 0 for a row of no key or only -inf
// scores (which then stays all zeros), NaN where a score is NaN.
template <typename T>
T inverse_total(T total) {
  return total == T(0) ? T(0) : T(1) / total;
}
// The shift of a row's exponentials: its max, or 0 where that is -inf (no
// finite score), so that exp(-inf - shift) = 0 and NaN scores stay NaN.
template <typename T>
T row_shift(const T* r, int64_t vis) {
  const T m = vis > 0 ? row_max(r, vis) : T(0);
  return m == -std::numeric_limits<T>::infinity() ? T(0) : m;
}

// The softmax of row r over [0, vis) in place, zeros on [vis, n): a row
// that sees no key (or only -inf scores) is all zeros.
template <typename T>
void softmax_visible(T* r, int64_t n, int64_t vis) {
  if (vis > 0) scale_row(r, vis, inverse_total(exp_row(r, vis, row_shift(r, vis))));
  std::fill(r + vis, r + n, T(0));
}

template <typename T>
void zero_rows(T* x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t i = 0; i < rows; ++i) std::fill(x + i * ld, x + i * ld + cols, T(0));
}

template <typename T>
void sdpa_typed(const std::vector<Array>& in, const SdpaAttrs& at, T* out) {
  const SdpaDims g = sdpa_dims(in);
  const SdpaMask<T> mask(g, at, in, 3);
  const T *q = in[0].data<T>(), *k = in[1].data<T>(), *v = in[2].data<T>();
  const int64_t ld = g.e(), nb = g.blocks();
  const T scale = static_cast<T>(at.scale);
  parallel_for(g.b * g.h * nb, 4 * kSdpaRows * g.s * g.d, [&](int64_t j0, int64_t j1) {
    std::vector<T> p(kSdpaRows * g.s);
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t blk = job % nb, bi = job / nb / g.h, hi = job / nb % g.h;
      const int64_t i0 = blk * kSdpaRows, m = std::min(g.t, i0 + kSdpaRows) - i0;
      const int64_t n = mask.keys(i0 + m);
      const int64_t qo = (bi * g.t + i0) * ld + hi * g.d, ko = bi * g.s * ld + hi * g.d;
      if (n == 0) {
        zero_rows(out + qo, m, g.d, ld);
        continue;
      }
      gemm(false, true, m, n, g.d, scale, q + qo, ld, k + ko, ld, p.data(), n);
      for (int64_t i = 0; i < m; ++i) {
        T* r = p.data() + i * n;
        softmax_visible(r, n, mask.apply(r, n, bi, hi, i0 + i));
      }
      gemm(false, false, m, g.d, n, T(1), p.data(), n, v + ko, ld, out + qo, ld);
    }
  });
}

// Per (batch, head), block by block of queries (P recomputed as in the
// forward): dV += Pᵀ dO, dP = dO Vᵀ, dS = P ⊙ (dP - rowsum(dP ⊙ P)),
// dQ = scale · dS K, dK += scale · dSᵀ Q; dx [B, T + 2S, H, D] holds dq, dk
// and dv.
template <typename T>
void sdpa_grad_typed(const std::vector<Array>& in, const SdpaAttrs& at, T* dx) {
  const SdpaDims g = sdpa_dims(in);
  const SdpaMask<T> mask(g, at, in, 4);
  const T *q = in[0].data<T>(), *k = in[1].data<T>(), *v = in[2].data<T>();
  const T* dout = in[3].data<T>();
  const int64_t ld = g.e(), rows = g.t + 2 * g.s;
  const T scale = static_cast<T>(at.scale);
  parallel_for(g.b * g.h, 10 * g.t * g.s * g.d, [&](int64_t j0, int64_t j1) {
    std::vector<T> p(kSdpaRows * g.s), dp(kSdpaRows * g.s);
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t bi = job / g.h, hi = job % g.h;
      const int64_t qo = bi * g.t * ld + hi * g.d, ko = bi * g.s * ld + hi * g.d;
      T* dq = dx + bi * rows * ld + hi * g.d;
      T *dk = dq + g.t * ld, *dv = dk + g.s * ld;
      zero_rows(dk, 2 * g.s, g.d, ld);
      for (int64_t i0 = 0; i0 < g.t; i0 += kSdpaRows) {
        const int64_t m = std::min(g.t, i0 + kSdpaRows) - i0, n = mask.keys(i0 + m);
        const T *qb = q + qo + i0 * ld, *dob = dout + qo + i0 * ld;
        if (n == 0) {
          zero_rows(dq + i0 * ld, m, g.d, ld);
          continue;
        }
        gemm(false, true, m, n, g.d, scale, qb, ld, k + ko, ld, p.data(), n);
        for (int64_t i = 0; i < m; ++i) {
          T* r = p.data() + i * n;
          softmax_visible(r, n, mask.apply(r, n, bi, hi, i0 + i));
        }
        gemm(true, false, n, g.d, m, T(1), p.data(), n, dob, ld, dv, ld, T(1));
        gemm(false, true, m, n, g.d, T(1), dob, ld, v + ko, ld, dp.data(), n);
        for (int64_t i = 0; i < m; ++i) {
          const T* pr = p.data() + i * n;
          T* dr = dp.data() + i * n;
          softmax_grad_row(pr, dr, n, dot_row(pr, dr, n));
        }
        gemm(false, false, m, g.d, n, scale, dp.data(), n, k + ko, ld, dq + i0 * ld, ld);
        gemm(true, false, n, g.d, m, scale, dp.data(), n, qb, ld, dk, ld, T(1));
      }
    }
  });
}

// bf16: the GEMMs multiply bf16 values and sum in f32, the scores, softmax
// and its gradient stay f32, P (the forward's unnormalized E) and dS are
// rounded to bf16 for the GEMMs that take them, as the packed kernels above;
// dK and dV sum over the blocks in f32 and are rounded once.
void sdpa_bf16(const std::vector<Array>& in, const SdpaAttrs& at, bits* out) {
  const SdpaDims g = sdpa_dims(in);
  const SdpaMask<float> mask(g, at, in, 3);
  const bits* q = static_cast<const bits*>(in[0].raw());
  const bits* k = static_cast<const bits*>(in[1].raw());
  const bits* v = static_cast<const bits*>(in[2].raw());
  const int64_t ld = g.e(), nb = g.blocks();
  const float scale = static_cast<float>(at.scale);
  parallel_for(g.b * g.h * nb, 4 * kSdpaRows * g.s * g.d, [&](int64_t j0, int64_t j1) {
    std::vector<float> s(kSdpaRows * g.s), o(kSdpaRows * g.d), inv(kSdpaRows);
    std::vector<bits> e16(kSdpaRows * g.s);
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t blk = job % nb, bi = job / nb / g.h, hi = job / nb % g.h;
      const int64_t i0 = blk * kSdpaRows, m = std::min(g.t, i0 + kSdpaRows) - i0;
      const int64_t n = mask.keys(i0 + m);
      const int64_t qo = (bi * g.t + i0) * ld + hi * g.d, ko = bi * g.s * ld + hi * g.d;
      if (n == 0) {
        zero_rows(out + qo, m, g.d, ld);
        continue;
      }
      gemm16(false, true, m, n, g.d, scale, q + qo, ld, k + ko, ld, s.data(), n);
      for (int64_t i = 0; i < m; ++i) {
        float* r = s.data() + i * n;
        bits* e = e16.data() + i * n;
        const int64_t vis = mask.apply(r, n, bi, hi, i0 + i);
        inv[i] = vis > 0 ? inverse_total(exp_row_bf16(r, vis, row_shift(r, vis), e)) : 0.0f;
        std::fill(e + vis, e + n, bits(0));
      }
      gemm16(false, false, m, g.d, n, 1.0f, e16.data(), n, v + ko, ld, o.data(), g.d);
      store_rows(o.data(), m, g.d, out + qo, ld, inv.data());
    }
  });
}

void sdpa_grad_bf16(const std::vector<Array>& in, const SdpaAttrs& at, bits* dx) {
  const SdpaDims g = sdpa_dims(in);
  const SdpaMask<float> mask(g, at, in, 4);
  const bits* q = static_cast<const bits*>(in[0].raw());
  const bits* k = static_cast<const bits*>(in[1].raw());
  const bits* v = static_cast<const bits*>(in[2].raw());
  const bits* dout = static_cast<const bits*>(in[3].raw());
  const int64_t ld = g.e(), rows = g.t + 2 * g.s;
  const float scale = static_cast<float>(at.scale);
  parallel_for(g.b * g.h, 10 * g.t * g.s * g.d, [&](int64_t j0, int64_t j1) {
    std::vector<float> p(kSdpaRows * g.s), dp(kSdpaRows * g.s), o(kSdpaRows * g.d);
    std::vector<float> dk32(g.s * g.d), dv32(g.s * g.d);
    std::vector<bits> p16(kSdpaRows * g.s);
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t bi = job / g.h, hi = job % g.h;
      const int64_t qo = bi * g.t * ld + hi * g.d, ko = bi * g.s * ld + hi * g.d;
      bits* dq = dx + bi * rows * ld + hi * g.d;
      bits *dk = dq + g.t * ld, *dv = dk + g.s * ld;
      std::fill(dk32.begin(), dk32.end(), 0.0f);
      std::fill(dv32.begin(), dv32.end(), 0.0f);
      for (int64_t i0 = 0; i0 < g.t; i0 += kSdpaRows) {
        const int64_t m = std::min(g.t, i0 + kSdpaRows) - i0, n = mask.keys(i0 + m);
        const bits *qb = q + qo + i0 * ld, *dob = dout + qo + i0 * ld;
        if (n == 0) {
          zero_rows(dq + i0 * ld, m, g.d, ld);
          continue;
        }
        gemm16(false, true, m, n, g.d, scale, qb, ld, k + ko, ld, p.data(), n);
        for (int64_t i = 0; i < m; ++i) {  // P in f32 and in bf16
          float* r = p.data() + i * n;
          softmax_visible(r, n, mask.apply(r, n, bi, hi, i0 + i));
          for (int64_t j = 0; j < n; ++j) p16[i * n + j] = narrow_bf16(r[j]);
        }
        gemm16(true, false, n, g.d, m, 1.0f, p16.data(), n, dob, ld, dv32.data(), g.d, 1.0f);
        gemm16(false, true, m, n, g.d, 1.0f, dob, ld, v + ko, ld, dp.data(), n);
        for (int64_t i = 0; i < m; ++i) {  // dS in bf16, in P's buffer
          const float *pr = p.data() + i * n, *dr = dp.data() + i * n;
          softmax_grad_row_bf16(pr, dr, n, dot_row(pr, dr, n), p16.data() + i * n);
        }
        gemm16(false, false, m, g.d, n, scale, p16.data(), n, k + ko, ld, o.data(), g.d);
        store_rows(o.data(), m, g.d, dq + i0 * ld, ld);
        gemm16(true, false, n, g.d, m, scale, p16.data(), n, qb, ld, dk32.data(), g.d, 1.0f);
      }
      store_rows(dk32.data(), g.s, g.d, dk, ld);
      store_rows(dv32.data(), g.s, g.d, dv, ld);
    }
  });
}

#if KILN_CPU_AVX512
// ---- Sdpa in bf16 on kiln's tile kernels (head dims that are multiples of
// 32, as the packed attention's): per (batch, head) job, K and V are laid
// out once in the pair layouts the kernels take, then each block of
// kSdpaRows queries runs the GEMMs of sdpa_bf16 and sdpa_grad_bf16 on the
// keys its last row sees. The backward sums dKᵀ and dVᵀ over the blocks in
// f32 in the tile kernels' accumulators (tiles::gemm's add) and rounds them
// once. A block that does not fill its tiles along k (the last one, along
// the queries) has zeros written past its rows; along the keys, P and dS
// are zero past what a row sees, up to the next 32.
struct SdpaTileJob {
  static constexpr int64_t R = kSdpaRows;  // a multiple of 32
  int64_t d, sp, sk;                       // head dim; keys rounded to 16 and to 32
  std::vector<bits> qa, kb, vb, ka, pa, pb, dta;
  std::vector<float> s, dp, o, inv, dkt, dvt;
  SdpaTileJob(const SdpaDims& g, bool backward)
      : d(g.d), sp(round_up(g.s, 16)), sk(round_up(g.s, 32)) {
    qa.assign(R * d, 0);   // a block's Q or dO rows [R][d]
    kb.assign(d * sp, 0);  // Kᵀ in pairs [d / 2][2 sp]
    ka.assign(sk * d, 0);  // V (forward) or K (backward) in pairs [sk / 2][2 d]
    pa.assign(R * sk, 0);  // E, P or dS in bf16 [R][sk]
    s.assign(R * sp, 0);
    o.assign(R * d, 0);
    inv.assign(R, 0);
    if (backward) {
      vb.assign(d * sp, 0);  // Vᵀ in pairs [d / 2][2 sp]
      pb.assign(R * sp, 0);  // P or dS in pairs [R / 2][2 sp]
      dta.assign(d * R, 0);  // dOᵀ or Qᵀ of a block [d][R]
      dp.assign(R * sp, 0);
      dkt.assign(d * sp, 0);  // dKᵀ and dVᵀ [d][sp]
      dvt.assign(d * sp, 0);
    }
  }
  // A job's keys and values (seen rows, ld apart) in the pair layouts: Kᵀ
  // in kb, and V in ka for the forward; for the backward Vᵀ in vb and K in
  // ka.
  void pack(const bits* k, const bits* v, int64_t ld, int64_t seen, bool backward) {
    if (seen == 0) return;
    pair_cols(k, ld, seen, d, kb.data(), 2 * sp);
    if (backward) pair_cols(v, ld, seen, d, vb.data(), 2 * sp);
    pair_rows(backward ? k : v, ld, seen, d, ka.data(), 2 * d);
  }
  // c [m][sp] = (x [m, d], rows ld apart) · Bᵀ for bt (kb or vb) in pairs,
  // over n keys: S = Q Kᵀ, or dP = dO Vᵀ.
  void times_transposed(const bits* x, int64_t ld, int64_t m, int64_t n,
                        const std::vector<bits>& bt, float* c) {
    copy_rows(x, ld, m, d, qa.data(), d);
    tiles::gemm(m, n, d, qa.data(), d, bt.data(), 2 * sp, c, sp);
  }
  // C [d][n] (ldc sp) += (x [m, d], rows ld apart)ᵀ · pa [m][n]: dVᵀ += dOᵀ P
  // or dKᵀ += Qᵀ dS for a block of m rows.
  void add_transposed_times_pa(const bits* x, int64_t ld, int64_t m, int64_t n, float* c) {
    const int64_t mk = round_up(m, 32), n16 = round_up(n, 16);
    transpose_rows(x, ld, m, d, dta.data(), R);
    pair_rows(pa.data(), sk, m, n16, pb.data(), 2 * sp);
    if (m < mk) {  // zeros along k past the block's rows
      for (int64_t c0 = 0; c0 < d; ++c0) std::fill_n(dta.data() + c0 * R + m, mk - m, bits(0));
      for (int64_t r = (m + 1) / 2; r < mk / 2; ++r)
        std::fill_n(pb.data() + r * 2 * sp, 2 * n16, bits(0));
    }
    tiles::gemm(d, n, m, dta.data(), R, pb.data(), 2 * sp, c, sp, true);
  }
};

// Row i's scores r (Q Kᵀ unscaled, n of them computed) made ready for
// their exponentials: the scale and the bias applied (the scale folded into
// the exponent where there is no bias and it is positive, as in the packed
// path), and the row's shift (row_shift). vis: the keys the row sees.
struct TileRow {
  int64_t vis;
  ScaledExp ex;
};
TileRow tile_row(float* r, int64_t n, const SdpaMask<float>& mask, float scale, int64_t bi,
                 int64_t hi, int64_t i) {
  const bool fold = !mask.bias && scale > 0;
  if (!fold) scale_row(r, std::min(mask.visible(i), n), scale);
  const int64_t vis = mask.apply(r, n, bi, hi, i);
  return {vis, ScaledExp(fold ? scale : 1.0f, row_shift(r, vis))};
}

void sdpa_bf16_tiles(const std::vector<Array>& in, const SdpaAttrs& at, bits* out) {
  const SdpaDims g = sdpa_dims(in);
  const SdpaMask<float> mask(g, at, in, 3);
  const bits* q = static_cast<const bits*>(in[0].raw());
  const bits* k = static_cast<const bits*>(in[1].raw());
  const bits* v = static_cast<const bits*>(in[2].raw());
  const int64_t ld = g.e(), seen = mask.keys(g.t);  // the keys any query sees
  const float scale = static_cast<float>(at.scale);
  parallel_for(g.b * g.h, 4 * g.t * seen * g.d, [&](int64_t j0, int64_t j1) {
    SdpaTileJob w(g, false);
    tiles::begin();
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t bi = job / g.h, hi = job % g.h;
      const int64_t qo = bi * g.t * ld + hi * g.d, ko = bi * g.s * ld + hi * g.d;
      w.pack(k + ko, v + ko, ld, seen, false);
      for (int64_t i0 = 0; i0 < g.t; i0 += w.R) {
        const int64_t m = std::min(g.t, i0 + w.R) - i0, n = mask.keys(i0 + m);
        bits* ob = out + qo + i0 * ld;
        if (n == 0) {
          zero_rows(ob, m, g.d, ld);
          continue;
        }
        const int64_t nk = round_up(n, 32);
        w.times_transposed(q + qo + i0 * ld, ld, m, n, w.kb, w.s.data());
        for (int64_t i = 0; i < m; ++i) {
          float* r = w.s.data() + i * w.sp;
          bits* e = w.pa.data() + i * w.sk;
          const TileRow row = tile_row(r, n, mask, scale, bi, hi, i0 + i);
          w.inv[i] = row.vis > 0 ? inverse_total(scaled_exp_row_bf16(r, row.vis, row.ex, e)) : 0.0f;
          std::fill(e + row.vis, e + nk, bits(0));
        }
        tiles::gemm(m, g.d, n, w.pa.data(), w.sk, w.ka.data(), 2 * g.d, w.o.data(), g.d);
        store_rows16(w.o.data(), m, g.d, ob, ld, w.inv.data());
      }
    }
    tiles::end();
  });
}

void sdpa_grad_bf16_tiles(const std::vector<Array>& in, const SdpaAttrs& at, bits* dx) {
  const SdpaDims g = sdpa_dims(in);
  const SdpaMask<float> mask(g, at, in, 4);
  const bits* q = static_cast<const bits*>(in[0].raw());
  const bits* k = static_cast<const bits*>(in[1].raw());
  const bits* v = static_cast<const bits*>(in[2].raw());
  const bits* dout = static_cast<const bits*>(in[3].raw());
  const int64_t ld = g.e(), rows = g.t + 2 * g.s, seen = mask.keys(g.t);
  const float scale = static_cast<float>(at.scale);
  parallel_for(g.b * g.h, 10 * g.t * seen * g.d, [&](int64_t j0, int64_t j1) {
    SdpaTileJob w(g, true);
    tiles::begin();
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t bi = job / g.h, hi = job % g.h;
      const int64_t qo = bi * g.t * ld + hi * g.d, ko = bi * g.s * ld + hi * g.d;
      bits* dq = dx + bi * rows * ld + hi * g.d;
      bits *dk = dq + g.t * ld, *dv = dk + g.s * ld;
      std::fill(w.dkt.begin(), w.dkt.end(), 0.0f);
      std::fill(w.dvt.begin(), w.dvt.end(), 0.0f);
      w.pack(k + ko, v + ko, ld, seen, true);
      for (int64_t i0 = 0; i0 < g.t; i0 += w.R) {
        const int64_t m = std::min(g.t, i0 + w.R) - i0, n = mask.keys(i0 + m);
        const bits *qb = q + qo + i0 * ld, *dob = dout + qo + i0 * ld;
        if (n == 0) {
          zero_rows(dq + i0 * ld, m, g.d, ld);
          continue;
        }
        const int64_t nk = round_up(n, 32);
        w.times_transposed(qb, ld, m, n, w.kb, w.s.data());  // S = Q Kᵀ
        for (int64_t i = 0; i < m; ++i) {  // P in f32 (in s) and in bf16 (in pa)
          float* r = w.s.data() + i * w.sp;
          bits* p = w.pa.data() + i * w.sk;
          const TileRow row = tile_row(r, n, mask, scale, bi, hi, i0 + i);
          if (row.vis > 0)
            scale_row_bf16(r, row.vis, inverse_total(scaled_exp_row(r, row.vis, row.ex)), p);
          std::fill(r + row.vis, r + n, 0.0f);
          std::fill(p + row.vis, p + nk, bits(0));
        }
        w.add_transposed_times_pa(dob, ld, m, n, w.dvt.data());  // dVᵀ += dOᵀ P
        w.times_transposed(dob, ld, m, n, w.vb, w.dp.data());    // dP = dO Vᵀ
        for (int64_t i = 0; i < m; ++i) {  // dS in bf16, in pa (zeros past n stay)
          const float *pr = w.s.data() + i * w.sp, *dr = w.dp.data() + i * w.sp;
          softmax_grad_row_bf16(pr, dr, n, dot_row(pr, dr, n), w.pa.data() + i * w.sk);
        }
        tiles::gemm(m, g.d, n, w.pa.data(), w.sk, w.ka.data(), 2 * g.d, w.o.data(), g.d);
        store_rows16(w.o.data(), m, g.d, dq + i0 * ld, ld, nullptr, scale);  // dQ = scale · dS K
        w.add_transposed_times_pa(qb, ld, m, n, w.dkt.data());               // dKᵀ += Qᵀ dS
      }
      store_transposed(w.dvt.data(), w.sp, g.s, g.d, 1.0f, dv, ld);
      store_transposed(w.dkt.data(), w.sp, g.s, g.d, scale, dk, ld);
    }
    tiles::end();
  });
}

// Whether the bf16 Sdpa runs on kiln's tile kernels: a bf16 unit, head dims
// that are multiples of 32, and blocks of queries (a KV cache's one-token
// steps stay on oneMKL, which packs only what one row needs).
bool sdpa_tiles(const std::vector<Array>& in) {
  const SdpaDims g = sdpa_dims(in);
  return !tile_kernels().empty() && g.d % 32 == 0 && g.t >= 16;
}
#endif

void sdpa_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  check_sgemm_library();  // before the parallel region
  gemm_bf16_native();     // (its choice is made once, outside it)
  void* y = alloc_output(out);
  if (numel(out.shape) == 0) return;
  const SdpaAttrs& at = p.attrs<SdpaAttrs>();
  switch (in[0].dtype()) {
    case DType::f32: return sdpa_typed<float>(in, at, static_cast<float*>(y));
    case DType::f64: return sdpa_typed<double>(in, at, static_cast<double*>(y));
    case DType::bf16:
#if KILN_CPU_AVX512
      if (sdpa_tiles(in)) return sdpa_bf16_tiles(in, at, static_cast<bits*>(y));
#endif
      return sdpa_bf16(in, at, static_cast<bits*>(y));
    default:
      fail(p.name(), std::string("needs f32, f64 or bf16 inputs, got ") + name_of(in[0].dtype()));
  }
}

void sdpa_grad_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                      ArrayNode& out) {
  check_sgemm_library();
  gemm_bf16_native();
  void* y = alloc_output(out);
  if (numel(out.shape) == 0) return;
  const SdpaAttrs& at = p.attrs<SdpaAttrs>();
  switch (in[0].dtype()) {
    case DType::f32: return sdpa_grad_typed<float>(in, at, static_cast<float*>(y));
    case DType::f64: return sdpa_grad_typed<double>(in, at, static_cast<double*>(y));
    case DType::bf16:
#if KILN_CPU_AVX512
      if (sdpa_tiles(in)) return sdpa_grad_bf16_tiles(in, at, static_cast<bits*>(y));
#endif
      return sdpa_grad_bf16(in, at, static_cast<bits*>(y));
    default:
      fail(p.name(), std::string("needs f32, f64 or bf16 inputs, got ") + name_of(in[0].dtype()));
  }
}

}  // namespace

void register_attention(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Attention)] = attention_kernel;
  t.kernels[static_cast<int>(Op::AttentionGrad)] = attention_grad_kernel;
  t.kernels[static_cast<int>(Op::Sdpa)] = sdpa_kernel;
  t.kernels[static_cast<int>(Op::SdpaGrad)] = sdpa_grad_kernel;
}

}  // namespace kiln::cpu
