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

// Row-wise softmax of s [t, t] in place.
template <typename T>
void softmax_rows(T* s, int64_t t) {
  for (int64_t i = 0; i < t; ++i) {
    T* r = s + i * t;
    T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < t; ++j) m = r[j] > m ? r[j] : m;
    T total = 0;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < t; ++j) {
      r[j] = fast_exp(r[j] - m);
      total += r[j];
    }
    T inv = T(1) / total;
#pragma omp simd
    for (int64_t j = 0; j < t; ++j) r[j] *= inv;
  }
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
      for (int64_t i = 0; i < g.t; ++i) {
        const T* pr = p.data() + i * g.t;
        T* dr = dp.data() + i * g.t;
        T dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < g.t; ++j) dot += pr[j] * dr[j];
#pragma omp simd
        for (int64_t j = 0; j < g.t; ++j) dr[j] = pr[j] * (dr[j] - dot);
      }
      gemm(false, false, g.t, g.d, g.t, scale, dp.data(), g.t, k, ld, dq, ld);
      gemm(true, false, g.t, g.d, g.t, scale, dp.data(), g.t, q, ld, dk, ld);
    }
  });
}

template <typename F>
void dispatch_f32_f64(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    default: fail(op, std::string("needs f32 or f64 inputs, got ") + name_of(dt));
  }
}

void attention_kernel(const KernelContext&, const Primitive& p,
                      const std::vector<Array>& in, ArrayNode& out) {
  check_sgemm_library();  // before the parallel region
  dispatch_f32_f64(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    T* y = static_cast<T*>(alloc_output(out));
    if (numel(out.shape) == 0) return;
    attention_typed<T>(in[0], p.attrs<AttentionAttrs>(), y);
  });
}

void attention_grad_kernel(const KernelContext&, const Primitive& p,
                           const std::vector<Array>& in, ArrayNode& out) {
  check_sgemm_library();  // before the parallel region
  dispatch_f32_f64(in[0].dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    T* y = static_cast<T*>(alloc_output(out));
    if (numel(out.shape) == 0) return;
    attention_grad_typed<T>(in[0], in[1], p.attrs<AttentionAttrs>(), y);
  });
}

}  // namespace

void register_attention(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Attention)] = attention_kernel;
  t.kernels[static_cast<int>(Op::AttentionGrad)] = attention_grad_kernel;
}

}  // namespace kiln::cpu
