// kiln ops: VJP rules. Each emits ordinary primitives, so a backward pass is a
// graph like any other.
#include "ops/vjp.h"

#include <cmath>
#include <numeric>

#include "kiln/ops.h"

namespace kiln {
namespace {

[[noreturn]] void no_second_order(const Primitive& p) {
  fail("vjp", std::string(p.name()) +
                  " is the backward of another primitive; differentiating it (a second "
                  "derivative) is not supported");
}

Array zero_like_scalar(const Array& g) {
  return scalar_like(g, 0.0);
}

// Cotangent of a reduced array broadcast back to the input's shape.
Array unreduce(const Array& g, const Shape& in, const ReduceAttrs& r) {
  Shape kept = in;
  for (int ax : r.axes) kept[ax] = 1;
  return broadcast_to(reshape(g, kept), in);
}

}  // namespace

std::vector<Array> vjp_rule(const Primitive& p, const std::vector<Array>& in, const Array& out,
                            const Array& g, const std::vector<bool>& need) {
  std::vector<Array> ct(in.size());
  auto want = [&](size_t i) { return i < need.size() && need[i]; };
  switch (p.op()) {
    // ---- unary ----
    case Op::Neg: ct[0] = neg(g); break;
    case Op::Exp: ct[0] = g * out; break;
    case Op::Log: ct[0] = g / in[0]; break;
    case Op::Sqrt: ct[0] = g / (out * 2.0); break;
    case Op::Rsqrt: ct[0] = g * (out * out * out) * -0.5; break;
    case Op::Tanh: ct[0] = g * (1.0 - out * out); break;
    case Op::Erf: ct[0] = g * exp(-(in[0] * in[0])) * (2.0 / std::sqrt(M_PI)); break;
    case Op::Gelu: ct[0] = g * gelu_grad(in[0]); break;
    case Op::GeluTanh: ct[0] = g * gelu_tanh_grad(in[0]); break;
    case Op::Relu:
      ct[0] = where(greater(in[0], zero_like_scalar(in[0])), g, zero_like_scalar(g));
      break;
    case Op::Abs: ct[0] = where(greater_equal(in[0], zero_like_scalar(in[0])), g, neg(g)); break;
    case Op::GeluGrad:
    case Op::GeluTanhGrad: no_second_order(p);

    // ---- binary: compute at the broadcast shape, then sum back ----
    case Op::Add:
      if (want(0)) ct[0] = sum_to(g, in[0].shape());
      if (want(1)) ct[1] = sum_to(g, in[1].shape());
      break;
    case Op::Sub:
      if (want(0)) ct[0] = sum_to(g, in[0].shape());
      if (want(1)) ct[1] = sum_to(neg(g), in[1].shape());
      break;
    case Op::Mul:
      if (want(0)) ct[0] = sum_to(g * in[1], in[0].shape());
      if (want(1)) ct[1] = sum_to(g * in[0], in[1].shape());
      break;
    case Op::Div:
      if (want(0)) ct[0] = sum_to(g / in[1], in[0].shape());
      if (want(1)) ct[1] = sum_to(neg(g * out) / in[1], in[1].shape());
      break;
    case Op::Maximum:
    case Op::Minimum: {
      // Ties share the cotangent equally, as in JAX.
      Array first = p.op() == Op::Maximum ? greater(in[0], in[1]) : less(in[0], in[1]);
      Array tie = equal(in[0], in[1]);
      Array half = g * 0.5, zero = zero_like_scalar(g);
      if (want(0)) ct[0] = sum_to(where(first, g, where(tie, half, zero)), in[0].shape());
      if (want(1)) ct[1] = sum_to(where(first, zero, where(tie, half, g)), in[1].shape());
      break;
    }
    case Op::Equal:
    case Op::NotEqual:
    case Op::Less:
    case Op::LessEqual:
    case Op::Greater:
    case Op::GreaterEqual: break;
    case Op::Where: {
      Array zero = zero_like_scalar(g);
      if (want(1)) ct[1] = sum_to(where(in[0], g, zero), in[1].shape());
      if (want(2)) ct[2] = sum_to(where(in[0], zero, g), in[2].shape());
      break;
    }
    case Op::Cast:
      if (is_floating(in[0].dtype())) ct[0] = astype(g, in[0].dtype());
      break;
    case Op::StopGradient: break;

    // ---- reductions ----
    case Op::Sum: ct[0] = unreduce(g, in[0].shape(), p.attrs<ReduceAttrs>()); break;
    case Op::Max: {
      const auto& r = p.attrs<ReduceAttrs>();
      Shape kept = in[0].shape();
      for (int ax : r.axes) kept[ax] = 1;
      Array mask = astype(equal(in[0], reshape(out, kept)), g.dtype());
      Array count = sum(mask, r.axes, true);
      ct[0] = reshape(g, kept) * mask / count;
      break;
    }
    case Op::Argmax: break;

    // ---- matmul: C = op(A) op(B) ----
    case Op::Matmul: {
      const auto& m = p.attrs<MatmulAttrs>();
      Array gc = astype(g, in[0].dtype());
      const Array &a = in[0], &b = in[1];
      bool ta = m.transpose_a, tb = m.transpose_b;
      // The cotangents' matmuls keep the forward's precision (tf32 or not),
      // whatever matmul_precision() says when the VJP runs.
      const MatmulPrecision prec = m.tf32 ? MatmulPrecision::tf32 : MatmulPrecision::fp32;
      auto mm = [&](const Array& x, const Array& y, bool tx, bool ty) {
        return matmul(x, y, {tx, ty, std::nullopt, prec});
      };
      // Batched cotangent of a rank-2 operand: fold the batch into the rows.
      auto fold = [](const Array& x) { return reshape(x, {-1, x.shape().back()}); };
      bool a_bcast = a.ndim() == 2 && gc.ndim() > 2;
      bool b_bcast = b.ndim() == 2 && gc.ndim() > 2;
      std::vector<int> batch_axes(gc.ndim() - 2);
      std::iota(batch_axes.begin(), batch_axes.end(), 0);
      if (want(0)) {
        Array da = ta ? mm(b, gc, tb, true) : mm(gc, b, false, !tb);
        ct[0] = a_bcast ? sum(da, batch_axes) : da;
      }
      if (want(1)) {
        if (b_bcast && !ta) {
          Array af = fold(a), gf = fold(gc);  // [B*M, K], [B*M, N]
          ct[1] = tb ? mm(gf, af, true, false) : mm(af, gf, true, false);
        } else if (b_bcast) {
          ct[1] = sum(tb ? mm(gc, a, true, true) : mm(a, gc, false, false), batch_axes);
        } else {
          ct[1] = tb ? mm(gc, a, true, ta) : mm(a, gc, !ta, false);
        }
      }
      break;
    }

    // ---- layout ----
    case Op::Reshape: ct[0] = reshape(g, in[0].shape()); break;
    case Op::Transpose: {
      const auto& perm = p.attrs<PermAttrs>().perm;
      std::vector<int> inv(perm.size());
      for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int>(i);
      ct[0] = transpose(g, inv);
      break;
    }
    case Op::BroadcastTo: ct[0] = sum_to(g, in[0].shape()); break;
    case Op::Concatenate: {
      int ax = p.attrs<AxisAttrs>().axis;
      int64_t offset = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        int64_t d = in[i].shape()[ax];
        if (want(i)) {
          Shape start(g.ndim(), 0), stop = g.shape();
          start[ax] = offset;
          stop[ax] = offset + d;
          ct[i] = slice(g, start, stop);
        }
        offset += d;
      }
      break;
    }
    case Op::Slice: ct[0] = slice_grad(g, p.attrs<SliceAttrs>()); break;
    case Op::SliceGrad: {
      const auto& s = p.attrs<SliceAttrs>();
      ct[0] = slice(g, s.start, s.stop, s.step);
      break;
    }
    case Op::Take:
      if (want(0)) ct[0] = scatter_add(in[1], g, p.attrs<AxisAttrs>().axis, in[0].shape());
      break;
    case Op::ScatterAdd:
      if (want(1)) ct[1] = take(g, in[0], p.attrs<ScatterAttrs>().axis);
      break;
    case Op::OneHot: break;

    // ---- fused ----
    case Op::Softmax: {
      int ax = p.attrs<AxisAttrs>().axis;
      ct[0] = out * (g - sum(g * out, {ax}, true));
      break;
    }
    case Op::LogSoftmax: {
      int ax = p.attrs<AxisAttrs>().axis;
      ct[0] = g - exp(out) * sum(g, {ax}, true);
      break;
    }
    case Op::LayerNorm: {
      double eps = p.attrs<NormAttrs>().eps;
      bool affine = in.size() == 3;
      if (want(0)) ct[0] = layer_norm_grad(in[0], affine ? in[1] : Array(), g, eps);
      if (affine && (want(1) || want(2))) {
        int64_t c = in[0].shape().back();
        Array both = layer_norm_param_grad(in[0], g, eps);  // [sum(g * x̂); sum(g)]
        if (want(1)) ct[1] = reshape(slice(both, {0, 0}, {1, c}), {c});
        if (want(2)) ct[2] = reshape(slice(both, {1, 0}, {2, c}), {c});
      }
      break;
    }
    case Op::SoftmaxCrossEntropy:
      if (want(0)) ct[0] = softmax_cross_entropy_grad(in[0], in[1], astype(g, out.dtype()));
      break;
    case Op::Attention:
      if (want(0)) ct[0] = attention_grad(in[0], g, p.attrs<AttentionAttrs>().scale);
      break;
    case Op::LayerNormGrad:
    case Op::LayerNormParamGrad:
    case Op::AttentionGrad:
    case Op::SoftmaxCrossEntropyGrad: no_second_order(p);
    case Op::FusedElementwise:
    case Op::MatmulEpilogue:
    case Op::FusedReduce:
      fail("vjp",
           std::string(p.name()) + " exists only inside compiled graphs, after differentiation");
    case Op::Random:
    case Op::Fill: break;
    case Op::AllReduceStart:
    case Op::AllReduceWait:
      fail("vjp", std::string(p.name()) +
                      ": collectives average gradients after differentiation and have no "
                      "gradient of their own");
    case Op::Copy: ct[0] = g.to(in[0].device()); break;
    case Op::Count: break;
  }
  for (size_t i = 0; i < ct.size(); ++i)
    if (!want(i)) ct[i] = Array();
  return ct;
}

}  // namespace kiln
