// kiln ops: the VJP rule of every primitive.
#pragma once
#include <vector>

#include "kiln/array.h"
#include "kiln/primitive.h"

namespace kiln {

// Cotangents of a primitive's inputs, given its inputs, its output and the
// output's cotangent. Entries are empty where need[i] is false or the input is
// not differentiable (integer indices, comparison operands, ...).
// Which values a primitive's VJP rule reads (beyond shapes and dtypes): its
// inputs (bit i for input i) and its output. Kept beside vjp_rule; an op not
// listed reads everything.
struct VjpReads {
  uint32_t inputs = ~0u;
  bool output = true;
  bool input(size_t i) const { return i < 32 && (inputs >> i & 1u); }
};
VjpReads vjp_reads(Op op);

std::vector<Array> vjp_rule(const Primitive& prim, const std::vector<Array>& inputs,
                            const Array& output, const Array& cotangent,
                            const std::vector<bool>& need);

}  // namespace kiln
