// transformers' ACT2FN activations as kiln computes them (nn::activate): each
// against its definition in activations.py evaluated in double precision,
// its gradient (autodiff through kiln's primitives) against central finite
// differences, and σ and softplus finite where eˣ overflows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "kiln/kiln.h"
#include "kiln/nn.h"

namespace kiln {
namespace {

using nn::Activation;

double gelu_erf(double x) {
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double gelu_tanh_ref(double x, double c) {
  return 0.5 * x * (1 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double sigmoid_ref(double x) {
  return 1 / (1 + std::exp(-x));
}

// activations.py (transformers 4.46), one line each.
const std::map<Activation, std::function<double(double)>>& definitions() {
  static const std::map<Activation, std::function<double(double)>> defs = {
      {Activation::Gelu, gelu_erf},
      {Activation::GeluPython, gelu_erf},
      {Activation::Gelu10, [](double x) { return std::clamp(gelu_erf(x), -10.0, 10.0); }},
      {Activation::GeluFast,
       [](double x) {
         return 0.5 * x * (1 + std::tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)));
       }},
      {Activation::GeluNew, [](double x) { return gelu_tanh_ref(x, std::sqrt(2 / M_PI)); }},
      {Activation::GeluPytorchTanh, [](double x) { return gelu_tanh_ref(x, std::sqrt(2 / M_PI)); }},
      {Activation::GeluAccurate, [](double x) { return gelu_tanh_ref(x, std::sqrt(2 / M_PI)); }},
      {Activation::Laplace,
       [](double x) { return 0.5 * (1 + std::erf((x - 0.707107) / (0.282095 * std::sqrt(2.0)))); }},
      {Activation::LeakyRelu, [](double x) { return x > 0 ? x : 0.01 * x; }},
      {Activation::Linear, [](double x) { return x; }},
      {Activation::Mish, [](double x) { return x * std::tanh(std::log1p(std::exp(x))); }},
      {Activation::QuickGelu, [](double x) { return x * sigmoid_ref(1.702 * x); }},
      {Activation::Relu, [](double x) { return std::max(x, 0.0); }},
      {Activation::Relu2, [](double x) { return std::pow(std::max(x, 0.0), 2); }},
      {Activation::Relu6, [](double x) { return std::clamp(x, 0.0, 6.0); }},
      {Activation::Sigmoid, sigmoid_ref},
      {Activation::Silu, [](double x) { return x * sigmoid_ref(x); }},
      {Activation::Swish, [](double x) { return x * sigmoid_ref(x); }},
      {Activation::Tanh, [](double x) { return std::tanh(x); }},
  };
  return defs;
}

// Both tails, both sides of 0 and of the clips at 6 (relu6) and 10 (gelu_10).
const std::vector<double> kPoints = {-30, -12, -6.5, -2,  -0.7, -1e-3, 1e-3,
                                     0.3, 1.5, 5.9,  6.1, 9.5,  10.5,  30};

TEST(Activations, EveryNameHasADefinition) {
  EXPECT_EQ(definitions().size(), nn::activation_names().size());
  for (const auto& name : nn::activation_names())
    EXPECT_TRUE(definitions().count(*nn::activation_from_name(name))) << name;
  EXPECT_FALSE(nn::activation_from_name("selu").has_value());
}

TEST(Activations, MatchTransformersDefinitionsInDoublePrecision) {
  Array x = Array::from_vector(kPoints, {static_cast<int64_t>(kPoints.size())});
  for (const auto& [act, f] : definitions()) {
    auto y = nn::activate(act, x).to_vector<double>();
    for (size_t i = 0; i < kPoints.size(); ++i)
      EXPECT_NEAR(y[i], f(kPoints[i]), 1e-9 * std::max(1.0, std::abs(f(kPoints[i]))))
          << nn::activation_name(act) << " at " << kPoints[i];
  }
}

TEST(Activations, GradientsMatchFiniteDifferences) {
  Array x = Array::from_vector(kPoints, {static_cast<int64_t>(kPoints.size())});
  const double h = 1e-6;
  for (const auto& [act, f] : definitions()) {
    auto g = grad([&, act = act](const Array& v) { return sum(nn::activate(act, v)); })(x)
                 .to_vector<double>();
    for (size_t i = 0; i < kPoints.size(); ++i) {
      double fd = (f(kPoints[i] + h) - f(kPoints[i] - h)) / (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-6 * std::max(1.0, std::abs(fd)))
          << nn::activation_name(act) << " at " << kPoints[i];
    }
  }
}

TEST(Activations, SigmoidAndSoftplusStayFiniteWhereExpOverflows) {
  Array x = Array::from_vector<float>({-200, -80, 0, 80, 200}, {5});
  auto s = nn::sigmoid(x).to_vector<float>();
  EXPECT_LT(s[0], 1e-37f);  // e⁻²⁰⁰ is below f32; kiln's exp stops at its least normal
  EXPECT_NEAR(s[1], std::exp(-80.0), 1e-5 * std::exp(-80.0));
  EXPECT_EQ(s[2], 0.5f);
  EXPECT_EQ(s[3], 1.0f);
  EXPECT_EQ(s[4], 1.0f);
  auto sp = nn::softplus(x).to_vector<float>();
  EXPECT_EQ(sp[4], 200.0f);
  EXPECT_FLOAT_EQ(sp[2], std::log(2.0f));
  auto dsp = grad([](const Array& v) { return sum(nn::softplus(v)); })(x).to_vector<float>();
  auto dsig = grad([](const Array& v) { return sum(nn::sigmoid(v)); })(x).to_vector<float>();
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(std::isfinite(dsp[i]) && std::isfinite(dsig[i])) << i;
    EXPECT_NEAR(dsp[i], s[i], 1e-6 * s[i]);  // softplus' = σ
  }
  EXPECT_FLOAT_EQ(dsig[2], 0.25f);  // σ'(0), the branch at 0 included
}

}  // namespace
}  // namespace kiln
