// kiln cpu backend: random draws. Element i depends only on (key, i).
#include "backend/cpu/kernels.h"
#include "kiln/random.h"

namespace kiln::cpu {
namespace {

constexpr uint32_t kDrawDomain = 2;

// Inverse error function: Giles' approximation refined by two Newton steps.
double erfinv(double y) {
  double w = -std::log((1.0 - y) * (1.0 + y)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    for (double c : {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                     -0.00125372503, -0.00417768164, 0.246640727, 1.50140941})
      p = c + p * w;
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257;
    for (double c : {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                     -0.0076224613, 0.00943887047, 1.00167406, 2.83297682})
      p = c + p * w;
  }
  double x = p * y;
  for (int i = 0; i < 2; ++i) x -= (std::erf(x) - y) / (1.1283791670955126 * std::exp(-x * x));
  return x;
}

void random_kernel(const Primitive& p, const std::vector<Array>&, ArrayNode& out) {
  const auto& a = p.attrs<RandomAttrs>();
  uint32_t dom[2] = {kDrawDomain, 0}, key[2];
  random::threefry2x32(a.key, dom, key);
  int64_t n = numel(out.shape);
  int64_t blocks = (n + 1) / 2;
  void* y = alloc_output(out);
  double lo = 0, hi = 0;
  if (a.kind == RandomKind::TruncatedNormal) {
    lo = std::erf(a.a / std::sqrt(2.0));
    hi = std::erf(a.b / std::sqrt(2.0));
  }
  auto store = [&](int64_t i, double v) {
    switch (out.dtype) {
      case DType::f32: static_cast<float*>(y)[i] = static_cast<float>(v); break;
      case DType::f64: static_cast<double*>(y)[i] = v; break;
      case DType::bf16: static_cast<bf16*>(y)[i] = bf16(static_cast<float>(v)); break;
      case DType::bool_: static_cast<bool*>(y)[i] = v != 0; break;
      default: break;
    }
  };
  parallel_for(blocks, 16, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      uint32_t ctr[2] = {static_cast<uint32_t>(j >> 32), static_cast<uint32_t>(j)}, w[2];
      random::threefry2x32(key, ctr, w);
      double u[2] = {(w[0] >> 8) * 0x1p-24, (w[1] >> 8) * 0x1p-24};  // [0, 1)
      double v[2] = {0, 0};
      switch (a.kind) {
        case RandomKind::Uniform:
          for (int k = 0; k < 2; ++k) v[k] = a.a + (a.b - a.a) * u[k];
          break;
        case RandomKind::Normal: {
          double r = std::sqrt(-2.0 * std::log(1.0 - u[0]));  // 1 - u in (0, 1]
          v[0] = r * std::cos(2 * M_PI * u[1]);
          v[1] = r * std::sin(2 * M_PI * u[1]);
          break;
        }
        case RandomKind::TruncatedNormal:
          for (int k = 0; k < 2; ++k) {
            double uu = (u[k] + 0x1p-25);  // (0, 1)
            double z = std::sqrt(2.0) * erfinv(lo + uu * (hi - lo));
            v[k] = std::fmin(std::fmax(z, a.a), a.b);
          }
          break;
        case RandomKind::Bernoulli:
          for (int k = 0; k < 2; ++k) v[k] = u[k] < a.a ? 1.0 : 0.0;
          break;
      }
      store(2 * j, v[0]);
      if (2 * j + 1 < n) store(2 * j + 1, v[1]);
    }
  });
}

}  // namespace

void register_random(KernelTable& t) { t.kernels[static_cast<int>(Op::Random)] = random_kernel; }

}  // namespace kiln::cpu
