// Golden parity with transformers for the configurations beyond the default
// one (fixtures written by tools/golden/make_vit_configs_golden.py): non-square
// images and patches whose sizes leave a remainder, every ACT2FN activation,
// regression, multi-label classification, pruned heads and a model without a
// classifier. Each checks logits and loss within 1e-5 relative and every
// gradient within 1e-4, as vit_golden_test.cpp does, and prints the measured
// differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/train.h"

namespace kiln {
namespace {

// ‖a − b‖ / max(‖b‖, floor) in double.
double relative_error(const Array& a, const Array& b, double floor = 1e-30) {
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

// One fixture folder: what transformers' save_pretrained wrote, and the batch
// with PyTorch's results.
struct Case {
  explicit Case(const std::string& name)
      : dir(std::string(KILN_FIXTURES_DIR) + "/vit_configs/" + name + "/"),
        cfg(io::load_config<nn::ViTConfig>(dir + "config.json")),
        weights(io::load_safetensors(dir + "model.safetensors").tensors),
        golden(io::load_safetensors(dir + "golden.safetensors").tensors) {}
  std::string dir;
  nn::ViTConfig cfg;
  Params weights, golden;

  Array pixels(nn::Layout layout) const {
    const Array& nchw = golden.at("pixel_values");
    return layout == nn::Layout::NCHW ? nchw : transpose(nchw, {0, 2, 3, 1});
  }
};

// Checks kiln's logits, loss and gradients against the golden values under
// `prefix` ("" or e.g. "mish.") and prints the differences.
void expect_matches(const train::GradResult& r, const Case& c, const std::string& prefix,
                    const std::string& what) {
  const Params& g = c.golden;
  double logits = relative_error(r.logits, g.at(prefix + "logits"));
  double want = g.at(prefix + "loss").item<double>();
  double loss = std::abs(r.loss.item<double>() - want) / std::abs(want);
  EXPECT_LT(logits, 1e-5) << what;
  EXPECT_LT(loss, 1e-5) << what;
  // Gradients that are zero in exact arithmetic (the key bias: softmax
  // ignores a shift shared by a row) are rounding noise in PyTorch; norms
  // below 0.1% of the whole gradient's norm are measured against that floor.
  double total = 0;
  for (auto& [name, grad] : r.grads)
    for (double v : g.at(prefix + "grad." + name).to_vector<double>()) total += v * v;
  ASSERT_EQ(r.grads.size(), c.weights.size()) << what;
  double floor = 1e-3 * std::sqrt(total), worst = 0;
  std::string worst_name;
  for (auto& [name, grad] : r.grads) {
    double e = relative_error(grad, g.at(prefix + "grad." + name), floor);
    EXPECT_LT(e, 1e-4) << what << ": " << name;
    if (e > worst) worst = e, worst_name = name;
  }
  std::printf("[golden] %-40s logits %.1e  loss %.1e  worst gradient %.1e (%s)\n", what.c_str(),
              logits, loss, worst, worst_name.c_str());
}

void expect_sgd_losses(const Case& c, const Array& labels) {
  nn::ViTForImageClassification model(c.cfg);
  optim::SGD sgd({.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  Params params = c.weights;
  optim::State state = sgd.init(params);
  Array pixels = c.pixels(nn::Layout::NCHW);
  auto want = c.golden.at("sgd_losses").to_vector<double>();
  ASSERT_EQ(want.size(), 5u);
  for (int step = 0; step < 5; ++step) {
    auto [loss, grads] = value_and_grad(
        [&](const Params& p) { return model.loss(model.apply(p, pixels), labels); })(params);
    EXPECT_NEAR(loss.item<double>(), want[step], 1e-5 * want[step]) << "step " << step;
    std::tie(params, state) = sgd.update(grads, state, params);
  }
}

TEST(VitConfigsGolden, NonSquareImagesAndPatchesWithRemainders) {
  Case c("nonsquare");
  ASSERT_EQ(c.cfg.image_size, nn::Size2d(18, 13));
  ASSERT_EQ(c.cfg.patch_size, nn::Size2d(5, 4));  // 3 x 3 patches; 3 rows and 1 column unused
  for (nn::Layout layout : {nn::Layout::NCHW, nn::Layout::NHWC}) {
    const char* name = layout == nn::Layout::NCHW ? "NCHW" : "NHWC";
    auto r = train::forward_backward(*nn::vit_model(c.cfg), c.weights, c.pixels(layout),
                                     c.golden.at("labels"), layout);
    expect_matches(r, c, "", std::string("nonsquare, ") + name);
  }
  // transformers' eager attention, unfused, gives the same.
  nn::ViTForImageClassification model(c.cfg);
  nn::ApplyOptions unfused;
  unfused.fused_attention = false;
  Array pixels = c.pixels(nn::Layout::NCHW);
  EXPECT_LT(relative_error(model.apply(c.weights, pixels, unfused), c.golden.at("logits")), 1e-5);
  expect_sgd_losses(c, c.golden.at("labels"));
}

TEST(VitConfigsGolden, CrossEntropySkipsLabelsOfMinus100) {
  Case c("nonsquare");
  Array labels = c.golden.at("labels_ignore");
  ASSERT_EQ(labels.to_vector<int64_t>()[1], -100);
  auto r = train::forward_backward(*nn::vit_model(c.cfg), c.weights, c.pixels(nn::Layout::NCHW),
                                   labels, nn::Layout::NCHW);
  expect_matches(r, c, "ignore.", "nonsquare, label -100 ignored");
}

TEST(VitConfigsGolden, EveryActivationOfTransformersAct2fn) {
  Case c("activations");
  for (const std::string& name : nn::activation_names()) {
    nn::ViTConfig cfg = c.cfg;
    cfg.hidden_act = *nn::activation_from_name(name);
    auto r = train::forward_backward(*nn::vit_model(cfg), c.weights, c.pixels(nn::Layout::NCHW),
                                     c.golden.at("labels"), nn::Layout::NCHW);
    expect_matches(r, c, name + ".", "hidden_act " + name);
  }
}

TEST(VitConfigsGolden, RegressionWithOneLabelSqueezesLogitsAndLabels) {
  Case c("regression");
  ASSERT_EQ(c.cfg.num_labels, 1);
  ASSERT_EQ(c.cfg.problem_type, nn::ProblemType::Unset);   // num_labels 1 makes it regression
  Array labels = c.golden.at("labels");                    // f32 [B]
  Array column = reshape(labels, {labels.shape()[0], 1});  // [B, 1]: squeezed the same
  Array pixels = c.pixels(nn::Layout::NCHW);
  expect_matches(
      train::forward_backward(*nn::vit_model(c.cfg), c.weights, pixels, labels, nn::Layout::NCHW),
      c, "", "regression, labels [B]");
  expect_matches(
      train::forward_backward(*nn::vit_model(c.cfg), c.weights, pixels, column, nn::Layout::NCHW),
      c, "", "regression, labels [B, 1]");
  expect_sgd_losses(c, labels);
}

TEST(VitConfigsGolden, RegressionWithSeveralOutputs) {
  Case c("regression_multi");
  ASSERT_EQ(c.cfg.problem_type, nn::ProblemType::Regression);
  auto r = train::forward_backward(*nn::vit_model(c.cfg), c.weights, c.pixels(nn::Layout::NCHW),
                                   c.golden.at("labels"), nn::Layout::NCHW);
  expect_matches(r, c, "", "regression, 3 outputs");
}

TEST(VitConfigsGolden, MultiLabelClassificationSetOrInferredFromFloatLabels) {
  Case c("multi_label");
  ASSERT_EQ(c.cfg.problem_type, nn::ProblemType::MultiLabel);
  Array pixels = c.pixels(nn::Layout::NCHW), labels = c.golden.at("labels");
  expect_matches(
      train::forward_backward(*nn::vit_model(c.cfg), c.weights, pixels, labels, nn::Layout::NCHW),
      c, "", "multi_label_classification");
  nn::ViTConfig inferred = c.cfg;
  inferred.problem_type = nn::ProblemType::Unset;  // float labels with 4 labels: multi-label
  expect_matches(train::forward_backward(*nn::vit_model(inferred), c.weights, pixels, labels,
                                         nn::Layout::NCHW),
                 c, "", "multi-label inferred from float labels");
  expect_sgd_losses(c, labels);
}

TEST(VitConfigsGolden, PrunedHeads) {
  Case c("pruned");
  ASSERT_EQ(c.cfg.heads_in_layer(0), 3);
  ASSERT_EQ(c.cfg.heads_in_layer(1), 2);
  for (bool fused : {true, false}) {
    nn::ViTForImageClassification model(c.cfg);
    nn::ApplyOptions opt;
    opt.fused_attention = fused;
    Array logits = model.apply(c.weights, c.pixels(nn::Layout::NCHW), opt);
    EXPECT_LT(relative_error(logits, c.golden.at("logits")), 1e-5) << "fused " << fused;
  }
  auto r = train::forward_backward(*nn::vit_model(c.cfg), c.weights, c.pixels(nn::Layout::NCHW),
                                   c.golden.at("labels"), nn::Layout::NCHW);
  expect_matches(r, c, "", "pruned_heads");
}

TEST(VitConfigsGolden, NoClassifierWhenNumLabelsIsZero) {
  Case c("no_classifier");
  ASSERT_EQ(c.cfg.num_labels, 0);
  auto r = train::forward_backward(*nn::vit_model(c.cfg), c.weights, c.pixels(nn::Layout::NCHW),
                                   c.golden.at("labels"), nn::Layout::NCHW);
  EXPECT_EQ(r.logits.shape(), (Shape{3, c.cfg.hidden_size}));  // the final [CLS] features
  expect_matches(r, c, "", "num_labels 0 (no classifier)");
}

// Labels that transformers' losses refuse (torch raises on them) get an error
// naming them, the problem type and what it needs.
TEST(VitConfigsGolden, LabelsThatDoNotFitTheProblemTypeNameIt) {
  Case c("regression");
  Array pixels = c.pixels(nn::Layout::NCHW);
  auto error_for = [&](const nn::ViTConfig& cfg, const Params& w, const Array& labels) {
    try {
      train::forward_backward(*nn::vit_model(cfg), w, pixels, labels, nn::Layout::NCHW);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Array classes = Array::from_vector(std::vector<int64_t>{0, 1, 0}, {3});
  EXPECT_NE(error_for(c.cfg, c.weights, classes)
                .find("labels are i64 (3), but problem_type regression with num_labels 1 needs "
                      "float labels (3) or (3,1)"),
            std::string::npos);
  Case m("multi_label");
  Array pixels_m = m.pixels(nn::Layout::NCHW);
  try {
    train::forward_backward(*nn::vit_model(m.cfg), m.weights, pixels_m, classes, nn::Layout::NCHW);
    ADD_FAILURE() << "integer labels for multi-label classification were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("problem_type multi_label_classification with num_labels "
                                         "4 needs float labels (3,4) (as the logits)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
