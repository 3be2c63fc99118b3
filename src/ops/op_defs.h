// kiln ops: what defines each primitive beyond its row of the fact table
// (op_facts.h): how many operands it takes, its shape and dtype rule and its
// VJP rule, written together per family of primitives in src/ops/defs/
// (elementwise.cpp, reductions.cpp, layout.cpp, nn.cpp, conv.cpp, collectives.cpp,
// compiler_made.cpp). Nothing else keeps a switch over ops for these: ops.cpp
// makes its nodes with the shape rules, autodiff runs the VJP rules, and the
// graph verifier (compiler/rewrite.cpp, after tracing and after every pass)
// checks each node's operand count and type against the definitions.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "kiln/array.h"
#include "ops/primitive.h"

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

// A value's type as the shape rules see it (JAX's abstract value).
struct Aval {
  Shape shape;
  DType dtype;
  bool operator==(const Aval&) const = default;
};
std::string str(const Aval& a);  // "f32 (2,3)"

// The shape and dtype rule: the output that p computes from operands of
// these types. It fails (kiln::Error, naming p) when they do not fit p: a
// rank, an extent, a dtype or an attribute out of range.
using InferFn = Aval (*)(const Primitive& p, const std::vector<Aval>& in);
// For the few primitives whose output type neither the operands nor the
// attributes fix (Fill, AllReduceWait, and the fused programs, whose output
// may be any reshape of theirs): a check of the given output that fails as
// InferFn does.
using CheckFn = void (*)(const Primitive& p, const std::vector<Aval>& in, const Aval& out);

using FallbackFn = Array (*)(const Primitive& p, const std::vector<Array>& in, const Aval& out);

struct OpDef {
  bool defined = false;
  // Operands: `arity`, or arity_of(p) where it depends on the attributes;
  // -1 (and no arity_of) for any number.
  int arity = -1;
  int (*arity_of)(const Primitive& p) = nullptr;
  // The type rule: infer, or check (every op has exactly one).
  InferFn infer = nullptr;
  CheckFn check = nullptr;
  // The compiler's fuse_casts may have the op write bf16 where infer says
  // f32 (the producer writes the bf16 that a cast after it would make).
  bool narrows_to_bf16 = false;
  // The VJP rule; null for a primitive whose inputs get no cotangent
  // (comparisons, indices, sources, StopGradient)...
  VjpFn vjp = nullptr;
  // ... unless it cannot be differentiated at all: then differentiating it
  // fails, saying this after the op's name.
  const char* no_vjp = nullptr;
  // A fused primitive's value made of basic primitives (the `out` type is the
  // node's; the result may be wider, f32 for bf16, and is converted as it is
  // stored). A backend without the fused kernel runs it (ops/dispatch.h:
  // run_kernel_with), and the tests check every backend's kernel against it.
  FallbackFn fallback = nullptr;
};

using OpDefs = std::array<OpDef, kOpCount>;

// The definition of `op` (every op has one: the table fails to build
// otherwise, naming the op).
const OpDef& op_def(Op op);
// The number of operands p takes, or -1 for any number.
int operand_count(const Primitive& p);
// The type of p's output on operands `in` by its definition's rule; fails
// (kiln::Error) where they do not fit, or where the output type is not fixed
// by them (a primitive with a CheckFn).
Aval infer_type(const Primitive& p, const std::vector<Aval>& in);
// What is wrong with a node of p typed `out` on operands `in` by the
// definition's rule (its arity included), or "" when nothing.
std::string check_type(const Primitive& p, const std::vector<Aval>& in, const Aval& out);

// A matmul's dimensions from its operands' shapes: op(a) is [batch_a..., m, k]
// and op(b) [batch_b..., k, n]; the batch dimensions are equal, or one
// operand has rank 2 and is shared by every batch. Fails (naming `who`)
// where the shapes do not fit.
// A GEMM's dimensions: C (m x n) = op(A) (m x k) · op(B) (k x n), A and/or B
// transposed (ta, tb), per batch; what every backend's GEMM set-up starts from.
struct GemmDims {
  int64_t m = 0, n = 0, k = 0;
  int64_t batch_a = 1, batch_b = 1;  // the product of each operand's batch dimensions
  bool ta = false, tb = false;
  bool operator==(const GemmDims&) const = default;
};
struct MatmulDims : GemmDims {
  Shape out;  // [batch..., m, n]
};
MatmulDims matmul_dims(const Shape& a, const Shape& b, bool transpose_a, bool transpose_b,
                       const char* who);

// Each family's definitions (src/ops/defs/).
namespace defs {
void elementwise(OpDefs& d);
void reductions(OpDefs& d);
void layout(OpDefs& d);
void nn(OpDefs& d);
void conv(OpDefs& d);
void collectives(OpDefs& d);
void compiler_made(OpDefs& d);
}  // namespace defs

}  // namespace kiln
