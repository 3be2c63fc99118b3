// Golden parity with transformers' DeiTForImageClassification and
// DeiTForImageClassificationWithTeacher (fixtures written by
// tools/golden/make_deit_golden.py): logits, softmax cross-entropy and every
// gradient, NCHW and NHWC, eager and compiled; DeiT's initialization.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/io.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

const std::string kDir = std::string(KILN_FIXTURES_DIR) + "/deit_golden/";

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

using Param = std::tuple<std::string, nn::Layout>;
class DeiTGolden : public ::testing::TestWithParam<Param> {};

TEST_P(DeiTGolden, LogitsLossAndGradientsMatchTransformers) {
  const auto& [name, layout] = GetParam();
  const std::string dir = kDir + name + "/";
  const nn::ViTConfig cfg = io::load_config<nn::ViTConfig>(dir + "config.json", "deit");
  const nn::ViTForImageClassification model(
      cfg, name == "deit" ? nn::ViTVariant::DeiT : nn::ViTVariant::DeiTWithTeacher);
  const Params weights = io::load_safetensors(dir + "model.safetensors").tensors;
  const Params batch = io::load_safetensors(kDir + "batch.safetensors").tensors;
  const Params expected = io::load_safetensors(dir + "expected.safetensors").tensors;
  EXPECT_NO_THROW(model.check(weights, "fixture"));
  const Array x = batch.at(layout == nn::Layout::NCHW ? "pixel_values" : "pixel_values_nhwc");
  const Array labels = batch.at("labels");
  auto f = [&, layout = layout](const Params& p) {
    return mean(softmax_cross_entropy(model.apply(p, x, {.layout = layout}), labels));
  };
  EXPECT_LT(relative_error(model.apply(weights, x, {.layout = layout}), expected.at("logits")), 1e-5);
  for (bool compiled : {false, true}) {
    SCOPED_TRACE(compiled ? "jit" : "eager");
    std::vector<std::string> names;
    std::vector<Array> flat;
    for (auto& [n, v] : weights) names.push_back(n), flat.push_back(v);
    auto step = [&](const std::vector<Array>& in) {
      Params p;
      for (size_t i = 0; i < names.size(); ++i) p.emplace(names[i], in[i]);
      auto [loss, grads] = value_and_grad(f)(p);
      std::vector<Array> out{loss};
      for (auto& n : names) out.push_back(grads.at(n));
      return out;
    };
    const std::vector<Array> out = compiled ? jit(step)(flat) : step(flat);
    const double want = expected.at("loss").item<double>();
    EXPECT_NEAR(out[0].item<double>(), want, 1e-5 * want);
    // The key biases' gradients are zero in exact arithmetic (softmax ignores
    // a shift of a whole row): PyTorch's are rounding noise, measured against
    // 0.1% of the whole gradient's norm, as the ViT fixture's.
    double total = 0;
    for (auto& [n, e] : expected)
      if (n.starts_with("grad.")) total += sum(square(astype(e, DType::f64))).item<double>();
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_LT(relative_error(out[1 + i], expected.at("grad." + names[i]), 1e-3 * std::sqrt(total)),
                1e-4)
          << names[i];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, DeiTGolden,
    ::testing::Combine(::testing::Values("deit", "deit_with_teacher"),
                       ::testing::Values(nn::Layout::NCHW, nn::Layout::NHWC)),
    [](const auto& info) {
      return std::get<0>(info.param) +
             (std::get<1>(info.param) == nn::Layout::NCHW ? "_nchw" : "_nhwc");
    });

// DeiT's names and initialization: a distillation token beside [CLS], both
// and the position embeddings starting at zero; the teacher model's two heads.
TEST(DeiT, NamesAndInitAreTransformers) {
  const nn::ViTConfig cfg = io::load_config<nn::ViTConfig>(kDir + "deit/config.json", "deit");
  const nn::ViTForImageClassification deit(cfg, nn::ViTVariant::DeiT);
  const Params p = deit.init(random::Key(0));
  EXPECT_EQ(p.at("deit.embeddings.position_embeddings").shape(), (Shape{1, 16 + 2, 32}));
  EXPECT_EQ(max(abs(p.at("deit.embeddings.distillation_token"))).item<float>(), 0.0f);
  EXPECT_EQ(max(abs(p.at("deit.embeddings.cls_token"))).item<float>(), 0.0f);
  EXPECT_GT(max(abs(p.at("deit.encoder.layer.0.attention.attention.query.weight"))).item<float>(), 0.0f);
  const nn::ViTForImageClassification teacher(cfg, nn::ViTVariant::DeiTWithTeacher);
  int heads = 0;
  for (auto& [n, s] : teacher.parameter_shapes())
    heads += n == "cls_classifier.weight" || n == "distillation_classifier.weight";
  EXPECT_EQ(heads, 2);
  try {
    nn::ViTConfig::from_json(R"({"model_type": "vit"})", "c.json", "deit");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[config] c.json: field 'model_type' is \"vit\", expected \"deit\"");
  }
}

}  // namespace
}  // namespace kiln
