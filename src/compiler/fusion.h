// kiln compiler: what the fusing passes share — how a fused kernel reads an
// operand, and an op as a fused program.
#pragma once
#include <vector>

#include "compiler/graph.h"

namespace kiln::compiler {

// Whether a value is f32, the dtype the fusing passes fuse (a pattern test).
inline bool is_f32(const Node& n) {
  return n.dtype == DType::f32;
}

// Whether op `node` (an op of the fact table's kFusable set, f32, or bf16 of
// bf16 operands, whose result the program rounds to bf16) may join a fused
// elementwise program on its device: its backend says it runs it.
bool backend_fuses(const Node& node);

// How a fused kernel reads an operand of shape `in` for an output of shape
// `out` (whole, as a scalar, or as a row repeated over the leading axes);
// false when it cannot.
bool read_mode(const Shape& in, const Shape& out, FusedRead& mode);

// Whether a Sum's axes are one contiguous group, the sums FusedReduce
// computes (a prologue fused in, an epilogue after).
bool fuses_as_reduction(const ReduceAttrs& ra);

// An f32 op as a FusedAttrs program over its inputs (a FusedElementwise as it
// is, a fusable op as a one-instruction program); false when it is neither.
bool as_program(const Graph& g, int i, FusedAttrs& out);

// The operands of op i as as_program numbers its input registers.
std::vector<int> program_inputs(const Graph& g, int i);

}  // namespace kiln::compiler
