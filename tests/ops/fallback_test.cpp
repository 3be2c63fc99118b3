// The fused primitives' fallbacks (their definitions' values made of basic
// primitives, src/ops/defs/): every backend's fused kernel against its
// fallback run on the reference backend, and whole functions with every
// fallback forced in place of the kernels, eagerly and compiled.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "kiln/kiln.h"
#include "ops/dispatch.h"
#include "ops/op_defs.h"
#include "reference.h"

namespace kiln::testing {
namespace {

struct Operand {
  Shape shape;
  int64_t classes = 0;  // > 0: integer labels in [0, classes)
};

struct FusedCase {
  std::string name;
  Primitive prim;
  std::vector<Operand> in;
  Shape out = {};  // where the rule does not fix it (the fused programs: f32)
};

std::vector<FusedCase> fused_cases() {
  const double eps = 1e-5;
  using R = FusedRead;
  // x * row + scalar, then gelu.
  const FusedAttrs program{{R::Whole, R::Row, R::Scalar},
                           {{Op::Mul, 0, 1}, {Op::Add, 3, 2}, {Op::Gelu, 4, -1}}};
  // gelu(a bᵀ + row) * scalar.
  const EpilogueAttrs epilogue{
      MatmulAttrs{false, true, DType::f32},
      {{Op::Add, 0, R::Row}, {Op::Gelu, -1, R::Whole}, {Op::Mul, 1, R::Scalar}}};
  // sum over axis 1 of exp(x * row), times a scalar.
  const FusedReduceAttrs reduce{FusedAttrs{{R::Whole, R::Row}, {{Op::Mul, 0, 1}, {Op::Exp, 2, -1}}},
                                {3, 4, 5},
                                ReduceAttrs{{1}, false},
                                FusedAttrs{{R::Whole, R::Scalar}, {{Op::Mul, 0, 1}}},
                                0};
  // A grouped, strided, dilated convolution with asymmetric padding; NHWC
  // for its gradients.
  const ConvAttrs conv{{2, 1}, {1, 2}, {1, 0}, {0, 2}, 2, false, {}, {}};
  ConvAttrs conv_dx = conv, conv_dw = conv;
  conv_dx.channels_last = conv_dw.channels_last = true;
  conv_dx.input = {2, 7, 6, 4};
  conv_dw.weight = {6, 2, 3, 2};
  const PoolAttrs max_pool{PoolKind::Max, {3, 2}, {2, 1}, {1, 0}, {1, 1}, false, true};
  const PoolAttrs avg_pool{PoolKind::Avg, {3, 3}, {2, 2}, {1, 1}, {1, 0}, true, false};
  return {
      {"conv", Primitive(Op::Conv, conv), {{{2, 4, 7, 6}}, {{6, 2, 3, 2}}}},
      {"conv_grad_input", Primitive(Op::ConvGradInput, conv_dx), {{{2, 3, 6, 6}}, {{6, 2, 3, 2}}}},
      {"conv_grad_weight",
       Primitive(Op::ConvGradWeight, conv_dw),
       {{{2, 7, 6, 4}}, {{2, 3, 6, 6}}}},
      {"max_pool", Primitive(Op::Pool, max_pool), {{{2, 3, 7, 5}}}},
      {"max_pool_grad", Primitive(Op::PoolGrad, max_pool), {{{2, 3, 7, 5}}, {{2, 3, 4, 5}}}},
      {"avg_pool", Primitive(Op::Pool, avg_pool), {{{2, 6, 5, 3}}}},
      {"avg_pool_grad", Primitive(Op::PoolGrad, avg_pool), {{{2, 6, 5, 3}}, {{2, 3, 2, 3}}}},
      {"softmax_rows", Primitive(Op::Softmax, AxisAttrs{1}), {{{3, 7}}}},
      {"softmax_cols", Primitive(Op::Softmax, AxisAttrs{0}), {{{3, 7}}}},
      {"log_softmax", Primitive(Op::LogSoftmax, AxisAttrs{1}), {{{4, 6}}}},
      {"layer_norm", Primitive(Op::LayerNorm, NormAttrs{eps}), {{{5, 8}}}},
      {"layer_norm_affine", Primitive(Op::LayerNorm, NormAttrs{eps}), {{{5, 8}}, {{8}}, {{8}}}},
      {"layer_norm_grad", Primitive(Op::LayerNormGrad, NormAttrs{eps}), {{{5, 8}}, {{5, 8}}}},
      {"layer_norm_grad_affine",
       Primitive(Op::LayerNormGrad, NormAttrs{eps}),
       {{{5, 8}}, {{8}}, {{5, 8}}}},
      {"layer_norm_grad_residual",
       Primitive(Op::LayerNormGrad, NormAttrs{eps, true}),
       {{{5, 8}}, {{8}}, {{5, 8}}, {{5, 8}}}},
      {"layer_norm_param_grad",
       Primitive(Op::LayerNormParamGrad, NormAttrs{eps}),
       {{{2, 3, 8}}, {{2, 3, 8}}}},
      {"softmax_cross_entropy", Primitive(Op::SoftmaxCrossEntropy), {{{6, 10}}, {{6}, 10}}},
      {"softmax_cross_entropy_grad",
       Primitive(Op::SoftmaxCrossEntropyGrad),
       {{{6, 10}}, {{6}, 10}, {{6}}}},
      {"attention", Primitive(Op::Attention, AttentionAttrs{0.35}), {{{2, 5, 3, 2, 4}}}},
      {"attention_grad",
       Primitive(Op::AttentionGrad, AttentionAttrs{0.35}),
       {{{2, 5, 3, 2, 4}}, {{2, 5, 2, 4}}}},
      {"sdpa",
       Primitive(Op::Sdpa, SdpaAttrs{0.4}),
       {{{2, 5, 3, 4}}, {{2, 7, 3, 4}}, {{2, 7, 3, 4}}}},
      {"sdpa_causal_bias",
       Primitive(Op::Sdpa, SdpaAttrs{0.4, true, true}),
       {{{2, 5, 3, 4}}, {{2, 7, 3, 4}}, {{2, 7, 3, 4}}, {{1, 3, 5, 7}}}},
      {"sdpa_grad",
       Primitive(Op::SdpaGrad, SdpaAttrs{0.4}),
       {{{2, 5, 3, 4}}, {{2, 7, 3, 4}}, {{2, 7, 3, 4}}, {{2, 5, 3, 4}}}},
      {"sdpa_grad_causal_bias",
       Primitive(Op::SdpaGrad, SdpaAttrs{0.4, true, true}),
       {{{2, 5, 3, 4}}, {{2, 7, 3, 4}}, {{2, 7, 3, 4}}, {{2, 5, 3, 4}}, {{2, 1, 5, 1}}}},
      {"fused_elementwise",
       Primitive(Op::FusedElementwise, program),
       {{{3, 4}}, {{4}}, {{}}},
       {3, 4}},
      {"matmul_epilogue",
       Primitive(Op::MatmulEpilogue, epilogue),
       {{{4, 6}}, {{5, 6}}, {{5}}, {{}}}},
      {"fused_reduce", Primitive(Op::FusedReduce, reduce), {{{3, 4, 5}}, {{5}}, {{}}}, {3, 5}},
  };
}

std::vector<Array> operands(const FusedCase& c, uint32_t seed, DType dt, Device dev) {
  std::vector<Array> out;
  for (const Operand& o : c.in) {
    const random::Key key(seed++);
    out.push_back(
        o.classes
            ? astype(random::uniform(key, o.shape, 0, double(o.classes), DType::f64), DType::i32)
                  .to(dev)
            : astype(random::uniform(key, o.shape, -2, 2, DType::f64), dt).to(dev));
  }
  return out;
}

// The node of c's primitive on `in`, run by the backend's kernel.
Array kernel_value(const FusedCase& c, const std::vector<Array>& in) {
  Array y = c.out.empty() ? apply(c.prim, in) : make_array(c.prim, in, c.out, DType::f32);
  y.eval();
  return y;
}

double max_rel_diff(const Host& got, const Host& want) {
  double scale = 1e-30, diff = 0;
  for (size_t i = 0; i < want.v.size(); ++i) {
    scale = std::max(scale, std::abs(want.v[i]));
    diff = std::max(diff, std::abs(got.v[i] - want.v[i]));
  }
  return diff / scale;
}

TEST(Fallbacks, EveryFusedPrimitiveHasOneAndACase) {
  std::set<Op> cased;
  for (const FusedCase& c : fused_cases()) cased.insert(c.prim.op());
  for (int i = 0; i < kOpCount; ++i) {
    const Op op = static_cast<Op>(i);
    if (op_kind(op) != OpKind::Fused) continue;
    EXPECT_TRUE(op_def(op).fallback) << op_name(op) << " has no fallback";
    EXPECT_TRUE(cased.count(op)) << op_name(op) << " has no case here";
  }
}

// The fallback runs on the reference backend in f64 (the compiler-made
// programs in f32, as they are defined); each backend's kernel runs in f64
// where the backend takes it, else in f32.
TEST(Fallbacks, EveryBackendsFusedKernelsMatchTheirFallbacks) {
  std::vector<Device> devices{Device::cpu(), Device::ref()};
  if (cuda_device_count() > 0) devices.push_back(Device::cuda());
  uint32_t seed = 1;
  for (const FusedCase& c : fused_cases()) {
    SCOPED_TRACE(c.name);
    const bool program = c.prim.op() == Op::FusedElementwise || c.prim.op() == Op::MatmulEpilogue ||
                         c.prim.op() == Op::FusedReduce;
    const std::vector<Array> ref_in =
        operands(c, seed, program ? DType::f32 : DType::f64, Device::ref());
    std::vector<Aval> types;
    for (const Array& x : ref_in) types.push_back({x.shape(), x.dtype()});
    const Aval out = c.out.empty() ? infer_type(c.prim, types) : Aval{c.out, DType::f32};
    const Host want = to_host(op_def(c.prim.op()).fallback(c.prim, ref_in, out));
    ASSERT_EQ(want.shape, out.shape);
    std::set<std::string> ran;
    for (Device dev : devices) {
      for (DType dt : {DType::f64, DType::f32}) {
        const std::vector<Array> in = operands(c, seed, dt, dev);
        std::vector<DType> dts;
        std::vector<Aval> avals;
        for (const Array& x : in) {
          dts.push_back(x.dtype());
          avals.push_back({x.shape(), x.dtype()});
        }
        DType out_dt = DType::f32;
        try {
          if (c.out.empty()) out_dt = infer_type(c.prim, avals).dtype;
        } catch (const Error&) {
          continue;  // not a type this primitive takes
        }
        if (!check_type(c.prim, avals, {c.out.empty() ? want.shape : c.out, out_dt}).empty())
          continue;
        if (!backend_supports(dev, c.prim, dts, out_dt)) continue;
        SCOPED_TRACE(dev.str() + " " + name_of(dt));
        const Host got = to_host(kernel_value(c, in));
        ASSERT_EQ(got.shape, want.shape);
        EXPECT_LE(max_rel_diff(got, want), dt == DType::f64 && !program ? 1e-12 : 2e-6);
        ran.insert(dev.str());
        break;
      }
    }
    EXPECT_TRUE(ran.count(Device::ref().str())) << "the ref backend has no kernel for it";
    seed += static_cast<uint32_t>(c.in.size());
  }
}

// A transformer block's loss and gradients, every fused primitive made by
// the ops or by the compiler running its fallback, against the kernels.
std::vector<Array> block(const std::vector<Array>& p) {
  const Array& x = p[0];  // [B, T, C]
  const Shape& s = x.shape();
  const int64_t heads = 2;
  auto loss = [&](const std::vector<Array>& w) {
    const Array h = layer_norm(x, w[0], w[1], 1e-5);
    const Array qkv = reshape(matmul(h, w[2]), {s[0], s[1], 3, heads, s[2] / heads});
    const Array a = reshape(attention(qkv, 0.5), s) + x;
    const Array logits = gelu(matmul(reshape(a, {-1, s[2]}), w[3]));
    const Array labels = Array::from_vector<int32_t>({0, 2, 1, 3, 0, 1}, {6});
    return std::vector<Array>{mean(softmax_cross_entropy(logits, labels)) +
                              sum(softmax(logits, 1) * logits) * 0.01};
  };
  auto [out, grads] = vjp(loss, {p[1], p[2], p[3], p[4]}, {scalar_like(x, 1.0)});
  grads.insert(grads.begin(), out[0]);
  return grads;
}

TEST(Fallbacks, ForcedEverywhereTheyGiveTheKernelsValuesEagerAndCompiled) {
  std::vector<Array> p;
  const std::vector<Shape> shapes{{2, 3, 8}, {8}, {8}, {8, 24}, {8, 4}};
  for (size_t i = 0; i < shapes.size(); ++i)
    p.push_back(random::uniform(random::Key(40 + i), shapes[i], -1, 1));
  const std::vector<Array> kernels = block(p), jit_kernels = jit(block)(p);
  std::vector<Op> fused;
  for (int i = 0; i < kOpCount; ++i)
    if (op_kind(static_cast<Op>(i)) == OpKind::Fused) fused.push_back(static_cast<Op>(i));
  set_forced_fallbacks(fused);
  EXPECT_TRUE(runs_fallback(Device::cpu(), Op::Attention));
  std::vector<Array> eager, compiled;
  try {
    eager = block(p);
    compiled = jit(block)(p);
  } catch (...) {
    set_forced_fallbacks({});
    throw;
  }
  set_forced_fallbacks({});
  EXPECT_FALSE(runs_fallback(Device::cpu(), Op::Attention));
  ASSERT_EQ(eager.size(), kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_LE(max_rel_diff(to_host(eager[i]), to_host(kernels[i])), 2e-6);
    EXPECT_LE(max_rel_diff(to_host(compiled[i]), to_host(jit_kernels[i])), 2e-6);
  }
}

}  // namespace
}  // namespace kiln::testing
