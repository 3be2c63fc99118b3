// kiln ops: the per-op facts table — one row per primitive holding every fact
// that the dispatcher, autodiff, the compiler's passes and the memory planner
// ask about an op (fusable as elementwise, a view of its input, safe to run in
// place, cheap to recompute, commutative, which values its VJP rule reads).
// Nothing else keeps a list of ops by property: a switch over ops elsewhere
// is about how one op is computed, never about which ops share a property.
// The math of the ops with a scalar function is in ops/scalar.h.
#pragma once
#include <array>
#include <cstdint>

#include "ops/primitive.h"

namespace kiln {

enum OpFlag : uint32_t {
  // Element i of the output reads element i of each (broadcast) operand only.
  kPointwise = 1u << 0,
  // Its math is a scalar function, written once in ops/scalar.h and used by
  // every kernel that computes the op (eager, fused, GEMM epilogue; every
  // backend).
  kScalar = 1u << 6,
  // A scalar op whose f32 form joins FusedElementwise chains, FusedReduce
  // prologues/epilogues and GEMM epilogues.
  kFusable = 1u << 1,
  // f(a, b) = f(b, a).
  kCommutes = 1u << 2,
  // The output is the input's memory (a view): no kernel writes it.
  kAlias = 1u << 3,
  // The kernel reads operand element i only before it writes output element
  // i, so it may write over a same-shaped, same-dtype operand. FusedReduce
  // is safe for some operands only (in_place_safe decides from attributes).
  kInPlace = 1u << 4,
  // Recomputing the output costs one pass over memory, no more than keeping
  // it: rematerialization may recompute it for a late reader.
  kCheapRecompute = 1u << 5,
  // A unary op defined on integers as well as floats (the others: floats only).
  kIntegers = 1u << 7,
  // The output is the operand itself when their shapes and dtypes agree
  // (simplify drops the op).
  kIdentityWhenSame = 1u << 8,
  // One arithmetic instruction per element: a fused kernel may compute it
  // again rather than read it stored (duplicate_shared_producers); not a
  // transcendental or a division, which would cost more than the read.
  kOneInstruction = 1u << 9,
};

// Which values a primitive's VJP rule reads (beyond shapes and dtypes): its
// inputs (bit i for input i) and its output; nothing for a primitive without
// a rule. Eager differentiation keeps exactly these alive. Checked against
// the rules themselves (tests/ops/op_table_test.cpp: VjpReads).
struct VjpReads {
  uint32_t inputs = ~0u;
  bool output = true;
  bool input(size_t i) const { return i < 32 && (inputs >> i & 1u); }
};

struct OpFacts {
  Op op;
  uint32_t flags;
  VjpReads vjp;
};

namespace facts_detail {
inline constexpr uint32_t P = kPointwise, S = kScalar | kPointwise,
                          F = kFusable | kScalar | kPointwise, C = kCommutes, A = kAlias,
                          I = kInPlace, R = kCheapRecompute, N = kIntegers, Id = kIdentityWhenSame,
                          K = kOneInstruction;
inline constexpr VjpReads kNone{0, false}, kOut{0, true}, kIn0{1, false}, kIn1{2, false},
    kBoth{3, false}, kIn1Out{2, true}, kIn0Out{1, true}, kBothOut{3, true}, kQkvBias{15, false},
    kIn2{4, false};
}  // namespace facts_detail

// clang-format off
inline constexpr std::array<OpFacts, kOpCount> kOpFacts = [] {
  using namespace facts_detail;
  return std::array<OpFacts, kOpCount>{{
    // op                           flags         VJP reads
    {Op::Neg,                       F | I | R | N | K, kNone},
    {Op::Exp,                       F | I,        kOut},
    {Op::Log,                       F | I,        kIn0},
    {Op::Sqrt,                      F | I,        kOut},
    {Op::Rsqrt,                     F | I,        kOut},
    {Op::Tanh,                      F | I,        kOut},
    {Op::Erf,                       F | I,        kIn0},
    {Op::Gelu,                      F | I,        kIn0},
    {Op::GeluTanh,                  F | I,        kIn0},
    {Op::Relu,                      F | I | R | N | K, kOut},
    {Op::Abs,                       F | I | R | N | K, kIn0},
    {Op::GeluGrad,                  F | I,        kNone},   // no VJP rule
    {Op::GeluTanhGrad,              F | I,        kNone},   // no VJP rule
    {Op::Sin,                       F | I,        kIn0},
    {Op::Cos,                       F | I,        kIn0},
    {Op::Log1p,                     F | I,        kIn0},
    {Op::Expm1,                     F | I,        kOut},
    {Op::Sign,                      F | I | R,    kNone},   // zero gradient
    {Op::Floor,                     F | I | R,    kNone},   // zero gradient
    {Op::Round,                     F | I | R,    kNone},   // zero gradient
    {Op::Add,                       F | I | C | K, kNone},
    {Op::Sub,                       F | I | K,    kNone},
    {Op::Mul,                       F | I | C | K, kBoth},
    {Op::Div,                       F | I,        kIn1Out},  // y and the output
    {Op::Maximum,                   F | I | C | K, kBoth},
    {Op::Minimum,                   F | I | C | K, kBoth},
    {Op::Pow,                       F | I,        kBothOut},
    {Op::ReluGrad,                  F | I,        kIn1},   // y
    {Op::Equal,                     S | C,        kNone},
    {Op::NotEqual,                  S | C,        kNone},
    {Op::Less,                      S,            kNone},
    {Op::LessEqual,                 S,            kNone},
    {Op::Greater,                   S,            kNone},
    {Op::GreaterEqual,              S,            kNone},
    {Op::Where,                     P | I,        kIn0},   // the condition
    {Op::Cast,                      P | R | Id,   kNone},
    {Op::StopGradient,              A | Id,       kNone},
    {Op::Sum,                       0,            kNone},
    {Op::Max,                       0,            kIn0Out},
    {Op::Argmax,                    0,            kNone},
    {Op::Cumsum,                    0,            kNone},
    {Op::Argsort,                   0,            kNone},
    {Op::Matmul,                    0,            kBoth},
    {Op::Reshape,                   A | Id,       kNone},
    {Op::Transpose,                 0,            kNone},
    {Op::BroadcastTo,               Id,           kNone},
    {Op::Concatenate,               0,            kNone},
    {Op::Slice,                     0,            kNone},
    {Op::SliceGrad,                 0,            kNone},
    {Op::Take,                      0,            kIn1},   // the indices
    {Op::ScatterAdd,                0,            kIn0},   // the indices
    {Op::OneHot,                    0,            kNone},
    {Op::DynamicSlice,              0,            kIn1},   // the starts
    {Op::DynamicUpdateSlice,        I,            kIn2},   // the starts
    {Op::Softmax,                   0,            kOut},
    {Op::LogSoftmax,                0,            kOut},
    {Op::LayerNorm,                 0,            kBoth},  // x and gamma, not beta
    {Op::LayerNormGrad,             0,            kNone},   // no VJP rule
    {Op::SoftmaxCrossEntropy,       0,            kBoth},
    {Op::SoftmaxCrossEntropyGrad,   0,            kNone},   // no VJP rule
    {Op::Attention,                 0,            kIn0},
    {Op::AttentionGrad,             0,            kNone},   // no VJP rule
    {Op::LayerNormParamGrad,        0,            kNone},   // no VJP rule
    {Op::Sdpa,                      0,            kQkvBias},
    {Op::SdpaGrad,                  0,            kNone},   // no VJP rule
    {Op::Conv,                      0,            kBoth},
    {Op::ConvGradInput,             0,            kNone},   // no VJP rule
    {Op::ConvGradWeight,            0,            kNone},   // no VJP rule
    {Op::Pool,                      0,            kIn0},   // max: x (its output recomputed)
    {Op::PoolGrad,                  0,            kNone},   // no VJP rule
    {Op::FusedElementwise,          P | I,        kNone},   // no VJP rule
    {Op::MatmulEpilogue,            0,            kNone},   // no VJP rule
    {Op::FusedReduce,               I,            kNone},   // some operands: in_place_safe
    {Op::Random,                    0,            kNone},
    {Op::Copy,                      0,            kNone},
    {Op::Fill,                      0,            kNone},
    {Op::AllReduceStart,            0,            kNone},
    {Op::AllReduceWait,             0,            kNone},
  }};
}();
// clang-format on

constexpr bool facts_in_op_order() {
  for (int i = 0; i < kOpCount; ++i)
    if (kOpFacts[i].op != static_cast<Op>(i)) return false;
  return true;
}
static_assert(facts_in_op_order(), "kOpFacts: one row per Op, in the order of KILN_OPS");

constexpr const OpFacts& op_facts(Op op) {
  return kOpFacts[static_cast<int>(op)];
}
constexpr bool op_has(Op op, uint32_t flag) {
  return (op_facts(op).flags & flag) == flag;
}
inline VjpReads vjp_reads(Op op) {
  return op_facts(op).vjp;
}

// The operand slot of dy in LayerNormGrad (x, [gamma,] dy, [residual]) or
// LayerNormParamGrad (x, dy) with `inputs` operands; SIZE_MAX for other ops.
size_t layer_norm_dy_slot(const Primitive& prim, size_t inputs);

// Whether `prim`'s kernel may write its output over its input j (of the
// output's shape and dtype): kInPlace, and for FusedReduce only an epilogue
// operand read whole (the epilogue reads each chunk before it stores the
// chunk's sums). The caller still checks that no other operand shares j's
// buffer.
bool in_place_safe(const Primitive& prim, size_t j);

}  // namespace kiln
