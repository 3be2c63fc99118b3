// kiln cpu backend: fused multi-head softmax attention, forward and backward.
//
// qkv is [B, T, 3, H, D] (one linear layer's output): the query, key and value
// of head h for token t are rows of D values, 3·H·D apart from token to token.
// Each (batch, head) pair is one job; the jobs are split over the threads and
// each runs its GEMMs single-threaded on strided views of qkv, so the heads
// are never transposed into place. The T×T scores stay in a per-thread buffer
// (cache-resident at ViT's T = 197) and are never stored: the backward
// recomputes them, which costs one T×T×D GEMM per job and saves B·H·T² values
// of memory per layer.
#include "backend/cpu/avx512.h"  // first: see its note on GCC's warnings

#include <limits>

#include "backend/cpu/kernels.h"
#include "backend/cpu/sgemm.h"

namespace kiln::cpu {
namespace {

// C[m,n] = alpha · op(A)[m,k] · op(B)[k,n], row-major with leading dimensions
// (op(X) = Xᵀ when its flag is set; then X is stored [k,m] or [n,k]).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc, "attention");
}

// f64: the reference precision of the gradient checks.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * s;
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
      int64_t bi = job / g.h, hi = job % g.h;
      const int64_t base = bi * g.t * ld + hi * g.d;
      const T *q = qkv + base, *k = q + g.e(), *v = q + 2 * g.e();
      T *dq = dqkv + base, *dk = dq + g.e(), *dv = dq + 2 * g.e();
      const T* d_o = dout + bi * g.t * g.e() + hi * g.d;
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
            int64_t lda, const bits* b, int64_t ldb, float* c, int64_t ldc) {
  gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc, "attention");
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
      int64_t bi = job / g.h, hi = job % g.h;
      const int64_t base = bi * g.t * ld + hi * g.d;
      const bits *q = qkv + base, *k = q + g.e(), *v = q + 2 * g.e();
      bits *dq = dqkv + base, *dk = dq + g.e(), *dv = dq + 2 * g.e();
      const bits* d_o = dout + bi * g.t * g.e() + hi * g.d;
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
    case DType::bf16: return attention_bf16(in[0], at, static_cast<bits*>(y));
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
    case DType::bf16: return attention_grad_bf16(in[0], in[1], at, static_cast<bits*>(y));
    default:
      fail(p.name(), std::string("needs f32, f64 or bf16 inputs, got ") + name_of(in[0].dtype()));
  }
}

}  // namespace

void register_attention(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Attention)] = attention_kernel;
  t.kernels[static_cast<int>(Op::AttentionGrad)] = attention_grad_kernel;
}

}  // namespace kiln::cpu
