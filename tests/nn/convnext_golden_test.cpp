// Golden parity with transformers' ConvNextForImageClassification (fixture
// written by tools/golden/make_convnext_golden.py): logits, loss, every
// gradient and the losses of 5 SGD steps, for NCHW and NHWC inputs; a
// compiled step against eager; stochastic depth's per-sample drops.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/convnext.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/optim.h"

namespace kiln {
namespace {

const std::string kDir = std::string(KILN_FIXTURES_DIR) + "/convnext_golden/";

double relative_error(const Array& a, const Array& b) {
  auto x = astype(a, DType::f64).to_vector<double>(), y = astype(b, DType::f64).to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

struct Golden {
  nn::ConvNextConfig cfg = io::load_config<nn::ConvNextConfig>(kDir + "config.json");
  nn::ConvNextForImageClassification model{cfg};
  Params weights = io::load_safetensors(kDir + "model.safetensors").tensors;
  Params batch = io::load_safetensors(kDir + "batch.safetensors").tensors;
  Params expected = io::load_safetensors(kDir + "expected.safetensors").tensors;
  Array pixels(nn::Layout layout) const {
    return batch.at(layout == nn::Layout::NCHW ? "pixel_values" : "pixel_values_nhwc");
  }
};

class ConvNextGolden : public ::testing::TestWithParam<nn::Layout> {};

TEST_P(ConvNextGolden, LogitsLossAndGradientsMatchTransformers) {
  Golden g;
  const nn::Layout layout = GetParam();
  EXPECT_NO_THROW(g.model.check(g.weights, "fixture"));
  EXPECT_EQ(g.weights.size(), g.model.parameter_shapes().size());
  const Array x = g.pixels(layout), labels = g.batch.at("labels");
  EXPECT_LT(relative_error(g.model.apply(g.weights, x, true, layout), g.expected.at("logits")), 1e-5);
  auto [loss, grads] = value_and_grad([&](const Params& p) {
    return g.model.loss(g.model.apply(p, x, true, layout), labels);
  })(g.weights);
  const double want = g.expected.at("loss").item<double>();
  EXPECT_NEAR(loss.item<double>(), want, 1e-5 * want);
  ASSERT_EQ(grads.size(), g.weights.size());
  for (auto& [n, grad] : grads) EXPECT_LT(relative_error(grad, g.expected.at("grad." + n)), 1e-4) << n;
}

TEST_P(ConvNextGolden, FiveSgdStepsMatchTorchOptimSgd) {
  Golden g;
  const nn::Layout layout = GetParam();
  const Array x = g.pixels(layout), labels = g.batch.at("labels");
  optim::SGD sgd({.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  Params params = g.weights;
  optim::State state = sgd.init(params);
  const auto want = g.expected.at("sgd_losses").to_vector<double>();
  ASSERT_EQ(want.size(), 5u);
  auto step = jit([&](const std::vector<Array>& in) {
    Params p;
    size_t i = 0;
    for (auto& [n, v] : g.weights) p.emplace(n, in[i++]);
    auto [loss, grads] = value_and_grad([&](const Params& q) {
      return g.model.loss(g.model.apply(q, x, true, layout), labels);
    })(p);
    std::vector<Array> out{loss};
    for (auto& [n, v] : grads) out.push_back(v);
    return out;
  });
  for (int s = 0; s < 5; ++s) {
    std::vector<Array> flat;
    for (auto& [n, v] : params) flat.push_back(v);
    const std::vector<Array> out = step(flat);  // compiled: the same as eager
    Params grads;
    size_t i = 1;
    for (auto& [n, v] : params) grads.emplace(n, out[i++]);
    EXPECT_NEAR(out[0].item<double>(), want[s], 1e-4 * want[s]) << "step " << s;
    std::tie(params, state) = sgd.update(grads, state, params);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ConvNextGolden,
                         ::testing::Values(nn::Layout::NCHW, nn::Layout::NHWC),
                         [](const auto& info) {
                           return info.param == nn::Layout::NCHW ? "nchw" : "nhwc";
                         });

// Stochastic depth (drop_path_rate): in training a layer's branch is kept or
// dropped per sample, kept ones scaled by 1 / keep; the same key draws the
// same; evaluation never drops.
TEST(ConvNext, DropPathDropsWholeSamplesInTrainingOnly) {
  Golden g;
  nn::ConvNextConfig cfg = g.cfg;
  cfg.drop_path_rate = 0.9;
  nn::ConvNextForImageClassification model(cfg);
  const Array x = g.pixels(nn::Layout::NCHW);
  const Array plain = g.model.apply(g.weights, x, true);
  const Array a = model.apply(g.weights, x, true, nn::Layout::NCHW, random::Key(7));
  const Array b = model.apply(g.weights, x, true, nn::Layout::NCHW, random::Key(7));
  const Array c = model.apply(g.weights, x, true, nn::Layout::NCHW, random::Key(8));
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  EXPECT_GT(relative_error(a, plain), 1e-3);
  EXPECT_LT(relative_error(model.apply(g.weights, x, false), g.model.apply(g.weights, x, false)), 1e-7);
}

TEST(ConvNext, PresetsAreFacebooksArchitecturesAndConfigErrorsNameTheField) {
  int64_t n = 0;
  for (auto& [name, shape] :
       nn::ConvNextForImageClassification(nn::ConvNextConfig::preset("convnext-tiny")).parameter_shapes())
    n += numel(shape);
  EXPECT_EQ(n, 28589128);  // facebook/convnext-tiny-224
  try {
    nn::ConvNextConfig::from_json(R"({"model_type": "convnext", "num_stages": 3})", "c.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "[config] c.json: field 'num_stages' is 3 for 4 depths: expected one depth per stage");
  }
  Golden g;
  const Params p = g.model.init(random::Key(0));
  EXPECT_EQ(p.at("convnext.encoder.stages.1.layers.0.layer_scale_parameter").to_vector<float>()[0],
            0.5f);
  EXPECT_EQ(p.at("convnext.layernorm.weight").to_vector<float>()[0], 1.0f);
  EXPECT_EQ(p.at("convnext.encoder.stages.1.downsampling_layer.0.weight").to_vector<float>()[0], 1.0f);
  const double var = mean(square(p.at("convnext.encoder.stages.1.layers.0.pwconv1.weight"))).item<float>();
  EXPECT_NEAR(std::sqrt(var), 0.02, 0.004);
}

}  // namespace
}  // namespace kiln
