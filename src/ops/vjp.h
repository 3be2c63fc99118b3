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

// Conv's VJP: the cotangents of its input x (of shape `input`) and of its
// weight (of shape `weight`) from dy, one primitive each.
Array conv_grad_input(const Array& dy, const Array& w, const ConvAttrs& attrs, const Shape& input);
Array conv_grad_weight(const Array& x, const Array& dy, const ConvAttrs& attrs,
                       const Shape& weight);
// Pool's VJP: dx from x and dy (PoolGrad).
Array pool_grad(const Array& x, const Array& dy, const PoolAttrs& attrs);

// Cotangents of a primitive's inputs, given its inputs, its output and the
// output's cotangent. Entries are empty where need[i] is false or the input is
// not differentiable (integer indices, comparison operands, ...).
std::vector<Array> vjp_rule(const Primitive& prim, const std::vector<Array>& inputs,
                            const Array& output, const Array& cotangent,
                            const std::vector<bool>& need);

}  // namespace kiln
