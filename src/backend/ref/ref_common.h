// kiln ref backend: what its kernels share — values read into f64 and
// written back in the output's dtype, index arithmetic, and the registration
// functions of each kernel family. Every kernel is the plainest loop that
// computes its primitive: one thread, no libraries, f64 accumulation.
#pragma once
#include <cstdint>
#include <vector>

#include "kiln/array.h"
#include "ops/dispatch.h"
#include "ops/indices.h"
#include "ops/op_facts.h"
#include "ops/primitive.h"
#include "ops/scalar.h"

namespace kiln::ref {

// All of a's elements as f64 (integers and bools exactly, below 2^53).
std::vector<double> load(const Array& a);
// Writes v (one value per element of out) in out's dtype.
void store(ArrayNode& out, const std::vector<double>& v);

// Rounds each value to the nearest of dtype dt (what store() and a load()
// of the stored array would give): the fused kernels round every
// intermediate as the unfused ops store it. (fused.cpp)
void round_to(std::vector<double>& v, DType dt);

// Row-major multi-index of flat index i in shape s, and back.
std::vector<int64_t> unravel(int64_t i, const Shape& s);
int64_t ravel(const std::vector<int64_t>& idx, const Shape& s);
// The flat index into an operand of shape s (broadcast to the output's rank,
// NumPy's rule) at output multi-index out_idx.
int64_t broadcast_index(const std::vector<int64_t>& out_idx, const Shape& s);

void register_elementwise(KernelTable& t);
void register_reduce(KernelTable& t);
void register_matmul(KernelTable& t);
void register_layout(KernelTable& t);
void register_nn(KernelTable& t);
void register_conv(KernelTable& t);
void register_fused(KernelTable& t);
void register_random(KernelTable& t);
void register_transfer(KernelTable& t);

}  // namespace kiln::ref
