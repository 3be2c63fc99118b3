// kiln ops: the host-side core of every random draw, which the backends'
// Random kernels (and threefry's device code), the host draws and the data
// sets share. Internal: the public API is kiln/random.h.
#pragma once
#include <cstdint>

#include "kiln/random.h"
#include "ops/primitive.h"

namespace kiln::random {

// The host-side core of every draw: elements 2j and 2j+1 of a draw from `key`
// come from block j. Kernels and data sets share it, so an image filled on the
// host equals random::normal(key, shape) of the same key.
struct DrawSpec {
  uint32_t key[2];  // the draw key: derived from the user's key by draw_key()
  RandomKind kind;
  double a, b;                  // as in RandomAttrs; truncated normal: erf of the bounds
  double lower = 0, upper = 0;  // truncated normal: the bounds, which draws never leave
};
DrawSpec draw_spec(const Key& key, RandomKind kind, double a = 0, double b = 1);
// The spec of a Random primitive's draw: its key, or the bits of the i32[2]
// key array `key_bits` (its input, when it has one), folded as the
// attributes say. Every backend's Random kernel starts here.
DrawSpec draw_spec(const RandomAttrs& attrs, const int32_t* key_bits);
void draw_block(const DrawSpec& spec, uint64_t block, double out[2]);

}  // namespace kiln::random
