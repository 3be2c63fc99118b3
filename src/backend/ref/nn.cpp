// kiln ref backend: the fused neural-network primitives in f64 — Softmax and
// LogSoftmax along an axis, LayerNorm, LayerNormGrad (with its residual
// input), LayerNormParamGrad, SoftmaxCrossEntropy and its gradient, and
// multi-head Attention and AttentionGrad over packed qkv [B, T, 3, H, D], and
// Sdpa and SdpaGrad over separate q, k, v with causal and bias masks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/ref/ref_common.h"

namespace kiln::ref {
namespace {

void require_float(const Primitive& p, DType dt) {
  if (!is_floating(dt) || dt == DType::f16)
    fail(p.name(), std::string("no ref kernel for dtype ") + name_of(dt));
}

// The largest of n values `stride` apart (-inf for none; a NaN is skipped,
// as by the cpu backend's comparison).
double row_max(const double* x, int64_t n, int64_t stride) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k < n; ++k)
    if (x[k * stride] > m) m = x[k * stride];
  return m;
}

// x viewed as [outer, n, inner]; each of the outer * inner rows (stride
// inner) is normalized.
void softmax_kernel(const KernelContext&, const Primitive& p,
                    const std::vector<Array>& in, ArrayNode& out) {
  require_float(p, in[0].dtype());
  const int ax = p.attrs<AxisAttrs>().axis;
  const Shape& s = in[0].shape();
  int64_t outer = 1, inner = 1;
  const int64_t n = s[ax];
  for (int d = 0; d < ax; ++d) outer *= s[d];
  for (size_t d = ax + 1; d < s.size(); ++d) inner *= s[d];
  const bool log = p.op() == Op::LogSoftmax;
  const std::vector<double> x = load(in[0]);
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t base = o * n * inner + i;
      const double m = row_max(&x[base], n, inner);
      double total = 0;
      for (int64_t k = 0; k < n; ++k) total += std::exp(x[base + k * inner] - m);
      for (int64_t k = 0; k < n; ++k) {
        const double v = x[base + k * inner] - m;
        y[base + k * inner] = log ? v - std::log(total) : std::exp(v) / total;
      }
    }
  store(out, y);
}

// Mean and 1/sqrt(var + eps) of c values (biased variance).
void row_stats(const double* x, int64_t c, double eps, double& mean, double& rstd) {
  double s = 0;
  for (int64_t k = 0; k < c; ++k) s += x[k];
  mean = s / static_cast<double>(c);
  double v = 0;
  for (int64_t k = 0; k < c; ++k) v += (x[k] - mean) * (x[k] - mean);
  rstd = 1.0 / std::sqrt(v / static_cast<double>(c) + eps);
}

// y = (x - mean) * rstd [* gamma + beta] over the last axis; inputs x or
// x, gamma, beta.
void layer_norm_kernel(const KernelContext&, const Primitive& p,
                       const std::vector<Array>& in, ArrayNode& out) {
  require_float(p, in[0].dtype());
  const double eps = p.attrs<NormAttrs>().eps;
  const bool affine = in.size() == 3;
  const int64_t c = in[0].shape().back(), rows = c ? in[0].size() / c : 0;
  const std::vector<double> x = load(in[0]);
  const std::vector<double> g = affine ? load(in[1]) : std::vector<double>();
  const std::vector<double> b = affine ? load(in[2]) : std::vector<double>();
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean, rstd;
    row_stats(&x[r * c], c, eps, mean, rstd);
    for (int64_t k = 0; k < c; ++k) {
      const double xh = (x[r * c + k] - mean) * rstd;
      y[r * c + k] = affine ? xh * g[k] + b[k] : xh;
    }
  }
  store(out, y);
}

// Inputs x, [gamma,] dy[, r]: with dŷ = dy * gamma and x̂ the normalized x,
// dx = rstd * (dŷ - mean(dŷ) - x̂ * mean(dŷ * x̂)), plus r with
// NormAttrs::residual (dx rounded to the dtype first, as the unfused
// LayerNormGrad stores it before the Add).
void layer_norm_grad_kernel(const KernelContext&, const Primitive& p,
                            const std::vector<Array>& in, ArrayNode& out) {
  require_float(p, in[0].dtype());
  const auto& attrs = p.attrs<NormAttrs>();
  const size_t n_in = in.size() - (attrs.residual ? 1 : 0);
  const bool affine = n_in == 3;
  const int64_t c = in[0].shape().back(), rows = c ? in[0].size() / c : 0;
  const std::vector<double> x = load(in[0]), dy = load(in[n_in - 1]);
  const std::vector<double> g = affine ? load(in[1]) : std::vector<double>();
  const std::vector<double> res = attrs.residual ? load(in.back()) : std::vector<double>();
  std::vector<double> dx(x.size()), dyh(c);
  for (int64_t r = 0; r < rows; ++r) {
    double mean, rstd;
    row_stats(&x[r * c], c, attrs.eps, mean, rstd);
    double s1 = 0, s2 = 0;
    for (int64_t k = 0; k < c; ++k) {
      dyh[k] = affine ? dy[r * c + k] * g[k] : dy[r * c + k];
      s1 += dyh[k];
      s2 += dyh[k] * (x[r * c + k] - mean) * rstd;
    }
    s1 /= static_cast<double>(c);
    s2 /= static_cast<double>(c);
    for (int64_t k = 0; k < c; ++k) {
      const double xh = (x[r * c + k] - mean) * rstd;
      dx[r * c + k] = rstd * (dyh[k] - s1 - xh * s2);
    }
  }
  if (attrs.residual) {
    round_to(dx, out.dtype);
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = res[i] + dx[i];
  }
  store(out, dx);
}

// [2, C]: the sums over rows of dy * x̂ (gamma's gradient) and of dy (beta's).
void layer_norm_param_grad_kernel(const KernelContext&, const Primitive& p,
                                  const std::vector<Array>& in, ArrayNode& out) {
  require_float(p, in[0].dtype());
  const double eps = p.attrs<NormAttrs>().eps;
  const int64_t c = in[0].shape().back(), rows = c ? in[0].size() / c : 0;
  const std::vector<double> x = load(in[0]), dy = load(in[1]);
  std::vector<double> y(2 * c, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mean, rstd;
    row_stats(&x[r * c], c, eps, mean, rstd);
    for (int64_t k = 0; k < c; ++k) {
      y[k] += dy[r * c + k] * (x[r * c + k] - mean) * rstd;
      y[c + k] += dy[r * c + k];
    }
  }
  store(out, y);
}

// loss[r] = logsumexp(logits[r]) - logits[r, label[r]] (f64 for f64 logits,
// else f32: the output's dtype).
void sce_kernel(const KernelContext&, const Primitive& p,
                const std::vector<Array>& in, ArrayNode& out) {
  require_float(p, in[0].dtype());
  const int64_t c = in[0].shape().back(), rows = c ? in[0].size() / c : 0;
  const std::vector<int64_t> labels =
      read_indices(in[1], c, false, "softmax_cross_entropy", "label");
  const std::vector<double> x = load(in[0]);
  std::vector<double> loss(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const double m = row_max(&x[r * c], c, 1);
    double total = 0;
    for (int64_t k = 0; k < c; ++k) total += std::exp(x[r * c + k] - m);
    loss[r] = m + std::log(total) - x[r * c + labels[r]];
  }
  store(out, loss);
}

// Inputs logits, labels, dloss: dlogits[r] = (softmax(logits[r]) -
// onehot(label[r])) * dloss[r].
void sce_grad_kernel(const KernelContext&, const Primitive& p,
                     const std::vector<Array>& in, ArrayNode& out) {
  require_float(p, in[0].dtype());
  const int64_t c = in[0].shape().back(), rows = c ? in[0].size() / c : 0;
  const std::vector<int64_t> labels =
      read_indices(in[1], c, false, "softmax_cross_entropy", "label");
  const std::vector<double> x = load(in[0]), dloss = load(in[2]);
  std::vector<double> dx(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double m = row_max(&x[r * c], c, 1);
    double total = 0;
    for (int64_t k = 0; k < c; ++k) total += std::exp(x[r * c + k] - m);
    for (int64_t k = 0; k < c; ++k) dx[r * c + k] = std::exp(x[r * c + k] - m) / total * dloss[r];
    dx[r * c + labels[r]] -= dloss[r];
  }
  if (in[0].dtype() == DType::f32) round_to(dx, DType::f32);  // bf16 from f32: as its cast
  store(out, dx);
}

// qkv [B, T, 3, H, D]: element (b, t, w, h, d), w = 0 query, 1 key, 2 value.
struct Qkv {
  int64_t B, T, H, D;
  explicit Qkv(const Shape& s) : B(s[0]), T(s[1]), H(s[3]), D(s[4]) {}
  int64_t at(int64_t b, int64_t t, int64_t w, int64_t h, int64_t d) const {
    return (((b * T + t) * 3 + w) * H + h) * D + d;
  }
  // Of the output [B, T, H, D].
  int64_t out(int64_t b, int64_t t, int64_t h, int64_t d) const {
    return ((b * T + t) * H + h) * D + d;
  }
};

void require_attention_dtype(const Primitive& p, DType dt) {
  if (dt != DType::f32 && dt != DType::f64 && dt != DType::bf16)
    fail(p.name(), std::string("needs f32, f64 or bf16 inputs, got ") + name_of(dt));
}

// P [T, T] = softmax over each row of scale · Q Kᵀ, for batch b and head h.
std::vector<double> probabilities(const std::vector<double>& qkv, const Qkv& g, int64_t b,
                                  int64_t h, double scale) {
  std::vector<double> P(g.T * g.T);
  for (int64_t i = 0; i < g.T; ++i) {
    double* row = &P[i * g.T];
    for (int64_t j = 0; j < g.T; ++j) {
      double s = 0;
      for (int64_t d = 0; d < g.D; ++d) s += qkv[g.at(b, i, 0, h, d)] * qkv[g.at(b, j, 1, h, d)];
      row[j] = scale * s;
    }
    const double m = row_max(row, g.T, 1);
    double total = 0;
    for (int64_t j = 0; j < g.T; ++j) total += (row[j] = std::exp(row[j] - m));
    for (int64_t j = 0; j < g.T; ++j) row[j] /= total;
  }
  return P;
}

// out [B, T, H, D]: O = P V per batch and head.
void attention_kernel(const KernelContext&, const Primitive& p,
                      const std::vector<Array>& in, ArrayNode& out) {
  require_attention_dtype(p, in[0].dtype());
  const double scale = p.attrs<AttentionAttrs>().scale;
  const Qkv g(in[0].shape());
  const std::vector<double> qkv = load(in[0]);
  std::vector<double> y(numel(out.shape), 0.0);
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.H; ++h) {
      const std::vector<double> P = probabilities(qkv, g, b, h, scale);
      for (int64_t i = 0; i < g.T; ++i)
        for (int64_t d = 0; d < g.D; ++d) {
          double s = 0;
          for (int64_t j = 0; j < g.T; ++j) s += P[i * g.T + j] * qkv[g.at(b, j, 2, h, d)];
          y[g.out(b, i, h, d)] = s;
        }
    }
  store(out, y);
}

// Inputs qkv, dout [B, T, H, D]; the output is dqkv [B, T, 3, H, D]. With
// S = scale · Q Kᵀ, P = softmax(S), O = P V:
//   dV = Pᵀ dO, dP = dO Vᵀ, dS = P ⊙ (dP - rowsum(dP ⊙ P)),
//   dQ = scale · dS K, dK = scale · dSᵀ Q.
void attention_grad_kernel(const KernelContext&, const Primitive& p,
                           const std::vector<Array>& in, ArrayNode& out) {
  require_attention_dtype(p, in[0].dtype());
  const double scale = p.attrs<AttentionAttrs>().scale;
  const Qkv g(in[0].shape());
  const std::vector<double> qkv = load(in[0]), dout = load(in[1]);
  std::vector<double> dqkv(numel(out.shape), 0.0);
  const int64_t T = g.T;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.H; ++h) {
      const std::vector<double> P = probabilities(qkv, g, b, h, scale);
      std::vector<double> dS(T * T);
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < T; ++j) {
          double s = 0;  // dP[i, j]
          for (int64_t d = 0; d < g.D; ++d) s += dout[g.out(b, i, h, d)] * qkv[g.at(b, j, 2, h, d)];
          dS[i * T + j] = s;
        }
        double dot = 0;
        for (int64_t j = 0; j < T; ++j) dot += P[i * T + j] * dS[i * T + j];
        for (int64_t j = 0; j < T; ++j) dS[i * T + j] = P[i * T + j] * (dS[i * T + j] - dot);
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < g.D; ++d) {
          double dq = 0, dk = 0, dv = 0;
          for (int64_t j = 0; j < T; ++j) {
            dq += dS[t * T + j] * qkv[g.at(b, j, 1, h, d)];
            dk += dS[j * T + t] * qkv[g.at(b, j, 0, h, d)];
            dv += P[j * T + t] * dout[g.out(b, j, h, d)];
          }
          dqkv[g.at(b, t, 0, h, d)] = scale * dq;
          dqkv[g.at(b, t, 1, h, d)] = scale * dk;
          dqkv[g.at(b, t, 2, h, d)] = dv;
        }
    }
  store(out, dqkv);
}

// Sdpa's operands: q [B, T, H, D], k and v [B, S, H, D], an optional bias
// [B|1, H|1, T|1, S|1].
struct SdpaGeometry {
  int64_t B, T, S, H, D;
  Shape bias;  // empty: none
  SdpaGeometry(const std::vector<Array>& in, size_t bias_at)
      : B(in[0].shape()[0]),
        T(in[0].shape()[1]),
        S(in[1].shape()[1]),
        H(in[0].shape()[2]),
        D(in[0].shape()[3]) {
    if (in.size() > bias_at) bias = in[bias_at].shape();
  }
  int64_t q(int64_t b, int64_t t, int64_t h, int64_t d) const {
    return ((b * T + t) * H + h) * D + d;
  }
  int64_t k(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return ((b * S + s) * H + h) * D + d;
  }
  int64_t bias_at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return (((bias[0] > 1 ? b : 0) * bias[1] + (bias[1] > 1 ? h : 0)) * bias[2] +
            (bias[2] > 1 ? i : 0)) *
               bias[3] +
           (bias[3] > 1 ? j : 0);
  }
};

// P [T, S] for batch b and head h: softmax over the keys each query sees
// (causal: j <= i + S - T) of scale · Q Kᵀ + bias; 0 elsewhere, a row that
// sees no key (every score -inf) all 0, and one with a NaN score all NaN.
std::vector<double> sdpa_probabilities(const SdpaGeometry& g, const SdpaAttrs& a,
                                       const std::vector<double>& q, const std::vector<double>& k,
                                       const std::vector<double>& bias, int64_t b, int64_t h) {
  const double minus_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> P(g.T * g.S, 0.0);
  for (int64_t i = 0; i < g.T; ++i) {
    double* row = &P[i * g.S];
    for (int64_t j = 0; j < g.S; ++j) {
      if (a.causal && j > i + g.S - g.T) {
        row[j] = minus_inf;
        continue;
      }
      double s = 0;
      for (int64_t d = 0; d < g.D; ++d) s += q[g.q(b, i, h, d)] * k[g.k(b, j, h, d)];
      row[j] = a.scale * s + (bias.empty() ? 0.0 : bias[g.bias_at(b, h, i, j)]);
    }
    // Shifted by the max, or by 0 where no score is finite: exp(-inf) = 0,
    // and a NaN score makes the row NaN.
    const double m = row_max(row, g.S, 1), shift = m == minus_inf ? 0.0 : m;
    double total = 0;
    for (int64_t j = 0; j < g.S; ++j) total += (row[j] = std::exp(row[j] - shift));
    if (total == 0) continue;  // every score -inf: zeros
    for (int64_t j = 0; j < g.S; ++j) row[j] /= total;
  }
  return P;
}

// q, k, v[, bias] -> out [B, T, H, D] = P V per batch and head.
void sdpa_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  require_attention_dtype(p, in[0].dtype());
  const SdpaAttrs& a = p.attrs<SdpaAttrs>();
  const SdpaGeometry g(in, 3);
  const std::vector<double> q = load(in[0]), k = load(in[1]), v = load(in[2]);
  const std::vector<double> bias = in.size() > 3 ? load(in[3]) : std::vector<double>{};
  std::vector<double> y(numel(out.shape), 0.0);
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.H; ++h) {
      const std::vector<double> P = sdpa_probabilities(g, a, q, k, bias, b, h);
      for (int64_t i = 0; i < g.T; ++i)
        for (int64_t d = 0; d < g.D; ++d) {
          double s = 0;
          for (int64_t j = 0; j < g.S; ++j) s += P[i * g.S + j] * v[g.k(b, j, h, d)];
          y[g.q(b, i, h, d)] = s;
        }
    }
  store(out, y);
}

// q, k, v, dout[, bias] -> [B, T + 2S, H, D]: dq, dk, dv along the tokens
// (as AttentionGrad, over the probabilities of sdpa_probabilities).
void sdpa_grad_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                      ArrayNode& out) {
  require_attention_dtype(p, in[0].dtype());
  const SdpaAttrs& a = p.attrs<SdpaAttrs>();
  const SdpaGeometry g(in, 4);
  const std::vector<double> q = load(in[0]), k = load(in[1]), v = load(in[2]), dout = load(in[3]);
  const std::vector<double> bias = in.size() > 4 ? load(in[4]) : std::vector<double>{};
  std::vector<double> grads(numel(out.shape), 0.0);
  const int64_t T = g.T, S = g.S, N = T + 2 * S;
  auto at = [&](int64_t b, int64_t row, int64_t h, int64_t d) {
    return ((b * N + row) * g.H + h) * g.D + d;
  };
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.H; ++h) {
      const std::vector<double> P = sdpa_probabilities(g, a, q, k, bias, b, h);
      std::vector<double> dS(T * S);
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < S; ++j) {
          double s = 0;  // dP[i, j]
          for (int64_t d = 0; d < g.D; ++d) s += dout[g.q(b, i, h, d)] * v[g.k(b, j, h, d)];
          dS[i * S + j] = s;
        }
        double dot = 0;
        for (int64_t j = 0; j < S; ++j) dot += P[i * S + j] * dS[i * S + j];
        for (int64_t j = 0; j < S; ++j) dS[i * S + j] = P[i * S + j] * (dS[i * S + j] - dot);
      }
      for (int64_t d = 0; d < g.D; ++d) {
        for (int64_t i = 0; i < T; ++i) {
          double dq = 0;
          for (int64_t j = 0; j < S; ++j) dq += dS[i * S + j] * k[g.k(b, j, h, d)];
          grads[at(b, i, h, d)] = a.scale * dq;
        }
        for (int64_t j = 0; j < S; ++j) {
          double dk = 0, dv = 0;
          for (int64_t i = 0; i < T; ++i) {
            dk += dS[i * S + j] * q[g.q(b, i, h, d)];
            dv += P[i * S + j] * dout[g.q(b, i, h, d)];
          }
          grads[at(b, T + j, h, d)] = a.scale * dk;
          grads[at(b, T + S + j, h, d)] = dv;
        }
      }
    }
  store(out, grads);
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
  t.kernels[static_cast<int>(Op::Attention)] = attention_kernel;
  t.kernels[static_cast<int>(Op::AttentionGrad)] = attention_grad_kernel;
  t.kernels[static_cast<int>(Op::Sdpa)] = sdpa_kernel;
  t.kernels[static_cast<int>(Op::SdpaGrad)] = sdpa_grad_kernel;
}

}  // namespace kiln::ref
