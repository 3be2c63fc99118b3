// The layer library (kiln/layers.h): each layer against the ops it stands
// for, its declarations and initializations, the random sites of dropout and
// drop path, BatchNorm's state, the fused and unfused attention, and the
// errors of missing parameters and bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "../test_util.h"
#include "kiln/kiln.h"
#include "kiln/layers.h"

namespace kiln {
namespace {

using test_util::error_of;

using nn::Layout;
using nn::Scope;

double max_abs_diff(const Array& a, const Array& b) {
  EXPECT_EQ(a.shape(), b.shape());
  auto x = astype(a, DType::f64).to_vector<double>(), y = astype(b, DType::f64).to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

Array draw(uint64_t seed, const Shape& shape) {
  return random::normal(random::Key(seed), shape);
}

TEST(NnLayers, DeclarationsNameShapeAndInitializeTheParameters) {
  nn::Decls d;
  nn::Linear{"enc.fc", 6, 4}.declare(d);
  nn::Conv2d{.name = "conv", .in = 4, .out = 8, .kernel = 3, .groups = 2, .bias = false}.declare(d);
  nn::LayerNorm{"", 5}.declare(d);
  nn::BatchNorm{"bn", 8}.declare(d);
  nn::Embedding{"wte", 10, 3}.declare(d);
  const auto shapes = nn::shapes_of(d);
  const std::vector<std::pair<std::string, Shape>> want = {
      {"enc.fc.weight", {4, 6}}, {"enc.fc.bias", {4}},   {"conv.weight", {8, 2, 3, 3}},
      {"weight", {5}},           {"bias", {5}},          {"bn.weight", {8}},
      {"bn.bias", {8}},          {"wte.weight", {10, 3}}};
  EXPECT_EQ(shapes, want);

  nn::Decls s;
  nn::BatchNorm{"bn", 8}.declare_state(s);
  const Params state = nn::init_state(s);
  EXPECT_EQ(state.at("bn.running_mean").to_vector<float>(), std::vector<float>(8, 0.f));
  EXPECT_EQ(state.at("bn.running_var").to_vector<float>(), std::vector<float>(8, 1.f));
  EXPECT_EQ(state.at("bn.num_batches_tracked").dtype(), DType::i64);
  EXPECT_EQ(state.at("bn.num_batches_tracked").shape(), Shape{});

  // Each initializer's statistics, and draws that follow the key.
  const nn::Decls inits = {{"n", {200, 100}, nn::Init::normal(0.5)},
                           {"t", {200, 100}, nn::Init::truncated_normal(1.5)},
                           {"u", {200, 100}, nn::Init::uniform(0.25)},
                           {"k", {200, 100}, nn::Init::kaiming_normal_fan_out(50)},
                           {"c", {3}, nn::Init::constant(1e-6)}};
  const Params p = nn::init_params(inits, random::Key(1));
  auto stats = [&](const char* n) {
    auto v = p.at(n).to_vector<float>();
    double m = 0, sq = 0, lo = 1e9, hi = -1e9;
    for (float x : v)
      m += x, sq += double(x) * x, lo = std::min<double>(lo, x), hi = std::max<double>(hi, x);
    m /= v.size();
    return std::array<double, 4>{m, std::sqrt(sq / v.size() - m * m), lo, hi};
  };
  EXPECT_NEAR(stats("n")[1], 0.5, 0.01);
  // torch's trunc_normal_ cuts at ±2 absolute, not in standard deviations.
  EXPECT_GE(stats("t")[2], -2.0);
  EXPECT_LE(stats("t")[3], 2.0);
  EXPECT_LT(stats("t")[2], -1.9);
  EXPECT_LT(stats("t")[1], 1.2);
  EXPECT_GE(stats("u")[2], -0.25);
  EXPECT_LE(stats("u")[3], 0.25);
  EXPECT_NEAR(stats("u")[1], 0.25 / std::sqrt(3.0), 0.003);
  EXPECT_NEAR(stats("k")[1], std::sqrt(2.0 / 50), 0.005);
  EXPECT_EQ(p.at("c").to_vector<float>(), std::vector<float>(3, 1e-6f));
  EXPECT_EQ(max_abs_diff(p.at("n"), nn::init_params(inits, random::Key(1)).at("n")), 0.0);
  EXPECT_GT(max_abs_diff(p.at("n"), nn::init_params(inits, random::Key(2)).at("n")), 0.1);
}

TEST(NnLayers, LinearIsXTimesWTransposedPlusB) {
  const Params p = {{"fc.weight", draw(1, {4, 6})}, {"fc.bias", draw(2, {4})}};
  const Params none;
  Scope s(p, none, {}, "test");
  const Array x = draw(3, {2, 5, 6});
  const Array y = nn::Linear{"fc", 6, 4}(s, x);
  const Array want = matmul(x, transpose(p.at("fc.weight"))) + p.at("fc.bias");
  EXPECT_LT(max_abs_diff(y, want), 1e-5);
  // bf16 mixed precision: the operands rounded, the result f32.
  Scope half(p, none, {.matmul_dtype = DType::bf16}, "test");
  const Array yb = nn::Linear{"fc", 6, 4}(half, x);
  EXPECT_EQ(yb.dtype(), DType::f32);
  EXPECT_LT(max_abs_diff(yb, want), 0.1);
  EXPECT_GT(max_abs_diff(yb, want), 0.0);
  EXPECT_NE(error_of([&] {
              nn::Linear{"head", 6, 4}(s, x);
            }).find("missing parameter 'head.weight'"),
            std::string::npos);
}

// The patch matmul (stride = kernel) and the convolution agree, in each
// layout and with rows and columns that no window reaches.
TEST(NnLayers, Conv2dPatchesEqualTheConvolution) {
  const Params p = {{"c.weight", draw(1, {5, 3, 4, 4})}, {"c.bias", draw(2, {5})}};
  const Params none;
  Scope s(p, none, {}, "test");
  const nn::Conv2d patch{
      .name = "c", .in = 3, .out = 5, .kernel = 4, .stride = 4, .patch_matmul = true};
  const nn::Conv2d conv{.name = "c", .in = 3, .out = 5, .kernel = 4, .stride = 4};
  const Array x = draw(3, {2, 3, 10, 13});  // 2x3 windows, 2 rows and 1 column left over
  const Array ref =
      conv2d(x, p.at("c.weight"), {.stride = {4}}) + reshape(p.at("c.bias"), {5, 1, 1});
  EXPECT_EQ(ref.shape(), (Shape{2, 5, 2, 3}));
  EXPECT_LT(max_abs_diff(patch(s, x, Layout::NCHW), ref), 1e-4);
  const Array nhwc = transpose(x, {0, 2, 3, 1});
  const Array ref_nhwc = transpose(ref, {0, 2, 3, 1});
  EXPECT_LT(max_abs_diff(patch(s, nhwc, Layout::NHWC), ref_nhwc), 1e-4);
  EXPECT_LT(max_abs_diff(patch(s, x, Layout::NCHW, Layout::NHWC), ref_nhwc), 1e-4);
  EXPECT_LT(max_abs_diff(patch(s, nhwc, Layout::NHWC, Layout::NCHW), ref), 1e-4);
  EXPECT_LT(max_abs_diff(conv(s, x, Layout::NCHW), ref), 1e-4);
  EXPECT_LT(max_abs_diff(conv(s, nhwc, Layout::NHWC, Layout::NCHW), ref), 1e-4);
  const nn::Conv2d padded{.name = "c",
                          .in = 3,
                          .out = 5,
                          .kernel = 4,
                          .stride = 4,
                          .padding = nn::Conv2d::pad(1),
                          .patch_matmul = true};
  EXPECT_NE(error_of([&] { padded(s, x, Layout::NCHW); }).find("needs stride = kernel"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              patch(s, draw(4, {1, 3, 3, 8}), Layout::NCHW);
            }).find("does not fit"),
            std::string::npos);
  EXPECT_NE(error_of([&] { patch(s, nhwc, Layout::NCHW); }).find("expected 3 channels on axis 1"),
            std::string::npos);
}

TEST(NnLayers, Conv2dWithGroupsDilationAndPaddingInEachLayout) {
  const Params p = {{"dw.weight", draw(1, {6, 2, 3, 3})}, {"dw.bias", draw(2, {6})}};
  const Params none;
  Scope s(p, none, {}, "test");
  const nn::Conv2d conv{.name = "dw",
                        .in = 6,
                        .out = 6,
                        .kernel = 3,
                        .stride = {2, 1},
                        .dilation = 2,
                        .padding = {{2, 1}, {0, 2}},
                        .groups = 3};
  const Array x = draw(3, {2, 6, 9, 7});
  const Array ref =
      conv2d(x, p.at("dw.weight"),
             {.stride = {2, 1}, .dilation = {2, 2}, .padding = {{2, 1}, {0, 2}}, .groups = 3}) +
      reshape(p.at("dw.bias"), {6, 1, 1});
  EXPECT_LT(max_abs_diff(conv(s, x, Layout::NCHW), ref), 1e-4);
  EXPECT_LT(max_abs_diff(conv(s, transpose(x, {0, 2, 3, 1}), Layout::NHWC, Layout::NCHW), ref),
            1e-4);
  nn::Decls d;
  EXPECT_NE(error_of([&] {
              nn::Conv2d{.name = "bad", .in = 6, .out = 4, .groups = 4}.declare(d);
            }).find("divisible by groups"),
            std::string::npos);
}

TEST(NnLayers, LayerNormOverTheLastAxisOrChannelsFirst) {
  const Params p = {{"ln.weight", draw(1, {4})}, {"ln.bias", draw(2, {4})}};
  const Params none;
  Scope s(p, none, {}, "test");
  const Array x = draw(3, {2, 4, 3, 5});  // [N, C, H, W]
  const Array last = nn::LayerNorm{"ln", 4, 1e-6}(s, transpose(x, {0, 2, 3, 1}));
  const Array first = nn::LayerNorm{"ln", 4, 1e-6, true}(s, x);
  EXPECT_EQ(first.shape(), x.shape());
  EXPECT_LT(max_abs_diff(first, transpose(last, {0, 3, 1, 2})), 1e-5);
  // By hand at one position: (x - mean) / √(var + eps) · γ + β over the channels.
  auto v = x.to_vector<float>(), g = p.at("ln.weight").to_vector<float>(),
       b = p.at("ln.bias").to_vector<float>(), y = first.to_vector<float>();
  double m = 0, var = 0;
  for (int c = 0; c < 4; ++c) m += v[c * 15];
  m /= 4;
  for (int c = 0; c < 4; ++c) var += (v[c * 15] - m) * (v[c * 15] - m);
  var /= 4;
  for (int c = 0; c < 4; ++c)
    EXPECT_NEAR(y[c * 15], (v[c * 15] - m) / std::sqrt(var + 1e-6) * g[c] + b[c], 1e-5);
}

TEST(NnLayers, BatchNormUpdatesItsStateInTrainingAndReadsItInEvaluation) {
  const nn::BatchNorm bn{"bn", 3};
  nn::Decls pd, sd;
  bn.declare(pd);
  bn.declare_state(sd);
  const Params p = nn::init_params(pd, random::Key(0));
  const Params state = nn::init_state(sd);
  const Array x = draw(1, {4, 5, 5, 3}) * 2.0 + 1.0;  // NHWC
  Scope train(p, state, {.train = true}, "test");
  const Array y = bn(train, x, Layout::NHWC);
  const Params after = train.take_state();
  EXPECT_EQ(after.at("bn.num_batches_tracked").to_vector<int64_t>(), std::vector<int64_t>{1});
  // The batch's statistics normalize: each channel of y has mean 0, variance 1.
  const auto ym = mean(y, {0, 1, 2}).to_vector<float>();
  for (float m : ym) EXPECT_NEAR(m, 0.0, 1e-5);
  // running_mean = 0.9·0 + 0.1·batch mean.
  const auto bm = mean(x, {0, 1, 2}).to_vector<float>(),
             rm = after.at("bn.running_mean").to_vector<float>();
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(rm[c], 0.1 * bm[c], 1e-5);
  // Evaluation: the running statistics normalize and the state stays.
  Scope eval(p, after, {}, "test");
  const Array ye = bn(eval, x, Layout::NHWC);
  const auto rv = after.at("bn.running_var").to_vector<float>();
  const auto xv = x.to_vector<float>(), yev = ye.to_vector<float>();
  EXPECT_NEAR(yev[0], (xv[0] - rm[0]) / std::sqrt(rv[0] + 1e-5), 1e-4);
  EXPECT_EQ(eval.new_state().at("bn.num_batches_tracked").to_vector<int64_t>(),
            std::vector<int64_t>{1});
  const Params none;
  Scope missing(p, none, {}, "resnet");
  const std::string e = error_of([&] { bn(missing, x, Layout::NHWC); });
  EXPECT_NE(e.find("missing state entry 'bn.running_"), std::string::npos) << e;
}

TEST(NnLayers, EmbeddingReadsRowsAtIntegerIds) {
  const Params p = {{"wte.weight", draw(1, {10, 3})}};
  const Params none;
  Scope s(p, none, {}, "test");
  const int32_t ids[] = {7, 0, 7, 9};
  const Array id = Array::from_data(ids, {2, 2}, DType::i32);
  const Array y = nn::Embedding{"wte", 10, 3}(s, id);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 3}));
  const auto w = p.at("wte.weight").to_vector<float>(), v = y.to_vector<float>();
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(v[i * 3 + c], w[ids[i] * 3 + c]);
  EXPECT_NE(error_of([&] {
              nn::Embedding{"wte", 10, 3}(s, astype(id, DType::f32));
            }).find("expected integers"),
            std::string::npos);
}

TEST(NnLayers, DropoutAndDropPathDrawPerSiteAndOnlyWhileDropping) {
  const Params none;
  const Array x = ones({64, 32});
  const Array key = random::key_array(random::Key(5));
  // Off in evaluation and with drop off; each call still takes a site.
  Scope eval(none, none, {.key = key}, "test");
  EXPECT_EQ(max_abs_diff(nn::Dropout{0.5}(eval, x), x), 0.0);
  Scope no_drop(none, none, {.train = true, .drop = false, .key = key}, "test");
  EXPECT_EQ(max_abs_diff(nn::DropPath{0.5}(no_drop, x), x), 0.0);
  EXPECT_EQ(no_drop.next_site(), 1u);

  Scope s(none, none, {.train = true, .key = key}, "test");
  const Array a = nn::Dropout{0.25}(s, x), b = nn::Dropout{0.25}(s, x);
  // Kept values are scaled by 1/(1-p); about 3/4 are kept; two sites differ.
  const auto av = a.to_vector<float>();
  int kept = 0;
  for (float v : av) {
    EXPECT_TRUE(v == 0.f || std::abs(v - 1 / 0.75f) < 1e-6);
    kept += v != 0.f;
  }
  EXPECT_NEAR(kept / double(av.size()), 0.75, 0.05);
  EXPECT_GT(max_abs_diff(a, b), 0.0);
  // The same key and site give the same mask: site 0 of a new scope.
  Scope again(none, none, {.train = true, .key = key}, "test");
  EXPECT_EQ(max_abs_diff(nn::Dropout{0.25}(again, x), a), 0.0);
  // Drop path keeps or drops whole examples.
  const auto dp = nn::DropPath{0.5}(s, x).to_vector<float>();
  int dropped = 0;
  for (int i = 0; i < 64; ++i) {
    for (int j = 1; j < 32; ++j) EXPECT_EQ(dp[i * 32 + j], dp[i * 32]);
    EXPECT_TRUE(dp[i * 32] == 0.f || dp[i * 32] == 2.f);
    dropped += dp[i * 32] == 0.f;
  }
  EXPECT_GT(dropped, 10);
  EXPECT_LT(dropped, 54);
  EXPECT_EQ(max_abs_diff(nn::Dropout{1.0}(s, x), zeros_like(x)), 0.0);
}

// The fused attention (one QKV GEMM, kiln::attention) and the unfused one
// (three Linears, softmax) agree, in values and in gradients, with pruned
// heads (heads · head_dim < dim).
TEST(NnLayers, MultiHeadAttentionFusedEqualsUnfused) {
  const nn::MultiHeadAttention mha{
      .query = "q", .key = "k", .value = "v", .output = "o", .dim = 8, .heads = 3, .head_dim = 2};
  nn::Decls d;
  mha.declare(d);
  EXPECT_EQ(nn::shapes_of(d).front(), (std::pair<std::string, Shape>{"q.weight", {6, 8}}));
  EXPECT_EQ(nn::shapes_of(d).back(), (std::pair<std::string, Shape>{"o.bias", {8}}));
  Params p = nn::init_params(d, random::Key(3));
  for (auto& [name, a] : p)
    if (name.ends_with("bias")) a = draw(9, a.shape()) * 0.1;
  const Array x = draw(4, {2, 5, 8});
  auto run = [&](bool fused) {
    return value_and_grad([&](const Params& q) {
      const Params none;
      Scope s(q, none, {.fused_attention = fused}, "test");
      return sum(square(mha(s, x)));
    })(p);
  };
  auto [vf, gf] = run(true);
  auto [vu, gu] = run(false);
  EXPECT_NEAR(vf.item<float>(), vu.item<float>(), 1e-4 * std::abs(vu.item<float>()));
  for (auto& [name, g] : gu) EXPECT_LT(max_abs_diff(gf.at(name), g), 1e-4) << name;
  const Params none;
  Scope s(p, none, {.fused_attention = false}, "test");
  EXPECT_EQ(mha(s, x).shape(), (Shape{2, 5, 8}));
  EXPECT_NE(error_of([&] {
              mha(s, draw(1, {2, 5, 7}));
            }).find("expected [batch, tokens, 8]"),
            std::string::npos);
}

TEST(NnLayers, MLPIsDownOfTheActivationOfUp) {
  const nn::MLP mlp{.up = {"up", 4, 16}, .down = {"down", 16, 4}, .act = nn::Activation::Relu};
  nn::Decls d;
  mlp.declare(d);
  const Params p = nn::init_params(d, random::Key(2));
  const Params none;
  Scope s(p, none, {}, "test");
  const Array x = draw(3, {3, 4});
  const Array want = matmul(relu(matmul(x, transpose(p.at("up.weight"))) + p.at("up.bias")),
                            transpose(p.at("down.weight"))) +
                     p.at("down.bias");
  EXPECT_LT(max_abs_diff(mlp(s, x), want), 1e-5);
}

}  // namespace
}  // namespace kiln
