// Golden parity with transformers' ResNetForImageClassification (fixtures
// written by tools/golden/make_resnet_golden.py): a basic-block model and a
// bottleneck model that downsamples in its bottlenecks and first stage; in
// training mode the logits, the loss, every gradient and the BatchNorm
// running statistics after the forward; the logits in evaluation mode; the
// losses of 5 SGD steps and the statistics they leave; NCHW and NHWC.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/optim.h"
#include "kiln/resnet.h"

namespace kiln {
namespace {

double relative_error(const Array& a, const Array& b, double floor = 1e-30) {
  auto x = astype(a, DType::f64).to_vector<double>(), y = astype(b, DType::f64).to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

struct Golden {
  explicit Golden(const std::string& name)
      : dir(std::string(KILN_FIXTURES_DIR) + "/" + name + "/"),
        cfg(io::load_config<nn::ResNetConfig>(dir + "config.json")),
        model(cfg) {
    Params all = io::load_safetensors(dir + "model.safetensors").tensors;
    for (auto& [n, shape] : model.state_shapes()) {
      state.emplace(n, all.at(n));
      all.erase(n);
    }
    params = all;
    batch = io::load_safetensors(dir + "batch.safetensors").tensors;
    expected = io::load_safetensors(dir + "expected.safetensors").tensors;
  }
  std::string dir;
  nn::ResNetConfig cfg;
  nn::ResNetForImageClassification model;
  Params params, state, batch, expected;

  Array pixels(nn::Layout layout) const {
    return batch.at(layout == nn::Layout::NCHW ? "pixel_values" : "pixel_values_nhwc");
  }
  void expect_state(const Params& got, const std::string& prefix) const {
    for (auto& [n, v] : got) {
      const Array& want = expected.at(prefix + n);
      if (n.ends_with("num_batches_tracked"))
        EXPECT_EQ(v.item<int64_t>(), want.item<int64_t>()) << n;
      else
        EXPECT_LT(relative_error(v, want), 1e-5) << n;
    }
  }
};

using Param = std::tuple<std::string, nn::Layout>;
class ResNetGolden : public ::testing::TestWithParam<Param> {};

TEST_P(ResNetGolden, TrainingForwardBackwardAndStatisticsMatchTransformers) {
  const auto& [name, layout] = GetParam();
  Golden g(name);
  EXPECT_NO_THROW(g.model.check(g.params, g.state, "fixture"));
  const Array x = g.pixels(layout), labels = g.batch.at("labels");
  const nn::ResNetOutput out = g.model.apply(g.params, g.state, x, true, layout);
  EXPECT_LT(relative_error(out.logits, g.expected.at("logits")), 1e-5);
  g.expect_state(out.state, "state.");
  auto [loss, grads] = value_and_grad([&, layout = layout](const Params& p) {
    return g.model.loss(g.model.apply(p, g.state, x, true, layout).logits, labels);
  })(g.params);
  const double want = g.expected.at("loss").item<double>();
  EXPECT_NEAR(loss.item<double>(), want, 1e-5 * want);
  ASSERT_EQ(grads.size(), g.params.size());
  for (auto& [n, grad] : grads) EXPECT_LT(relative_error(grad, g.expected.at("grad." + n)), 1e-4) << n;
}

TEST_P(ResNetGolden, EvaluationUsesTheRunningStatistics) {
  const auto& [name, layout] = GetParam();
  Golden g(name);
  const nn::ResNetOutput out = g.model.apply(g.params, g.state, g.pixels(layout), false, layout);
  EXPECT_LT(relative_error(out.logits, g.expected.at("eval_logits")), 1e-5);
  for (auto& [n, v] : out.state) EXPECT_EQ(v.node(), g.state.at(n).node()) << n;
}

// transformers' first training forward, then 5 SGD steps (momentum 0.9,
// weight decay 1e-4) each updating the running statistics once more.
TEST_P(ResNetGolden, FiveSgdStepsAndTheirStatisticsMatchTorch) {
  const auto& [name, layout] = GetParam();
  Golden g(name);
  const Array x = g.pixels(layout), labels = g.batch.at("labels");
  Params state = g.model.apply(g.params, g.state, x, true, layout).state;
  optim::SGD sgd({.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  Params params = g.params;
  optim::State opt = sgd.init(params);
  const auto want = g.expected.at("sgd_losses").to_vector<double>();
  ASSERT_EQ(want.size(), 5u);
  for (int step = 0; step < 5; ++step) {
    auto [loss, grads] = value_and_grad([&, layout = layout](const Params& p) {
      return g.model.loss(g.model.apply(p, state, x, true, layout).logits, labels);
    })(params);
    EXPECT_NEAR(loss.item<double>(), want[step], 1e-4 * want[step]) << "step " << step;
    state = g.model.apply(params, state, x, true, layout).state;
    std::tie(params, opt) = sgd.update(grads, opt, params);
  }
  g.expect_state(state, "sgd_state.");
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ResNetGolden,
    ::testing::Combine(::testing::Values("resnet_basic_golden", "resnet_bottleneck_golden"),
                       ::testing::Values(nn::Layout::NCHW, nn::Layout::NHWC)),
    [](const auto& info) {
      return std::get<0>(info.param) +
             (std::get<1>(info.param) == nn::Layout::NCHW ? "_nchw" : "_nhwc");
    });

// The training step's loss, gradients and statistics compiled (jit, and
// lazily recorded) are eager's.
TEST(ResNet, JitAndLazyStepsGiveEagerValues) {
  Golden g("resnet_bottleneck_golden");
  const Array x = g.pixels(nn::Layout::NHWC), labels = g.batch.at("labels");
  std::vector<std::string> names;
  std::vector<Array> flat;
  for (auto& [n, v] : g.params) names.push_back(n), flat.push_back(v);
  auto step = [&](const std::vector<Array>& ps) {
    Params p;
    for (size_t i = 0; i < names.size(); ++i) p.emplace(names[i], ps[i]);
    auto [loss, grads] = value_and_grad([&](const Params& q) {
      return g.model.loss(g.model.apply(q, g.state, x, true, nn::Layout::NHWC).logits, labels);
    })(p);
    std::vector<Array> out{loss};
    for (auto& n : names) out.push_back(grads.at(n));
    for (auto& [n, v] : g.model.apply(p, g.state, x, true, nn::Layout::NHWC).state)
      out.push_back(v);
    return out;
  };
  const std::vector<Array> eager = step(flat), compiled = jit(step)(flat);
  std::vector<Array> lazy;
  {
    LazyScope scope;
    lazy = step(flat);
  }
  ASSERT_EQ(compiled.size(), eager.size());
  ASSERT_EQ(lazy.size(), eager.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_LT(relative_error(compiled[i], eager[i], 1e-6), 1e-5) << i;
    EXPECT_LT(relative_error(lazy[i], eager[i], 1e-6), 1e-5) << i;
  }
}

TEST(ResNet, PresetsAreMicrosoftsArchitecturesAndInitIsTransformers) {
  const nn::ResNetConfig r50 = nn::ResNetConfig::preset("resnet-50");
  nn::ResNetForImageClassification m50(r50);
  int64_t n = 0;
  for (auto& [name, shape] : m50.parameter_shapes()) n += numel(shape);
  EXPECT_EQ(n, 25557032);  // microsoft/resnet-50's parameters
  nn::ResNetForImageClassification m18(nn::ResNetConfig::preset("resnet-18"));
  n = 0;
  for (auto& [name, shape] : m18.parameter_shapes()) n += numel(shape);
  EXPECT_EQ(n, 11689512);  // torchvision's resnet18
  const Params p = m18.init(random::Key(0));
  const Array w = p.at("resnet.encoder.stages.1.layers.0.layer.0.convolution.weight");  // 128x64x3x3
  const double var = mean(square(w)).item<float>();
  EXPECT_NEAR(var, 2.0 / (128 * 9), 0.1 * 2.0 / (128 * 9));
  EXPECT_LE(max(abs(p.at("classifier.1.weight"))).item<float>(), 1 / std::sqrt(512.0));
  const Params s = m18.init_state();
  EXPECT_EQ(s.at("resnet.embedder.embedder.normalization.running_var").to_vector<float>()[0], 1.0f);
  EXPECT_EQ(s.at("resnet.embedder.embedder.normalization.num_batches_tracked").dtype(), DType::i64);
  try {
    nn::ResNetConfig::preset("resnet-51");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "[resnet] unknown preset 'resnet-51', expected one of resnet-18, resnet-34, "
                 "resnet-50, resnet-101, resnet-152, resnet-fmnist");
  }
}

TEST(ResNet, ConfigErrorsNameTheFileAndTheField) {
  auto error_of = [](const std::string& text) {
    try {
      nn::ResNetConfig::from_json(text, "c.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of(R"({"model_type": "vit"})"),
            "[config] c.json: field 'model_type' is \"vit\", expected \"resnet\"");
  EXPECT_EQ(error_of(R"({"layer_type": "wide"})"),
            "[config] c.json: field 'layer_type' is \"wide\", expected \"basic\" or \"bottleneck\"");
  EXPECT_EQ(error_of(R"({"depths": [1, 2]})"),
            "[config c.json] hidden_sizes has 4 stages and depths 2: expected one size per stage, "
            "1 or more");
  EXPECT_EQ(error_of(R"({"hidden_sizes": "64"})"),
            "[config] c.json: field 'hidden_sizes' is \"64\", expected a list of integers, one per "
            "stage");
  const nn::ResNetConfig c = nn::ResNetConfig::from_json(
      R"({"model_type": "resnet", "layer_type": "basic", "num_labels": 3})", "c.json");
  EXPECT_FALSE(c.bottleneck);
  EXPECT_EQ(c.num_labels, 3);
}

}  // namespace
}  // namespace kiln
