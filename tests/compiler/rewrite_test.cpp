// Tests of the compiler's shared pieces: the Rewriter, Uses, the graph
// verifier, the per-op fact table and its scalar functions, and the fusion
// passes asking the backend what it runs.
#include <gtest/gtest.h>

#include <cmath>

#include "compiler/executable.h"
#include "compiler/graph.h"
#include "compiler/passes.h"
#include "compiler/rewrite.h"
#include "kiln/kiln.h"
#include "ops/dispatch.h"
#include "ops/op_defs.h"
#include "ops/op_facts.h"
#include "ops/scalar.h"
#include "ops/vjp.h"

namespace kiln {
namespace {

using compiler::Graph;

std::shared_ptr<const Primitive> prim(Op op) {
  return std::make_shared<Primitive>(op);
}

// The error message of f(), or "" when it does not fail.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Graph traced(const VectorFn& f, const std::vector<Shape>& shapes) {
  std::vector<Array> ph, outs, leaves;
  for (auto& s : shapes) ph.push_back(compiler::tracer(s, DType::f32));
  {
    LazyScope lazy;
    outs = f(ph);
  }
  return compiler::capture(outs, leaves);
}

int count_ops(const Graph& g, Op op) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.prim && node.prim->op() == op;
  return n;
}

TEST(Verifier, AcceptsWhatEveryPassMakesOfATrainingStep) {
  auto f = [](const std::vector<Array>& x) {
    auto loss = [](const std::vector<Array>& p) {
      Array h = gelu(matmul(p[0], p[1], {.transpose_b = true}) + p[2]);
      return std::vector<Array>{mean(layer_norm(h, p[3], p[4], 1e-5) * h)};
    };
    return vjp(loss, x, {scalar_like(x[0], 1.0)}).second;
  };
  Graph g = traced(f, {{4, 8}, {6, 8}, {6}, {6}, {6}});
  compiler::verify(g, "tracing");
  for (auto pass : {compiler::fuse_attention, compiler::simplify,
                    compiler::common_subexpression_elimination, compiler::dead_code_elimination,
                    compiler::fuse_layer_norm_residual, compiler::fuse_matmul_epilogue,
                    compiler::fuse_elementwise, compiler::fuse_reductions}) {
    g = pass(g);
    EXPECT_EQ(error_of([&] { compiler::verify(g, "a pass"); }), "");
  }
  EXPECT_GT(count_ops(g, Op::MatmulEpilogue) + count_ops(g, Op::FusedElementwise), 0);
}

TEST(Verifier, NamesThePassAndTheNodeOfABrokenGraph) {
  Graph g;
  int a = g.add_input({2, 3}, DType::f32);
  int b = g.add_input({4}, DType::f32);
  g.add_op(prim(Op::Add), {a, b}, {2, 3}, DType::f32);  // [4] does not broadcast to [2, 3]
  g.outputs = {2};
  std::string e = error_of([&] { compiler::verify(g, "my_pass"); });
  EXPECT_NE(e.find("after my_pass"), std::string::npos) << e;
  EXPECT_NE(e.find("%2"), std::string::npos) << e;
  EXPECT_NE(e.find("cannot broadcast (2,3) and (4)"), std::string::npos) << e;

  Graph h;
  int x = h.add_input({3}, DType::f32);
  h.add_op(prim(Op::Neg), {x, x}, {3}, DType::f32);  // a unary op with two operands
  h.add_op(prim(Op::Exp), {3}, {3}, DType::f32, Device::cpu());  // reads a later value
  h.outputs = {1};
  e = error_of([&] { compiler::verify(h, "p"); });
  EXPECT_NE(e.find("2 operands, expected 1"), std::string::npos) << e;
  h.nodes[1].inputs = {x};
  e = error_of([&] { compiler::verify(h, "p"); });
  EXPECT_NE(e.find("not defined before it"), std::string::npos) << e;

  // A node whose type is not what its definition's shape rule gives.
  Graph m;
  int ma = m.add_input({4, 3}, DType::f32);
  int mb = m.add_input({3, 5}, DType::f32);
  m.add_op(std::make_shared<Primitive>(Op::Matmul, MatmulAttrs{false, false, DType::f32}), {ma, mb},
           {4, 3}, DType::f32);
  m.outputs = {2};
  e = error_of([&] { compiler::verify(m, "p"); });
  EXPECT_NE(e.find("is f32 (4,3) where its shape rule gives f32 (4,5)"), std::string::npos) << e;
  m.nodes[2].shape = {4, 5};
  m.nodes[1].dtype = DType::f64;
  e = error_of([&] { compiler::verify(m, "p"); });
  EXPECT_NE(e.find("operand dtypes differ: f32 (4,3) @ f64 (3,5)"), std::string::npos) << e;
  m.nodes[1].dtype = DType::f32;
  EXPECT_EQ(error_of([&] { compiler::verify(m, "p"); }), "");

  Graph d;
  int c = d.add_input({3}, DType::f32, Device::cpu());
  int gpu = d.add_input({3}, DType::f32, Device{DeviceType::cuda, 0});
  d.add_op(prim(Op::Add), {c, gpu}, {3}, DType::f32);
  d.outputs = {2};
  e = error_of([&] { compiler::verify(d, "p"); });
  EXPECT_NE(e.find("on cuda:0"), std::string::npos) << e;
}

TEST(Rewriter, KeepsInputsAndMapsDroppedValues) {
  Graph g;
  int x = g.add_input({3}, DType::f32);
  int n1 = g.add_op(prim(Op::Neg), {x}, {3}, DType::f32);
  int n2 = g.add_op(prim(Op::Neg), {n1}, {3}, DType::f32);
  int e = g.add_op(prim(Op::Exp), {n2}, {3}, DType::f32);
  g.outputs = {e, x};
  // -(-x) is x: drop both negations, read x instead.
  Graph out = compiler::rewrite(g, [&](compiler::Rewriter& rw, int i) {
    if (i == n1 || i == n2)
      rw.map(i, rw[x]);
    else
      rw.keep(i);
  });
  ASSERT_EQ(out.nodes.size(), 2u);
  EXPECT_EQ(out.nodes[1].prim->op(), Op::Exp);
  EXPECT_EQ(out.nodes[1].inputs, std::vector<int>{0});
  EXPECT_EQ(out.outputs, (std::vector<int>{1, 0}));
  // Dropping an output without a replacement is an error, not a broken graph.
  std::string err = error_of([&] { compiler::rewrite(g, [](compiler::Rewriter&, int) {}); });
  EXPECT_NE(err.find("dropped graph output"), std::string::npos) << err;
}

TEST(Uses, CountsReadersPerOperandSlot) {
  Graph g;
  int x = g.add_input({3}, DType::f32);
  int sq = g.add_op(prim(Op::Mul), {x, x}, {3}, DType::f32);  // reads x twice
  int e = g.add_op(prim(Op::Exp), {sq}, {3}, DType::f32);
  g.outputs = {e};
  compiler::Uses u(g);
  EXPECT_EQ(u.users[x].size(), 2u);
  EXPECT_FALSE(u.read_once(x));
  EXPECT_EQ(u.sole_reader(x), sq);  // one op, two slots
  EXPECT_TRUE(u.read_once(sq));
  EXPECT_EQ(u.sole_reader(e), -1);  // an output
  EXPECT_EQ(u.first_use[x], sq);
  EXPECT_EQ(u.last_use[sq], e);
}

// The fusion passes fuse only what the graph's device's backend says it
// runs: the same graph on a device without a backend keeps every op.
TEST(Passes, FusionAsksTheBackendOfTheGraphsDevice) {
  // The same graph on the cpu and on cuda:3 (tracing needs no GPU).
  auto f = [](const std::vector<Array>& x) {
    return std::vector<Array>{sqrt(abs(matmul(x[0], x[1]) + x[2])) * 2.0 + x[3]};
  };
  Graph cpu = traced(f, {{4, 8}, {8, 6}, {6}, {4, 6}});
  Graph elsewhere = cpu;
  for (auto& n : elsewhere.nodes) n.device = Device{DeviceType::cuda, 3};
  auto fused = [](const Graph& g) {
    return compiler::fuse_elementwise(compiler::fuse_matmul_epilogue(g));
  };
  Graph a = fused(cpu), b = fused(elsewhere);
  // The cpu's epilogue is oneDNN's post-ops: sqrt has none, so it ends the
  // epilogue and the rest becomes one fused elementwise kernel.
  EXPECT_EQ(count_ops(a, Op::MatmulEpilogue), 1);
  EXPECT_EQ(count_ops(a, Op::FusedElementwise), 1);
#ifdef KILN_HAVE_CUDA
  // The CUDA backend's epilogue kernel runs every fusable step: the whole
  // chain joins the GEMM.
  EXPECT_EQ(count_ops(b, Op::MatmulEpilogue), 1);
  EXPECT_EQ(count_ops(b, Op::FusedElementwise), 0);
  for (const auto& n : b.nodes)
    if (n.prim && n.prim->op() == Op::MatmulEpilogue) {
      EXPECT_EQ(n.prim->attrs<EpilogueAttrs>().steps.size(), 5u);
    }
#else
  // Built without the CUDA backend: nothing runs on cuda, nothing fuses.
  ASSERT_FALSE(backend_supports(Device{DeviceType::cuda, 3}, Primitive(Op::Add), {}, DType::f32));
  EXPECT_EQ(count_ops(b, Op::MatmulEpilogue), 0);
  EXPECT_EQ(count_ops(b, Op::FusedElementwise), 0);
  EXPECT_EQ(b.num_ops(), elsewhere.num_ops());
#endif
  for (const auto& n : b.nodes) EXPECT_EQ(n.device, (Device{DeviceType::cuda, 3}));
}

// The cpu backend's GEMM epilogues are oneDNN's post-ops: a step without one
// (a square root) ends the epilogue, where the fact table alone would fuse it.
TEST(Passes, EpilogueStepsAreTheOnesTheBackendRuns) {
  ASSERT_TRUE(op_has(Op::Sqrt, kFusable));
  auto f = [](const std::vector<Array>& x) {
    Array y = matmul(x[0], x[1]);
    y = y + x[2];                  // a post-op
    return std::vector<Array>{sqrt(abs(y))};  // abs is, sqrt is not
  };
  Graph g = compiler::fuse_matmul_epilogue(traced(f, {{2, 4, 8}, {2, 8, 6}, {6}}));
  ASSERT_EQ(count_ops(g, Op::MatmulEpilogue), 1);
  EXPECT_EQ(count_ops(g, Op::Sqrt), 1);
  for (const auto& n : g.nodes)
    if (n.prim && n.prim->op() == Op::MatmulEpilogue) {
      EXPECT_EQ(n.prim->attrs<EpilogueAttrs>().steps.size(), 2u);
    }
}

// Every op the table marks kScalar has its function in ops/scalar.h, and its
// f32 form (the approximations kernels use) agrees with its f64 form.
TEST(OpFacts, EveryScalarOpHasAFunctionThatAgreesInF32AndF64) {
  int scalar_ops = 0;
  for (int i = 0; i < kOpCount; ++i) {
    const Op op = static_cast<Op>(i);
    if (!op_has(op, kScalar)) continue;
    ++scalar_ops;
    for (double x : {-2.5, -0.75, 0.3, 1.7}) {
      const double y = 0.6;
      double d = 0, f = 0;
      visit_scalar(op, "test", [&](auto o) {
        constexpr Op kOp = decltype(o)::value;
        const bool positive =
            op == Op::Log || op == Op::Sqrt || op == Op::Rsqrt || op == Op::Log1p || op == Op::Pow;
        const double in = positive ? std::fabs(x) : x;
        d = static_cast<double>(scalar<kOp>(in, y));
        f = static_cast<double>(scalar<kOp>(static_cast<float>(in), static_cast<float>(y)));
      });
      EXPECT_NEAR(f, d, 2e-6 * std::max(1.0, std::fabs(d))) << op_name(op) << " at " << x;
    }
  }
  EXPECT_EQ(scalar_ops, 34);  // 20 unary, 8 binary, 6 comparisons
  EXPECT_NE(error_of([] { visit_scalar(Op::Matmul, "test", [](auto) {}); }).find("no scalar"),
            std::string::npos);
}

TEST(OpFacts, DerivedPropertiesHoldForEveryRow) {
  for (int i = 0; i < kOpCount; ++i) {
    const Op op = static_cast<Op>(i);
    const OpKind kind = op_kind(op);
    // Fusable ops are scalar and pointwise; scalar ops are the unary,
    // binary and comparison kinds.
    if (op_has(op, kFusable)) {
      EXPECT_TRUE(op_has(op, kScalar | kPointwise)) << op_name(op);
    }
    EXPECT_EQ(op_has(op, kScalar),
              kind == OpKind::Unary || kind == OpKind::Binary || kind == OpKind::Compare)
        << op_name(op);
    // A view is never written in place nor fused.
    if (op_has(op, kAlias)) {
      EXPECT_FALSE(op_has(op, kInPlace) || op_has(op, kFusable));
    }
    if (op_has(op, kIntegers)) {
      EXPECT_EQ(kind, OpKind::Unary) << op_name(op);
    }
    if (op_has(op, kCommutes)) {
      EXPECT_NE(kind, OpKind::Unary) << op_name(op);
    }
  }
  // The VJP-read column is checked against the rules themselves, every row
  // (tests/ops/op_table_test.cpp: VjpReads).
}

// Every primitive has a definition (src/ops/defs/), its operand count fits
// its kind, and it has one type rule; a primitive without a VJP rule fails to
// differentiate with its definition's reason. (The type rules are exercised
// by every op the suite makes: ops.cpp makes its nodes with them, and the
// verifier checks every node of every compiled graph against them.)
TEST(OpDefs, EveryPrimitiveIsDefinedOnce) {
  for (int i = 0; i < kOpCount; ++i) {
    const Op op = static_cast<Op>(i);
    const OpDef& d = op_def(op);
    EXPECT_TRUE(d.defined) << op_name(op);
    const int want = op_kind(op) == OpKind::Unary || op_kind(op) == OpKind::Convert ||
                             op_kind(op) == OpKind::Identity || op_kind(op) == OpKind::Reduce
                         ? 1
                     : op_kind(op) == OpKind::Binary || op_kind(op) == OpKind::Compare ||
                             op_kind(op) == OpKind::Contraction
                         ? 2
                     : op_kind(op) == OpKind::Select ? 3
                                                     : d.arity;
    EXPECT_EQ(d.arity, want) << op_name(op);
    EXPECT_FALSE(d.vjp && d.no_vjp) << op_name(op) << ": a rule and a reason for having none";
    EXPECT_TRUE(!d.infer != !d.check) << op_name(op) << ": needs one type rule, infer or check";
  }
  EXPECT_NE(error_of([] {
              vjp_rule(Primitive(Op::GeluGrad), {Array()}, Array(), Array(), {true});
            }).find("GeluGrad is the backward of another primitive"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
