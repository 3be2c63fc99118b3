// Tests of the declarative rewrite engine (compiler/rules.h): patterns bind
// and unify names, try alternatives and operand orders and look at readers;
// rules run bottom-up to a fixed point; a rule fires only where what it says
// dies does; replacements share the ops they make; a broken rule set is a
// clear error.
#include <gtest/gtest.h>

#include <map>

#include "compiler/graph.h"
#include "compiler/passes.h"
#include "compiler/rules.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

using compiler::any;
using compiler::Build;
using compiler::either;
using compiler::Graph;
using compiler::Match;
using compiler::op;
using compiler::Pattern;
using compiler::Rule;

std::shared_ptr<const Primitive> prim(Op o) {
  return std::make_shared<Primitive>(o);
}

int count_ops(const Graph& g, Op o) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.prim && node.prim->op() == o;
  return n;
}

// The bindings of `p` matched at node v of g, with the root as "root"
// (empty: no match).
std::map<std::string, int> bindings(const Graph& g, const Pattern& p, int v) {
  std::map<std::string, int> out;
  Rule probe{"probe", p.named("root"), [&](const Match& m) {
               if (m.root == v && out.empty())
                 for (const auto& [name, id] : m.bindings) out[*name] = id;
               return false;  // never fires
             }};
  compiler::apply_rules(g, {probe}, "probe");
  return out;
}

// -(-x) = x
Rule double_negation() {
  return {"double negation", op(Op::Neg, {op(Op::Neg, {any("x")})}), nullptr, {}, [](Build& b) {
            return b("x");
          }};
}

TEST(Rules, NamesBoundTwiceMustBeOneValue) {
  Graph g;
  int a = g.add_input({3}, DType::f32), b = g.add_input({3}, DType::f32);
  int aa = g.add_op(prim(Op::Mul), {a, a}, {3}, DType::f32);
  int ab = g.add_op(prim(Op::Mul), {a, b}, {3}, DType::f32);
  const Pattern square = op(Op::Mul, {any("x"), any("x")});
  EXPECT_EQ(bindings(g, square, aa), (std::map<std::string, int>{{"root", aa}, {"x", a}}));
  EXPECT_TRUE(bindings(g, square, ab).empty());
}

TEST(Rules, AlternativesAndOperandOrdersAreTriedUntilTheWholeRuleHolds) {
  Graph g;
  int x = g.add_input({3}, DType::f32), c = g.add_input({1}, DType::f32);
  int cx = g.add_op(prim(Op::Mul), {c, x}, {3}, DType::f32);
  int xc = g.add_op(prim(Op::Div), {x, c}, {3}, DType::f32);
  int cx_div = g.add_op(prim(Op::Div), {c, x}, {1}, DType::f32);
  auto scalar = [](const compiler::Node& n) { return numel(n.shape) == 1; };
  // x · c in either order, or x / c, for a scalar c.
  const Pattern scaled = either({op(Op::Mul, {any("x"), any("c").where(scalar)}).commuted(),
                                 op(Op::Div, {any("x"), any("c").where(scalar)})});
  auto m = bindings(g, scaled, cx);
  EXPECT_EQ(m["x"], x);  // the second order: c is the scalar
  EXPECT_EQ(m["c"], c);
  EXPECT_EQ(bindings(g, scaled, xc)["c"], c);
  EXPECT_TRUE(bindings(g, scaled, cx_div).empty());  // c / x is no scaling of x
}

TEST(Rules, ReadersArePartOfAPattern) {
  Graph g;
  int x = g.add_input({3}, DType::f32);
  int e = g.add_op(prim(Op::Exp), {x}, {3}, DType::f32);
  int l = g.add_op(prim(Op::Log), {x}, {3}, DType::f32);
  (void)e;
  // x's log, where x's exp is taken too.
  const Pattern p = op(Op::Log, {any("x").read_by(op(Op::Exp, {any("x")}).named("e"))});
  EXPECT_EQ(bindings(g, p, l)["e"], e);
  const Pattern q = op(Op::Log, {any("x").read_by(op(Op::Sin, {any("x")}))});
  EXPECT_TRUE(bindings(g, q, l).empty());
}

TEST(Rules, RunToAFixedPointBottomUp) {
  for (int negations : {4, 5}) {
    Graph g;
    int x = g.add_input({3}, DType::f32);
    int v = x;
    for (int i = 0; i < negations; ++i) v = g.add_op(prim(Op::Neg), {v}, {3}, DType::f32);
    g.outputs = {v};
    Graph out = compiler::apply_rules(g, {double_negation()}, "test");
    EXPECT_EQ(count_ops(out, Op::Neg), negations % 2) << out.str();
    EXPECT_EQ(out.num_ops(), static_cast<size_t>(negations % 2));
  }
}

TEST(Rules, FireOnlyWhereWhatTheySayDiesDoes) {
  // exp(x) * y becomes x + y (a stand-in for a fused kernel that reads x and
  // y), which pays only when exp(x) is then dead.
  Rule fuse{"fuse exp",
            op(Op::Mul, {op(Op::Exp, {any("x")}).named("e"), any("y")}),
            nullptr,
            {"e"},
            [](Build& b) {
              const auto& root = b.m.root_node();
              return b.add(Primitive(Op::Add), {b("x"), b("y")}, root.shape, root.dtype);
            }};
  for (int extra_reader : {0, 1, 2}) {  // none, a Sin, the output
    Graph g;
    int x = g.add_input({3}, DType::f32), y = g.add_input({3}, DType::f32);
    int e = g.add_op(prim(Op::Exp), {x}, {3}, DType::f32);
    int m = g.add_op(prim(Op::Mul), {e, y}, {3}, DType::f32);
    g.outputs = {m};
    if (extra_reader == 1) g.outputs.push_back(g.add_op(prim(Op::Sin), {e}, {3}, DType::f32));
    if (extra_reader == 2) g.outputs.push_back(e);
    Graph out = compiler::apply_rules(g, {fuse}, "test");
    EXPECT_EQ(count_ops(out, Op::Add), extra_reader == 0 ? 1 : 0) << out.str();
  }
  // A value may die through another match: two products of one exp, each
  // replaced, both fire.
  Graph g;
  int x = g.add_input({3}, DType::f32), y = g.add_input({3}, DType::f32);
  int e = g.add_op(prim(Op::Exp), {x}, {3}, DType::f32);
  g.outputs = {g.add_op(prim(Op::Mul), {e, y}, {3}, DType::f32),
               g.add_op(prim(Op::Mul), {e, x}, {3}, DType::f32)};
  Graph out = compiler::apply_rules(g, {fuse}, "test");
  EXPECT_EQ(count_ops(out, Op::Add), 2) << out.str();
  EXPECT_EQ(count_ops(out, Op::Exp), 0) << out.str();
}

TEST(Rules, ReplacementsShareTheOpsTheyMake) {
  // Two sines of one value, each rewritten as cos(x - h): the Sub and the
  // Cos are made once, and both outputs read the one Cos.
  Graph g;
  int x = g.add_input({3}, DType::f32), h = g.add_input({1}, DType::f32);
  int s1 = g.add_op(prim(Op::Sin), {x}, {3}, DType::f32);
  int s2 = g.add_op(prim(Op::Sin), {x}, {3}, DType::f32);
  g.outputs = {s1, s2};  // (inputs keep their ids: h is h in the new graph too)
  Rule shift{"sin as cos", op(Op::Sin, {any("x")}), nullptr, {}, [h](Build& b) {
               const auto& root = b.m.root_node();
               int d = b.add(Primitive(Op::Sub), {b("x"), h}, root.shape, root.dtype);
               return b.add(Primitive(Op::Cos), {d}, root.shape, root.dtype);
             }};
  Graph out = compiler::apply_rules(g, {shift}, "test");
  EXPECT_EQ(count_ops(out, Op::Sub), 1) << out.str();
  EXPECT_EQ(count_ops(out, Op::Cos), 1) << out.str();
  EXPECT_EQ(out.outputs[0], out.outputs[1]);
}

TEST(Rules, ABrokenRuleSetIsAClearError) {
  Graph g;
  int x = g.add_input({3}, DType::f32);
  g.outputs = {g.add_op(prim(Op::Neg), {x}, {3}, DType::f32)};
  // A replacement of another shape.
  Rule wrong{"wrong shape", op(Op::Neg, {any("x")}), nullptr, {}, [](Build& b) {
               return b.add(Primitive(Op::Sum, ReduceAttrs{{0}, false}), {b("x")}, {}, DType::f32);
             }};
  std::string err;
  try {
    compiler::apply_rules(g, {wrong}, "test pass");
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("test pass: rule wrong shape replaced %1 ((3) f32) with a value of () f32"),
            std::string::npos)
      << err;
  // A rule that matches its own replacement forever: -x = -(-(-x)).
  Rule grows{"grows", op(Op::Neg, {any("x")}), nullptr, {}, [](Build& b) {
               const auto& root = b.m.root_node();
               int v = b("x");
               for (int i = 0; i < 3; ++i)
                 v = b.add(Primitive(Op::Neg), {v}, root.shape, root.dtype);
               return v;
             }};
  err.clear();
  try {
    compiler::apply_rules(g, {grows}, "test pass");
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("test pass: its rules still fire after 32 sweeps or 1032 nodes (from 2): a "
                     "rule that matches its own replacement?"),
            std::string::npos)
      << err;
}

// An epilogue chain grows from the GEMM that comes first: (A·B + C·D) + E·F
// is one MatmulEpilogue of A·B with two added operands, not two epilogues.
TEST(Rules, EpilogueChainsGrowFromTheirFirstGemm) {
  auto f = [](const std::vector<Array>& x) {
    Array a = matmul(x[0], x[1]), c = matmul(x[0], x[2]), e = matmul(x[0], x[3]);
    return std::vector<Array>{(a + c) + e};
  };
  std::vector<Array> ph, outs, leaves;
  for (int i = 0; i < 4; ++i) ph.push_back(compiler::tracer({4, 4}, DType::f32));
  {
    LazyScope lazy;
    outs = f(ph);
  }
  Graph g = compiler::fuse_matmul_epilogue(compiler::capture(outs, leaves));
  ASSERT_EQ(count_ops(g, Op::MatmulEpilogue), 1) << g.str();
  EXPECT_EQ(count_ops(g, Op::Matmul), 2) << g.str();
  for (const auto& n : g.nodes)
    if (n.prim && n.prim->op() == Op::MatmulEpilogue) {
      EXPECT_EQ(n.prim->attrs<EpilogueAttrs>().steps.size(), 2u);
    }
}

}  // namespace
}  // namespace kiln
