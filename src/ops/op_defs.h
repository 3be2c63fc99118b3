// kiln ops: what defines each primitive beyond its row of the fact table
// (op_facts.h): how many operands it takes and its VJP rule, written together
// per family of primitives in src/ops/defs/ (elementwise.cpp, reductions.cpp,
// layout.cpp, nn.cpp, collectives.cpp, compiler_made.cpp). Nothing else keeps
// a switch over ops for these: autodiff (vjp_rule) and the graph verifier
// (operand_count) read the definitions.
#pragma once
#include <array>
#include <vector>

#include "kiln/array.h"
#include "kiln/primitive.h"

namespace kiln {

// What a VJP rule is given: the primitive, its inputs, its output, the
// output's cotangent, and which inputs' cotangents are wanted.
struct VjpArgs {
  const Primitive& p;
  const std::vector<Array>& in;
  const Array& out;
  const Array& g;
  const std::vector<bool>& need;
  bool want(size_t i) const { return i < need.size() && need[i]; }
};
// Sets ct[i] (ct has one empty entry per input) for the wanted inputs that
// have a cotangent; the values it reads are the op's VjpReads (op_facts.h,
// checked against the rules by tests/ops/op_table_test.cpp).
using VjpFn = void (*)(const VjpArgs& a, std::vector<Array>& ct);

struct OpDef {
  bool defined = false;
  // Operands: `arity`, or arity_of(p) where it depends on the attributes;
  // -1 (and no arity_of) for any number.
  int arity = -1;
  int (*arity_of)(const Primitive& p) = nullptr;
  // The VJP rule; null for a primitive whose inputs get no cotangent
  // (comparisons, indices, sources, StopGradient)...
  VjpFn vjp = nullptr;
  // ... unless it cannot be differentiated at all: then differentiating it
  // fails, saying this after the op's name.
  const char* no_vjp = nullptr;
};

using OpDefs = std::array<OpDef, kOpCount>;

// The definition of `op` (every op has one: the table fails to build
// otherwise, naming the op).
const OpDef& op_def(Op op);
// The number of operands p takes, or -1 for any number.
int operand_count(const Primitive& p);

// Each family's definitions (src/ops/defs/).
namespace defs {
void elementwise(OpDefs& d);
void reductions(OpDefs& d);
void layout(OpDefs& d);
void nn(OpDefs& d);
void collectives(OpDefs& d);
void compiler_made(OpDefs& d);
}  // namespace defs

}  // namespace kiln
