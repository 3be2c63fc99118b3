// kiln ops: the neural-network primitives' definitions — matmul, softmax,
// LayerNorm, softmax cross-entropy and attention — and of their backward
// primitives, which are not differentiated again.
#include <limits>
#include <numeric>
#include <optional>

#include "ops/defs/defs.h"

namespace kiln::defs {

Aval matmul_type(const Primitive& p, const MatmulAttrs& m, const Aval& a, const Aval& b) {
  expect_float(p, a);
  KILN_EXPECT(a.dtype == b.dtype, p, "operand dtypes differ: " + str(a) + " @ " + str(b));
  KILN_EXPECT(
      m.out == a.dtype || (a.dtype == DType::bf16 && m.out == DType::f32), p,
      std::string("output dtype ") + name_of(m.out) + " from " + name_of(a.dtype) + " operands");
  return {matmul_dims(a.shape, b.shape, m.transpose_a, m.transpose_b, p.name()).out, m.out};
}

namespace {

// C = op(A) op(B). The cotangents' matmuls keep the forward's precision
// (tf32 or not), whatever matmul_precision() says when the VJP runs; a
// rank-2 operand of a batched product gets its cotangent summed over the
// batch (folded into the rows where that is one GEMM).
void matmul_vjp(const VjpArgs& args, std::vector<Array>& ct) {
  const auto& m = args.p.attrs<MatmulAttrs>();
  const Array gc = astype(args.g, args.in[0].dtype());
  const Array &a = args.in[0], &b = args.in[1];
  const bool ta = m.transpose_a, tb = m.transpose_b;
  const MatmulPrecision prec = m.tf32 ? MatmulPrecision::tf32 : MatmulPrecision::fp32;
  auto mm = [&](const Array& x, const Array& y, bool tx, bool ty) {
    return matmul(x, y, {tx, ty, std::nullopt, prec});
  };
  auto fold = [](const Array& x) { return reshape(x, {-1, x.shape().back()}); };
  const bool a_bcast = a.ndim() == 2 && gc.ndim() > 2;
  const bool b_bcast = b.ndim() == 2 && gc.ndim() > 2;
  std::vector<int> batch_axes(gc.ndim() - 2);
  std::iota(batch_axes.begin(), batch_axes.end(), 0);
  if (args.want(0)) {
    const Array da = ta ? mm(b, gc, tb, true) : mm(gc, b, false, !tb);
    ct[0] = a_bcast ? sum(da, batch_axes) : da;
  }
  if (!args.want(1)) return;
  if (b_bcast && !ta) {
    const Array af = fold(a), gf = fold(gc);  // [B*M, K], [B*M, N]
    ct[1] = tb ? mm(gf, af, true, false) : mm(af, gf, true, false);
  } else if (b_bcast) {
    ct[1] = sum(tb ? mm(gc, a, true, true) : mm(a, gc, false, false), batch_axes);
  } else {
    ct[1] = tb ? mm(gc, a, true, ta) : mm(a, gc, !ta, false);
  }
}

// LayerNorm(x[, gamma, beta]): dx from LayerNormGrad, dgamma and dbeta from
// LayerNormParamGrad ([sum(g * x̂); sum(g)]).
void layer_norm_vjp(const VjpArgs& a, std::vector<Array>& ct) {
  const double eps = a.p.attrs<NormAttrs>().eps;
  const bool affine = a.in.size() == 3;
  if (a.want(0)) ct[0] = layer_norm_grad(a.in[0], affine ? a.in[1] : Array(), a.g, eps);
  if (!affine || !(a.want(1) || a.want(2))) return;
  const int64_t c = a.in[0].shape().back();
  const Array both = layer_norm_param_grad(a.in[0], a.g, eps);
  if (a.want(1)) ct[1] = reshape(slice(both, {0, 0}, {1, c}), {c});
  if (a.want(2)) ct[2] = reshape(slice(both, {1, 0}, {2, c}), {c});
}

// x [..., C] (rank >= 1), with gamma and beta [C] of x's dtype, or neither.
Aval layer_norm_type(const Primitive& p, const std::vector<Aval>& in) {
  KILN_EXPECT(in.size() == 1 || in.size() == 3, p,
              "takes x, or x, gamma and beta; got " + std::to_string(in.size()) + " operands");
  expect_float(p, in[0], "x");
  KILN_EXPECT(!in[0].shape.empty(), p, "x must have rank >= 1");
  const Aval c{{in[0].shape.back()}, in[0].dtype};
  for (size_t i = 1; i < in.size(); ++i)
    KILN_EXPECT(in[i] == c, p, "weight or bias is " + str(in[i]) + ", expected " + str(c));
  return in[0];
}

// x, [gamma,] dy, [residual]: dx of x's type; dy of x's shape (bf16 where
// fuse_casts had it read in place of its cast), the residual's x's type.
Aval layer_norm_grad_type(const Primitive& p, const std::vector<Aval>& in) {
  const size_t residual = p.attrs<NormAttrs>().residual;
  KILN_EXPECT(in.size() == 2 + residual || in.size() == 3 + residual, p,
              "takes x, [gamma,] dy" + std::string(residual ? ", residual" : "") + "; got " +
                  std::to_string(in.size()) + " operands");
  const Aval& x = in[0];
  const Aval& dy = in[in.size() - 1 - residual];
  expect_float(p, x, "x");
  KILN_EXPECT(
      !x.shape.empty() && dy.shape == x.shape && (dy.dtype == x.dtype || dy.dtype == DType::bf16),
      p, "dy is " + str(dy) + " for x " + str(x));
  if (in.size() == 3 + residual)
    KILN_EXPECT((in[1] == Aval{{x.shape.back()}, x.dtype}), p,
                "gamma is " + str(in[1]) + " for x " + str(x));
  if (residual)
    KILN_EXPECT(in.back() == x, p, "the residual is " + str(in.back()) + " for x " + str(x));
  return x;
}

// x, dy -> [2, C]: the sums for gamma's and beta's gradients.
Aval layer_norm_param_grad_type(const Primitive& p, const std::vector<Aval>& in) {
  const Aval &x = in[0], &dy = in[1];
  expect_float(p, x, "x");
  KILN_EXPECT(
      !x.shape.empty() && dy.shape == x.shape && (dy.dtype == x.dtype || dy.dtype == DType::bf16),
      p, "dy is " + str(dy) + " for x " + str(x));
  return {{2, x.shape.back()}, x.dtype};
}

// logits [..., C] and integer labels [...] -> a loss per row, f32 (f64 for
// f64 logits).
Shape rows_of(const Primitive& p, const Aval& logits, const Aval& labels) {
  expect_float(p, logits, "logits");
  expect_integer(p, labels, "labels");
  const Shape rows(logits.shape.begin(), logits.shape.end() - (logits.shape.empty() ? 0 : 1));
  KILN_EXPECT(!logits.shape.empty() && labels.shape == rows, p,
              "labels " + str(labels.shape) + " do not match logits " + str(logits.shape));
  return rows;
}

// qkv [B, T, 3, H, D] -> [B, T, H, D].
Shape attention_out(const Primitive& p, const Aval& qkv) {
  const Shape& s = qkv.shape;
  expect_float(p, qkv, "qkv");
  KILN_EXPECT(s.size() == 5 && s[2] == 3, p,
              "qkv must be [batch, tokens, 3, heads, head_dim], got " + str(s));
  return {s[0], s[1], s[3], s[4]};
}

// Sdpa's operands: q [B, T, H, D], k and v [B, S, H, D] of one float dtype,
// then (attrs.bias) an f32 (f64 for f64) bias [B|1, H|1, T|1, S|1]; `dout`
// (SdpaGrad): whether a [B, T, H, D] cotangent follows v, before the bias.
void expect_sdpa_operands(const Primitive& p, const std::vector<Aval>& in, bool dout) {
  const Aval &q = in[0], &k = in[1], &v = in[2];
  expect_float(p, q, "q");
  KILN_EXPECT(q.shape.size() == 4, p, "q must be [batch, tokens, heads, head_dim], got " + str(q));
  KILN_EXPECT(k.dtype == q.dtype && k.shape.size() == 4 && k.shape[0] == q.shape[0] &&
                  k.shape[2] == q.shape[2] && k.shape[3] == q.shape[3],
              p, "k " + str(k) + " does not fit q " + str(q));
  KILN_EXPECT(v == k, p, "v " + str(v) + " differs from k " + str(k));
  size_t next = 3;
  if (dout) {
    KILN_EXPECT(in[3] == q, p, "dout " + str(in[3]) + " does not fit q " + str(q));
    ++next;
  }
  if (p.attrs<SdpaAttrs>().bias) {
    const Aval& b = in[next];
    const Shape full{q.shape[0], q.shape[2], q.shape[1], k.shape[1]};
    const DType want = q.dtype == DType::f64 ? DType::f64 : DType::f32;
    KILN_EXPECT(
        b.dtype == want, p,
        "bias " + str(b) + " must be " + name_of(want) + " for " + name_of(q.dtype) + " operands");
    bool fits = b.shape.size() == 4;
    for (size_t i = 0; fits && i < 4; ++i) fits = b.shape[i] == 1 || b.shape[i] == full[i];
    KILN_EXPECT(fits, p, "bias " + str(b) + " does not broadcast to " + str(full));
  }
}

// ---- fallbacks: the fused primitives made of basic ones, in f32 for bf16
// (the kernels' accumulation type) ----

Array wide(const Array& x) {
  return x.dtype() == DType::bf16 ? astype(x, DType::f32) : x;
}

Array softmax_of(const Array& x, int ax) {
  const Array e = exp(x - max(x, {ax}, true));
  return e / sum(e, {ax}, true);
}

Array log_softmax_of(const Array& x, int ax) {
  const Array shifted = x - max(x, {ax}, true);
  return shifted - log(sum(exp(shifted), {ax}, true));
}

Array softmax_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const int ax = p.attrs<AxisAttrs>().axis;
  return p.op() == Op::Softmax ? softmax_of(wide(in[0]), ax) : log_softmax_of(wide(in[0]), ax);
}

// x̂ = (x - mean) * rstd over the last axis, rstd = 1 / sqrt(var + eps).
struct Normalized {
  Array xhat, rstd;
};
Normalized normalized(const Array& x, double eps) {
  const Array centred = x - mean(x, {-1}, true);
  const Array rstd = rsqrt(mean(centred * centred, {-1}, true) + eps);
  return {centred * rstd, rstd};
}

Array layer_norm_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const Array y = normalized(wide(in[0]), p.attrs<NormAttrs>().eps).xhat;
  return in.size() == 3 ? y * wide(in[1]) + wide(in[2]) : y;
}

// dx = rstd (g - mean(g) - x̂ mean(g x̂)), g = dy γ, plus the residual.
Array layer_norm_grad_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const auto& a = p.attrs<NormAttrs>();
  const size_t n = in.size(), residual = a.residual;
  const Array x = wide(in[0]), dy = wide(in[n - 1 - residual]);
  const Normalized xn = normalized(x, a.eps);
  const Array g = n == 3 + residual ? dy * wide(in[1]) : dy;
  const Array dx = xn.rstd * (g - mean(g, {-1}, true) - xn.xhat * mean(g * xn.xhat, {-1}, true));
  return residual ? dx + wide(in.back()) : dx;
}

// [sum(dy x̂); sum(dy)] over every row.
Array layer_norm_param_grad_fallback(const Primitive& p, const std::vector<Array>& in,
                                     const Aval&) {
  const Array x = wide(in[0]), dy = astype(in[1], x.dtype());
  const int64_t c = x.shape().back(), rows = c ? x.size() / c : 0;
  const Array xhat = normalized(x, p.attrs<NormAttrs>().eps).xhat;
  return concatenate(
      {sum(reshape(dy * xhat, {rows, c}), {0}, true), sum(reshape(dy, {rows, c}), {0}, true)}, 0);
}

// -log softmax(logits)[label], the label gathered with its range checked.
Array sce_fallback(const Primitive&, const std::vector<Array>& in, const Aval& out) {
  const Array logp = log_softmax_of(astype(in[0], out.dtype), -1);
  Shape column = in[1].shape();
  column.push_back(1);
  return neg(reshape(take_along_axis(logp, reshape(in[1], column), -1), in[1].shape()));
}

// (softmax(logits) - onehot(label)) * dloss.
Array sce_grad_fallback(const Primitive&, const std::vector<Array>& in, const Aval&) {
  const Array x = wide(in[0]);
  Shape column = in[2].shape();
  column.push_back(1);
  const Array hot = one_hot(in[1], x.shape().back(), x.dtype());
  return (softmax_of(x, -1) - hot) * reshape(astype(in[2], x.dtype()), column);
}

// Query, key or value (w = 0, 1, 2) of qkv [B, T, 3, H, D], as [B, H, T, D].
Array head_major(const Array& qkv, int64_t w) {
  const Shape& s = qkv.shape();
  const Array x = slice(qkv, {0, 0, w, 0, 0}, {s[0], s[1], w + 1, s[3], s[4]});
  return transpose(reshape(x, {s[0], s[1], s[3], s[4]}), {0, 2, 1, 3});
}

// softmax(q kᵀ · scale) over the keys, for q, k [B, H, T, D].
Array attention_probs(const Array& q, const Array& k, double scale) {
  return softmax_of(matmul(q, k, {.transpose_b = true}) * scale, -1);
}

Array attention_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const Array qkv = wide(in[0]);
  const Array probs =
      attention_probs(head_major(qkv, 0), head_major(qkv, 1), p.attrs<AttentionAttrs>().scale);
  return transpose(matmul(probs, head_major(qkv, 2)), {0, 2, 1, 3});  // [B, T, H, D]
}

// dv = Pᵀ dO, dP = dO vᵀ, dS = P (dP - rowsum(dP P)) · scale, dq = dS k,
// dk = dSᵀ q; packed as qkv.
Array attention_grad_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const double scale = p.attrs<AttentionAttrs>().scale;
  const Array qkv = wide(in[0]), dout = transpose(astype(in[1], qkv.dtype()), {0, 2, 1, 3});
  const Array q = head_major(qkv, 0), k = head_major(qkv, 1), v = head_major(qkv, 2);
  const Array probs = attention_probs(q, k, scale);
  const Array dp = matmul(dout, v, {.transpose_b = true});
  const Array ds = probs * (dp - sum(dp * probs, {-1}, true)) * scale;
  const Shape& s = qkv.shape();
  auto packed = [&](const Array& x) {  // [B, H, T, D] -> [B, T, 1, H, D]
    return reshape(transpose(x, {0, 2, 1, 3}), {s[0], s[1], 1, s[3], s[4]});
  };
  return concatenate({packed(matmul(ds, k)), packed(matmul(ds, q, {.transpose_a = true})),
                      packed(matmul(probs, dout, {.transpose_a = true}))},
                     2);
}

// Query, key or value [B, N, H, D] as [B, H, N, D].
Array heads_first(const Array& x) {
  return transpose(wide(x), {0, 2, 1, 3});
}

// Sdpa's probabilities [B, H, T, S]: softmax(scale · q kᵀ + bias) over the
// keys each query sees (0 for the others; a row that sees none is all 0).
Array sdpa_probs(const Primitive& p, const std::vector<Array>& in, size_t bias_at) {
  const SdpaAttrs& at = p.attrs<SdpaAttrs>();
  const Array q = heads_first(in[0]), k = heads_first(in[1]);
  const int64_t t = q.shape()[2], s = k.shape()[2];
  Array scores = matmul(q, k, {.transpose_b = true}) * at.scale;
  if (s == 0) return scores;  // [B, H, T, 0]: no key, no probability
  if (at.bias) scores = scores + astype(in[bias_at], scores.dtype());
  const Array minus_inf =
      full({}, -std::numeric_limits<double>::infinity(), scores.dtype(), scores.device());
  if (at.causal) {
    const Array i = reshape(arange(0, t, 1, DType::i64, scores.device()), {t, 1});
    const Array j = reshape(arange(0, s, 1, DType::i64, scores.device()), {1, s});
    scores =
        where(less_equal(j, i + scalar_like(i, static_cast<double>(s - t))), scores, minus_inf);
  }
  const Array m = max(scores, {-1}, true);
  const Array e = exp(scores - where(greater(m, minus_inf), m, zero_like_scalar(m)));
  const Array l = sum(e, {-1}, true);
  return e / where(greater(l, zero_like_scalar(l)), l, scalar_like(l, 1.0));
}

Array sdpa_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const Array probs = sdpa_probs(p, in, 3);
  return transpose(matmul(probs, heads_first(in[2])), {0, 2, 1, 3});  // [B, T, H, D]
}

// dS = P ⊙ (dP - rowsum(dP ⊙ P)) [B, H, T, S] (before the scale), dP = dO vᵀ.
Array sdpa_score_grad(const Array& probs, const Array& v, const Array& dout) {
  const Array dp = matmul(heads_first(dout), heads_first(v), {.transpose_b = true});
  return probs * (dp - sum(dp * probs, {-1}, true));
}

// dq = scale · dS k, dk = scale · dSᵀ q, dv = Pᵀ dO, stacked along the tokens.
Array sdpa_grad_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const double scale = p.attrs<SdpaAttrs>().scale;
  const Array probs = sdpa_probs(p, in, 4);
  const Array ds = sdpa_score_grad(probs, in[2], in[3]) * scale;
  const Array q = heads_first(in[0]), k = heads_first(in[1]), d_o = heads_first(in[3]);
  auto tokens_first = [](const Array& x) { return transpose(x, {0, 2, 1, 3}); };
  return concatenate(
      {tokens_first(matmul(ds, k)), tokens_first(matmul(ds, q, {.transpose_a = true})),
       tokens_first(matmul(probs, d_o, {.transpose_a = true}))},
      1);
}

void sdpa_vjp(const VjpArgs& a, std::vector<Array>& ct) {
  const SdpaAttrs& at = a.p.attrs<SdpaAttrs>();
  const Array &q = a.in[0], &k = a.in[1], &v = a.in[2];
  const Array dout = astype(a.g, q.dtype());
  if (a.want(0) || a.want(1) || a.want(2)) {
    const std::optional<Array> bias = at.bias ? std::optional<Array>(a.in[3]) : std::nullopt;
    const Array g = attention_grad(q, k, v, dout, bias, at.scale, at.causal);
    const Shape& s = g.shape();
    const int64_t t = q.shape()[1], n = k.shape()[1];
    auto rows = [&](int64_t from, int64_t to) {
      return slice(g, {0, from, 0, 0}, {s[0], to, s[2], s[3]});
    };
    if (a.want(0)) ct[0] = rows(0, t);
    if (a.want(1)) ct[1] = rows(t, t + n);
    if (a.want(2)) ct[2] = rows(t + n, t + 2 * n);
  }
  if (at.bias && a.want(3)) {
    // dbias = dS summed over the axes the bias broadcasts along: the T×S
    // scores are stored here, a price paid only where a bias is learned.
    const Array ds = sdpa_score_grad(sdpa_probs(a.p, a.in, 3), v, dout);
    std::vector<int> axes;
    for (int i = 0; i < 4; ++i)
      if (a.in[3].shape()[i] == 1 && ds.shape()[i] != 1) axes.push_back(i);
    ct[3] = astype(axes.empty() ? ds : sum(ds, axes, true), a.in[3].dtype());
  }
}

}  // namespace

void nn(OpDefs& d) {
  define(d, Op::Matmul,
         {.arity = 2,
          .infer =
              [](const Primitive& p, const std::vector<Aval>& in) {
                return matmul_type(p, p.attrs<MatmulAttrs>(), in[0], in[1]);
              },
          .vjp = matmul_vjp});
  auto softmax_type = [](const Primitive& p, const std::vector<Aval>& in) {
    expect_float(p, in[0]);
    expect_axis(p, p.attrs<AxisAttrs>().axis, in[0].shape.size());
    return in[0];
  };
  define(d, Op::Softmax,
         {.arity = 1,
          .infer = softmax_type,
          .vjp =
              [](const VjpArgs& a, std::vector<Array>& ct) {
                const int ax = a.p.attrs<AxisAttrs>().axis;
                ct[0] = a.out * (a.g - sum(a.g * a.out, {ax}, true));
              },
          .fallback = softmax_fallback});
  define(d, Op::LogSoftmax,
         {.arity = 1,
          .infer = softmax_type,
          .vjp =
              [](const VjpArgs& a, std::vector<Array>& ct) {
                const int ax = a.p.attrs<AxisAttrs>().axis;
                ct[0] = a.g - exp(a.out) * sum(a.g, {ax}, true);
              },
          .fallback = softmax_fallback});
  define(d, Op::LayerNorm,
         {.infer = layer_norm_type,
          .narrows_to_bf16 = true,
          .vjp = layer_norm_vjp,
          .fallback = layer_norm_fallback});
  define(d, Op::SoftmaxCrossEntropy,
         {.arity = 2,
          .infer = [](const Primitive& p, const std::vector<Aval>& in) -> Aval {
            return {rows_of(p, in[0], in[1]), in[0].dtype == DType::f64 ? DType::f64 : DType::f32};
          },
          .vjp =
              [](const VjpArgs& a, std::vector<Array>& ct) {
                if (a.want(0))
                  ct[0] = softmax_cross_entropy_grad(a.in[0], a.in[1], astype(a.g, a.out.dtype()));
              },
          .fallback = sce_fallback});
  define(d, Op::Attention,
         {.arity = 1,
          .infer = [](const Primitive& p, const std::vector<Aval>& in) -> Aval {
            return {attention_out(p, in[0]), in[0].dtype};
          },
          .vjp =
              [](const VjpArgs& a, std::vector<Array>& ct) {
                if (a.want(0))
                  ct[0] = attention_grad(a.in[0], a.g, a.p.attrs<AttentionAttrs>().scale);
              },
          .fallback = attention_fallback});
  define(d, Op::Sdpa,
         {.arity_of = [](const Primitive& p) { return p.attrs<SdpaAttrs>().bias ? 4 : 3; },
          .infer = [](const Primitive& p, const std::vector<Aval>& in) -> Aval {
            expect_sdpa_operands(p, in, false);
            return in[0];
          },
          .vjp = sdpa_vjp,
          .fallback = sdpa_fallback});
  // q, k, v, dout[, bias] -> [B, T + 2S, H, D]: dq, dk, dv.
  define(d, Op::SdpaGrad,
         {.arity_of = [](const Primitive& p) { return p.attrs<SdpaAttrs>().bias ? 5 : 4; },
          .infer = [](const Primitive& p, const std::vector<Aval>& in) -> Aval {
            expect_sdpa_operands(p, in, true);
            const Shape &q = in[0].shape, &k = in[1].shape;
            return {{q[0], q[1] + 2 * k[1], q[2], q[3]}, in[0].dtype};
          },
          .no_vjp = kNoSecondOrder,
          .fallback = sdpa_grad_fallback});
  // Backward-only: x, [gamma,] dy, [residual].
  define(d, Op::LayerNormGrad,
         {.infer = layer_norm_grad_type,
          .narrows_to_bf16 = true,
          .no_vjp = kNoSecondOrder,
          .fallback = layer_norm_grad_fallback});
  define(d, Op::LayerNormParamGrad,
         {.arity = 2,
          .infer = layer_norm_param_grad_type,
          .narrows_to_bf16 = true,
          .no_vjp = kNoSecondOrder,
          .fallback = layer_norm_param_grad_fallback});
  // logits, labels, dloss (a loss's type) -> dlogits (bf16 from f32 logits
  // where the compiler folds a cast into it).
  define(d, Op::SoftmaxCrossEntropyGrad,
         {.arity = 3,
          .infer = [](const Primitive& p, const std::vector<Aval>& in) -> Aval {
            const Shape rows = rows_of(p, in[0], in[1]);
            KILN_EXPECT(in[2].shape == rows, p, "dloss " + str(in[2]) + " for rows " + str(rows));
            return in[0];
          },
          .narrows_to_bf16 = true,
          .no_vjp = kNoSecondOrder,
          .fallback = sce_grad_fallback});
  // qkv, dout -> dqkv.
  define(d, Op::AttentionGrad,
         {.arity = 2,
          .infer = [](const Primitive& p, const std::vector<Aval>& in) -> Aval {
            const Aval want{attention_out(p, in[0]), in[0].dtype};
            KILN_EXPECT(in[1] == want, p, "dout is " + str(in[1]) + ", expected " + str(want));
            return in[0];
          },
          .no_vjp = kNoSecondOrder,
          .fallback = attention_grad_fallback});
}

}  // namespace kiln::defs
