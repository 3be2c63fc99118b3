// kiln ops: counter-based random numbers (Threefry-2x32, 20 rounds).
#include "kiln/random.h"

#include <cmath>

#include "kiln/primitive.h"
#include "ops/dispatch.h"

namespace kiln::random {
namespace {

inline uint32_t rotl(uint32_t x, int r) {
  return (x << r) | (x >> (32 - r));
}

// Counter-space domains, so that split, fold_in and draws never share a block.
constexpr uint32_t kFoldIn = 0, kSplit = 1;

Key derive(const Key& key, uint32_t domain, uint32_t data) {
  uint32_t in[2] = {domain, data}, out[2];
  threefry2x32(key.k, in, out);
  return Key(out[0], out[1]);
}

Array draw(const Key& key, const Shape& shape, RandomKind kind, double a, double b, DType dtype,
           Device device, const char* op) {
  for (auto d : shape)
    if (d < 0) fail(op, "negative dimension in shape " + str(shape));
  if (kind != RandomKind::Bernoulli &&
      !(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16))
    fail(op, std::string("dtype must be f32, f64 or bf16, got ") + name_of(dtype));
  RandomAttrs attrs{{key.k[0], key.k[1]}, kind, a, b, shape, dtype};
  return make_array(Primitive(Op::Random, attrs), {}, shape, dtype, -1, device);
}

}  // namespace

void threefry2x32(const uint32_t key[2], const uint32_t in[2], uint32_t out[2]) {
  static constexpr int kRot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  const uint32_t ks[3] = {key[0], key[1], key[0] ^ key[1] ^ 0x1BD11BDAu};
  uint32_t x0 = in[0] + ks[0], x1 = in[1] + ks[1];
  for (int block = 0; block < 5; ++block) {
    for (int r = 0; r < 4; ++r) {
      x0 += x1;
      x1 = rotl(x1, kRot[(block % 2) * 4 + r]) ^ x0;
    }
    x0 += ks[(block + 1) % 3];
    x1 += ks[(block + 2) % 3] + static_cast<uint32_t>(block + 1);
  }
  out[0] = x0;
  out[1] = x1;
}

namespace {
constexpr uint32_t kDrawDomain = 2;

// Inverse error function: Giles' approximation refined by two Newton steps.
double erfinv(double y) {
  double w = -std::log((1.0 - y) * (1.0 + y)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    for (double c : {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                     -0.00417768164, 0.246640727, 1.50140941})
      p = c + p * w;
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257;
    for (double c : {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                     0.00943887047, 1.00167406, 2.83297682})
      p = c + p * w;
  }
  double x = p * y;
  for (int i = 0; i < 2; ++i) x -= (std::erf(x) - y) / (1.1283791670955126 * std::exp(-x * x));
  return x;
}
}  // namespace

DrawSpec draw_spec(const Key& key, RandomKind kind, double a, double b) {
  DrawSpec s{{0, 0}, kind, a, b};
  uint32_t dom[2] = {kDrawDomain, 0};
  threefry2x32(key.k, dom, s.key);
  if (kind == RandomKind::TruncatedNormal) {
    s.a = std::erf(a / std::sqrt(2.0));
    s.b = std::erf(b / std::sqrt(2.0));
    s.lower = a, s.upper = b;
  }
  return s;
}

DrawSpec draw_spec(const RandomAttrs& attrs, const int32_t* key_bits) {
  Key key(attrs.key[0], attrs.key[1]);
  if (key_bits) key = Key(static_cast<uint32_t>(key_bits[0]), static_cast<uint32_t>(key_bits[1]));
  if (attrs.fold) key = fold_in(key, attrs.fold_data);
  return draw_spec(key, attrs.kind, attrs.a, attrs.b);
}

void draw_block(const DrawSpec& s, uint64_t j, double v[2]) {
  uint32_t ctr[2] = {static_cast<uint32_t>(j >> 32), static_cast<uint32_t>(j)}, w[2];
  threefry2x32(s.key, ctr, w);
  double u[2] = {(w[0] >> 8) * 0x1p-24, (w[1] >> 8) * 0x1p-24};  // [0, 1)
  switch (s.kind) {
    case RandomKind::Uniform:
      for (int k = 0; k < 2; ++k) v[k] = s.a + (s.b - s.a) * u[k];
      break;
    case RandomKind::Normal: {
      double r = std::sqrt(-2.0 * std::log(1.0 - u[0]));  // 1 - u in (0, 1]
      v[0] = r * std::cos(2 * M_PI * u[1]);
      v[1] = r * std::sin(2 * M_PI * u[1]);
      break;
    }
    case RandomKind::TruncatedNormal:
      // Inverse CDF of the normal restricted to [lower, upper]; s.a, s.b hold
      // erf of the bounds over sqrt(2).
      for (int k = 0; k < 2; ++k) {
        double y = s.a + (u[k] + 0x1p-25) * (s.b - s.a);
        v[k] = std::fmin(std::fmax(std::sqrt(2.0) * erfinv(y), s.lower), s.upper);
      }
      break;
    case RandomKind::Bernoulli:
      for (int k = 0; k < 2; ++k) v[k] = u[k] < s.a ? 1.0 : 0.0;
      break;
  }
}

void fill_normal(const Key& key, float* out, int64_t n) {
  DrawSpec s = draw_spec(key, RandomKind::Normal);
  double v[2];
  for (int64_t j = 0; 2 * j < n; ++j) {
    draw_block(s, static_cast<uint64_t>(j), v);
    out[2 * j] = static_cast<float>(v[0]);
    if (2 * j + 1 < n) out[2 * j + 1] = static_cast<float>(v[1]);
  }
}

std::vector<Key> split(const Key& key, int num) {
  if (num < 1) fail("random.split", "num must be positive, got " + std::to_string(num));
  std::vector<Key> keys;
  for (int i = 0; i < num; ++i) keys.push_back(derive(key, kSplit, static_cast<uint32_t>(i)));
  return keys;
}

Key fold_in(const Key& key, uint32_t data) {
  return derive(key, kFoldIn, data);
}

Array uniform(const Key& key, const Shape& shape, double low, double high, DType dtype,
              Device device) {
  if (!(low < high)) fail("random.uniform", "low must be below high");
  return draw(key, shape, RandomKind::Uniform, low, high, dtype, device, "random.uniform");
}

Array normal(const Key& key, const Shape& shape, DType dtype, Device device) {
  return draw(key, shape, RandomKind::Normal, 0, 1, dtype, device, "random.normal");
}

Array truncated_normal(const Key& key, const Shape& shape, double lower, double upper,
                       DType dtype, Device device) {
  if (!(lower < upper)) fail("random.truncated_normal", "lower must be below upper");
  return draw(key, shape, RandomKind::TruncatedNormal, lower, upper, dtype, device,
              "random.truncated_normal");
}

Array key_array(const Key& key, Device device) {
  std::vector<int32_t> bits{static_cast<int32_t>(key.k[0]), static_cast<int32_t>(key.k[1])};
  return Array::from_data(bits.data(), {2}, DType::i32, device);
}

Array bernoulli(const Array& key, uint32_t data, const Shape& shape, double p) {
  if (!key.valid() || key.shape() != Shape{2} || key.dtype() != DType::i32)
    fail("random.bernoulli", "a key array must be i32 of shape (2), as random::key_array makes");
  if (!(p >= 0 && p <= 1))
    fail("random.bernoulli", "p must lie in [0, 1], got " + std::to_string(p));
  RandomAttrs attrs{{0, 0}, RandomKind::Bernoulli, p, 0, shape, DType::bool_, true, data};
  return make_array(Primitive(Op::Random, attrs), {key}, shape, DType::bool_);
}

Array bernoulli(const Key& key, const Shape& shape, double p, Device device) {
  if (!(p >= 0 && p <= 1))
    fail("random.bernoulli", "p must lie in [0, 1], got " + std::to_string(p));
  return draw(key, shape, RandomKind::Bernoulli, p, 0, DType::bool_, device, "random.bernoulli");
}

}  // namespace kiln::random
