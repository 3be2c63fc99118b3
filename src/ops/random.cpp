// kiln ops: counter-based random numbers (Threefry-2x32, 20 rounds).
#include "kiln/random.h"

#include "kiln/primitive.h"
#include "ops/dispatch.h"

namespace kiln::random {
namespace {

inline uint32_t rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

// Counter-space domains, so that split, fold_in and draws never share a block.
constexpr uint32_t kFoldIn = 0, kSplit = 1;

Key derive(const Key& key, uint32_t domain, uint32_t data) {
  uint32_t in[2] = {domain, data}, out[2];
  threefry2x32(key.k, in, out);
  return Key(out[0], out[1]);
}

Array draw(const Key& key, const Shape& shape, RandomKind kind, double a, double b, DType dtype,
           const char* op) {
  for (auto d : shape)
    if (d < 0) fail(op, "negative dimension in shape " + str(shape));
  if (kind != RandomKind::Bernoulli && !(dtype == DType::f32 || dtype == DType::f64 ||
                                         dtype == DType::bf16))
    fail(op, std::string("dtype must be f32, f64 or bf16, got ") + name_of(dtype));
  RandomAttrs attrs{{key.k[0], key.k[1]}, kind, a, b, shape, dtype};
  return make_array(Primitive(Op::Random, attrs), {}, shape, dtype);
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

std::vector<Key> split(const Key& key, int num) {
  if (num < 1) fail("random.split", "num must be positive, got " + std::to_string(num));
  std::vector<Key> keys;
  for (int i = 0; i < num; ++i) keys.push_back(derive(key, kSplit, static_cast<uint32_t>(i)));
  return keys;
}

Key fold_in(const Key& key, uint32_t data) { return derive(key, kFoldIn, data); }

Array uniform(const Key& key, const Shape& shape, double low, double high, DType dtype) {
  if (!(low < high)) fail("random.uniform", "low must be below high");
  return draw(key, shape, RandomKind::Uniform, low, high, dtype, "random.uniform");
}

Array normal(const Key& key, const Shape& shape, DType dtype) {
  return draw(key, shape, RandomKind::Normal, 0, 1, dtype, "random.normal");
}

Array truncated_normal(const Key& key, const Shape& shape, double lower, double upper,
                       DType dtype) {
  if (!(lower < upper)) fail("random.truncated_normal", "lower must be below upper");
  return draw(key, shape, RandomKind::TruncatedNormal, lower, upper, dtype,
              "random.truncated_normal");
}

Array bernoulli(const Key& key, const Shape& shape, double p) {
  if (!(p >= 0 && p <= 1)) fail("random.bernoulli", "p must lie in [0, 1], got " + std::to_string(p));
  return draw(key, shape, RandomKind::Bernoulli, p, 0, DType::bool_, "random.bernoulli");
}

}  // namespace kiln::random
