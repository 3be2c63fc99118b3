// kiln ops: counter-based random numbers (Threefry-2x32, 20 rounds): keys,
// draws as Random primitives, and the host entry points of ops/threefry.h
// (the block function and draws that every backend shares).
#include "kiln/random.h"

#include <climits>
#include <cmath>
#include <limits>

#include "kiln/ops.h"

#include "ops/dispatch.h"
#include "ops/primitive.h"
#include "ops/threefry.h"

namespace kiln::random {
namespace {

Key derive(const Key& key, uint32_t domain, uint32_t data) {
  uint32_t out[2];
  threefry::derive(key.k, domain, data, out);
  return Key(out[0], out[1]);
}

Array draw(const Key& key, const Shape& shape, RandomKind kind, double a, double b, DType dtype,
           Device device, const char* op) {
  for (auto d : shape)
    if (d < 0) fail(op, "negative dimension in shape " + str(shape));
  if (kind == RandomKind::Randint) {
    if (dtype != DType::i32) fail(op, std::string("dtype must be i32, got ") + name_of(dtype));
  } else if (kind != RandomKind::Bernoulli &&
             !(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16)) {
    fail(op, std::string("dtype must be f32, f64 or bf16, got ") + name_of(dtype));
  }
  RandomAttrs attrs{{key.k[0], key.k[1]}, kind, a, b, shape, dtype};
  return apply(Primitive(Op::Random, attrs), {}, -1, device);
}

}  // namespace

void threefry2x32(const uint32_t key[2], const uint32_t in[2], uint32_t out[2]) {
  threefry::threefry2x32(key, in, out);
}

DrawSpec draw_spec(const Key& key, RandomKind kind, double a, double b) {
  DrawSpec s = threefry::draw_params(kind, a, b);
  threefry::draw_key(key.k, false, 0, s.key);
  return s;
}

DrawSpec draw_spec(const RandomAttrs& attrs, const int32_t* key_bits) {
  uint32_t key[2] = {attrs.key[0], attrs.key[1]};
  if (key_bits) threefry::key_of_bits(key_bits, key);
  DrawSpec s = threefry::draw_params(attrs.kind, attrs.a, attrs.b);
  threefry::draw_key(key, attrs.fold, attrs.fold_data, s.key);
  return s;
}

void draw_block(const DrawSpec& s, uint64_t j, double v[2]) {
  threefry::draw_block(s, j, v);
}

void uniform_block(const Key& key, uint64_t block, double out[2]) {
  draw_block(draw_spec(key, RandomKind::Uniform, 0, 1), block, out);
}

std::vector<Key> split(const Key& key, int num) {
  if (num < 1) fail("random.split", "num must be positive, got " + std::to_string(num));
  std::vector<Key> keys;
  for (int i = 0; i < num; ++i)
    keys.push_back(derive(key, threefry::kSplit, static_cast<uint32_t>(i)));
  return keys;
}

Key fold_in(const Key& key, uint32_t data) {
  return derive(key, threefry::kFoldIn, data);
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

Array gamma(const Key& key, const Shape& shape, double a, DType dtype, Device device) {
  if (!(a > 0) || !std::isfinite(a))
    fail("random.gamma", "the shape a must be positive and finite, got " + std::to_string(a));
  return draw(key, shape, RandomKind::Gamma, a, 0, dtype, device, "random.gamma");
}

Array beta(const Key& key, const Shape& shape, double a, double b, DType dtype, Device device) {
  if (!(a > 0 && b > 0) || !std::isfinite(a) || !std::isfinite(b))
    fail("random.beta", "a and b must be positive and finite, got " + std::to_string(a) + " and " +
                            std::to_string(b));
  const std::vector<Key> keys = split(key, 2);
  const Array x = gamma(keys[0], shape, a, DType::f64, device);
  const Array y = gamma(keys[1], shape, b, DType::f64, device);
  return astype(x / (x + y), dtype);
}

Array randint(const Key& key, const Shape& shape, int64_t low, int64_t high, Device device) {
  if (!(low < high))
    fail("random.randint",
         "high must be above low, got [" + std::to_string(low) + ", " + std::to_string(high) + ")");
  if (low < INT32_MIN || high - 1 > INT32_MAX)
    fail("random.randint", "[" + std::to_string(low) + ", " + std::to_string(high) +
                               ") does not fit the i32 it draws");
  return draw(key, shape, RandomKind::Randint, static_cast<double>(low), static_cast<double>(high),
              DType::i32, device, "random.randint");
}

Array categorical(const Key& key, const Array& logits, int axis) {
  if (!logits.valid() || logits.ndim() == 0)
    fail("random.categorical", "logits must have at least one axis");
  if (!is_floating(logits.dtype()))
    fail("random.categorical",
         std::string("logits must be floating-point, got ") + name_of(logits.dtype()));
  // The Gumbel-max trick, as jax.random.categorical: argmax(logits + G),
  // G = -log(-log(U)), U uniform in (0, 1).
  const Array u = uniform(key, logits.shape(), std::numeric_limits<float>::min(), 1.0, DType::f32,
                          logits.device());
  return argmax(astype(logits, DType::f32) - log(-log(u)), axis);
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
  return apply(Primitive(Op::Random, attrs), {key});
}

Array bernoulli(const Key& key, const Shape& shape, double p, Device device) {
  if (!(p >= 0 && p <= 1))
    fail("random.bernoulli", "p must lie in [0, 1], got " + std::to_string(p));
  return draw(key, shape, RandomKind::Bernoulli, p, 0, DType::bool_, device, "random.bernoulli");
}

}  // namespace kiln::random
