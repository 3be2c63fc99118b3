// kiln — counter-based random numbers in JAX's style. A Key is a pure value;
// element i of a draw is a function of (key, i) alone (Threefry-2x32), so
// results do not depend on the thread count or on evaluation order.
#pragma once
#include <cstdint>
#include <vector>

#include "kiln/array.h"

namespace kiln::random {

struct Key {
  uint32_t k[2] = {0, 0};
  Key() = default;
  explicit Key(uint64_t seed) : k{static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(seed)} {}
  Key(uint32_t a, uint32_t b) : k{a, b} {}
  bool operator==(const Key&) const = default;
};

std::vector<Key> split(const Key& key, int num = 2);
Key fold_in(const Key& key, uint32_t data);

// Draws on `device` (the same numbers on every device for the same key).
Array uniform(const Key& key, const Shape& shape, double low = 0.0, double high = 1.0,
              DType dtype = DType::f32, Device device = Device::cpu());
Array normal(const Key& key, const Shape& shape, DType dtype = DType::f32,
             Device device = Device::cpu());
// Standard normal conditioned on [lower, upper] (jax.random.truncated_normal).
Array truncated_normal(const Key& key, const Shape& shape, double lower = -2.0, double upper = 2.0,
                       DType dtype = DType::f32, Device device = Device::cpu());
Array bernoulli(const Key& key, const Shape& shape, double p = 0.5,
                Device device = Device::cpu());  // bool
// Gamma(a, 1) (jax.random.gamma): Marsaglia and Tsang's rejection, each
// element from a Threefry stream of its own.
Array gamma(const Key& key, const Shape& shape, double a, DType dtype = DType::f32,
            Device device = Device::cpu());
// Beta(a, b) (jax.random.beta): X / (X + Y) of gammas X ~ Γ(a), Y ~ Γ(b)
// drawn from split(key)'s two keys.
Array beta(const Key& key, const Shape& shape, double a, double b, DType dtype = DType::f32,
           Device device = Device::cpu());
// Integers uniform in [low, high) (jax.random.randint), i32: 64 random bits
// an element, the top partial range rejected (no modulo bias).
Array randint(const Key& key, const Shape& shape, int64_t low, int64_t high,
              Device device = Device::cpu());
// An index along `axis` of logits drawn with probabilities softmax(logits)
// (jax.random.categorical: the Gumbel-max trick on uniform draws of the
// logits' shape), i32, on the logits' device.
Array categorical(const Key& key, const Array& logits, int axis = -1);

// A key as an i32[2] array of its bits: a key that a compiled function takes
// as an argument, so that each call draws anew (as JAX passes keys to jit).
Array key_array(const Key& key, Device device = Device::cpu());
// bernoulli(fold_in(key, data), shape, p) for a key held in an array, on the
// key array's device.
Array bernoulli(const Array& key, uint32_t data, const Shape& shape, double p = 0.5);

// Threefry-2x32 with 20 rounds: the block function used by all of the above.
void threefry2x32(const uint32_t key[2], const uint32_t in[2], uint32_t out[2]);

// Fills out[0..n) with a standard normal draw (serial; for data loaders):
// normal(key, {n})'s Threefry blocks and Box-Muller transform computed in
// f32, vectorized, within 1e-6 of normal(key, {n})'s values.
void fill_normal(const Key& key, float* out, int64_t n);
// Elements 2·block and 2·block + 1 of uniform(key, shape)'s draw in [0, 1),
// as doubles on the host: a data set's per-sample draws (shuffles, crops,
// flips), equal to the device's draw of the same key.
void uniform_block(const Key& key, uint64_t block, double out[2]);

}  // namespace kiln::random
