// kiln ops: the VJP rule of every primitive.
#pragma once
#include <vector>

#include "kiln/array.h"
#include "ops/op_facts.h"  // vjp_reads: which values each rule below reads
#include "ops/primitive.h"

namespace kiln {

// Slice's VJP: g written into zeros of the sliced array's shape (attrs.full),
// one primitive (SliceGrad).
Array slice_grad(const Array& g, const SliceAttrs& attrs);

// Cotangents of a primitive's inputs, given its inputs, its output and the
// output's cotangent. Entries are empty where need[i] is false or the input is
// not differentiable (integer indices, comparison operands, ...).
std::vector<Array> vjp_rule(const Primitive& prim, const std::vector<Array>& inputs,
                            const Array& output, const Array& cotangent,
                            const std::vector<bool>& need);

}  // namespace kiln
