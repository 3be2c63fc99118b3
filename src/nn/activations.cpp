// kiln nn: transformers' ACT2FN activations (activations.py, 4.46) as
// compositions of kiln's primitives, so that each has a VJP and compiles like
// any other elementwise chain.
#include <array>
#include <cmath>

#include "kiln/nn.h"

namespace kiln::nn {
namespace {

struct NamedActivation {
  const char* name;
  Activation act;
};

// ACT2CLS's keys, in its order.
constexpr std::array<NamedActivation, 19> kActivations = {{
    {"gelu", Activation::Gelu},
    {"gelu_10", Activation::Gelu10},
    {"gelu_fast", Activation::GeluFast},
    {"gelu_new", Activation::GeluNew},
    {"gelu_python", Activation::GeluPython},
    {"gelu_pytorch_tanh", Activation::GeluPytorchTanh},
    {"gelu_accurate", Activation::GeluAccurate},
    {"laplace", Activation::Laplace},
    {"leaky_relu", Activation::LeakyRelu},
    {"linear", Activation::Linear},
    {"mish", Activation::Mish},
    {"quick_gelu", Activation::QuickGelu},
    {"relu", Activation::Relu},
    {"relu2", Activation::Relu2},
    {"relu6", Activation::Relu6},
    {"sigmoid", Activation::Sigmoid},
    {"silu", Activation::Silu},
    {"swish", Activation::Swish},
    {"tanh", Activation::Tanh},
}};

}  // namespace

const char* activation_name(Activation act) {
  for (const auto& a : kActivations)
    if (a.act == act) return a.name;
  return "unknown";
}

std::optional<Activation> activation_from_name(const std::string& name) {
  for (const auto& a : kActivations)
    if (name == a.name) return a.act;
  return std::nullopt;
}

const std::vector<std::string>& activation_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& a : kActivations) v.emplace_back(a.name);
    return v;
  }();
  return names;
}

// Both are written with e = exp(−|x|) ≤ 1, which never overflows; the branch
// on x ≥ 0 agrees with abs's VJP at 0 (+1), so the gradient at 0 is exact too.
Array softplus(const Array& x) {
  Array positive = greater_equal(x, scalar_like(x, 0.0));
  Array e = exp(-abs(x));
  return where(positive, x, scalar_like(x, 0.0)) + log(1.0 + e);
}

Array sigmoid(const Array& x) {
  Array positive = greater_equal(x, scalar_like(x, 0.0));
  Array e = exp(-abs(x));
  return where(positive, scalar_like(x, 1.0), e) / (1.0 + e);
}

Array activate(Activation act, const Array& x) {
  switch (act) {
    case Activation::Gelu:
    case Activation::GeluPython: return gelu(x);
    // gelu_fast's 0.7978845608 differs from √(2/π) by 3e-12: below f32's resolution.
    case Activation::GeluFast:
    case Activation::GeluNew:
    case Activation::GeluPytorchTanh:
    case Activation::GeluAccurate: return gelu_tanh(x);
    // GELU never goes below −0.17, so only the upper clip can act.
    case Activation::Gelu10: return minimum(gelu(x), scalar_like(x, 10.0));
    case Activation::Laplace:
      return 0.5 * (1.0 + erf((x - 0.707107) / (0.282095 * std::sqrt(2.0))));
    case Activation::LeakyRelu: return where(greater(x, scalar_like(x, 0.0)), x, x * 0.01);
    case Activation::Linear: return x;
    case Activation::Mish: return x * tanh(softplus(x));
    case Activation::QuickGelu: return x * sigmoid(x * 1.702);
    case Activation::Relu: return relu(x);
    case Activation::Relu2: return square(relu(x));
    case Activation::Relu6: return minimum(relu(x), scalar_like(x, 6.0));
    case Activation::Sigmoid: return sigmoid(x);
    case Activation::Silu:
    case Activation::Swish: return x * sigmoid(x);
    case Activation::Tanh: return tanh(x);
  }
  fail("vit", "unknown activation " + std::to_string(static_cast<int>(act)));
}

}  // namespace kiln::nn
