// kiln ops: the neural-network primitives' definitions — matmul, softmax,
// LayerNorm, softmax cross-entropy and attention — and of their backward
// primitives, which are not differentiated again.
#include <numeric>

#include "ops/defs/defs.h"

namespace kiln::defs {
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

}  // namespace

void nn(OpDefs& d) {
  define(d, Op::Matmul, {.arity = 2, .vjp = matmul_vjp});
  define(d, Op::Softmax, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                            const int ax = a.p.attrs<AxisAttrs>().axis;
                            ct[0] = a.out * (a.g - sum(a.g * a.out, {ax}, true));
                          }});
  define(d, Op::LogSoftmax, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                               const int ax = a.p.attrs<AxisAttrs>().axis;
                               ct[0] = a.g - exp(a.out) * sum(a.g, {ax}, true);
                             }});
  define(d, Op::LayerNorm, {.vjp = layer_norm_vjp});  // x, or x, gamma, beta
  define(d, Op::SoftmaxCrossEntropy,
         {.arity = 2, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            if (a.want(0))
              ct[0] = softmax_cross_entropy_grad(a.in[0], a.in[1], astype(a.g, a.out.dtype()));
          }});
  define(d, Op::Attention, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                              if (a.want(0))
                                ct[0] =
                                    attention_grad(a.in[0], a.g, a.p.attrs<AttentionAttrs>().scale);
                            }});
  // Backward-only: x, [gamma,] dy, [residual].
  define(d, Op::LayerNormGrad, {.no_vjp = kNoSecondOrder});
  define(d, Op::LayerNormParamGrad, {.arity = 2, .no_vjp = kNoSecondOrder});
  define(d, Op::SoftmaxCrossEntropyGrad, {.arity = 3, .no_vjp = kNoSecondOrder});
  define(d, Op::AttentionGrad, {.arity = 2, .no_vjp = kNoSecondOrder});
}

}  // namespace kiln::defs
