// kiln compiler: the simplifying passes — dead-code elimination, common-
// subexpression elimination and algebraic simplification.
#include <algorithm>
#include <unordered_map>

#include "compiler/fusion.h"
#include "compiler/passes.h"
#include "compiler/rewrite.h"
#include "compiler/rules.h"
#include "ops/op_facts.h"

namespace kiln::compiler {
namespace {

std::vector<int> identity_forward(const Graph& g) {
  std::vector<int> f(g.nodes.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<int>(i);
  return f;
}

// g with every op i whose forward[i] != i replaced by (read as) the earlier
// op it forwards to, through chains of forwards.
Graph rebuild_forwarded(const Graph& g, const std::vector<int>& forward) {
  return rewrite(g, [&](Rewriter& rw, int i) {
    int r = i;
    while (forward[r] != r) r = forward[r];
    if (r != i)
      rw.map(i, rw[r]);
    else
      rw.keep(i);
  });
}

// Whether every value of `from` is a value of `to` (so casting there and
// back is the identity).
bool widens_exactly(DType from, DType to) {
  switch (from) {
    case DType::bf16: return to == DType::bf16 || to == DType::f32 || to == DType::f64;
    case DType::f32: return to == DType::f32 || to == DType::f64;
    case DType::i32: return to == DType::i32 || to == DType::i64 || to == DType::f64;
    default: return from == to;
  }
}

}  // namespace

Graph dead_code_elimination(const Graph& g) {
  std::vector<bool> live(g.nodes.size(), false);
  for (int o : g.outputs) live[o] = true;
  for (size_t i = g.nodes.size(); i-- > 0;)
    if (live[i])
      for (int k : g.nodes[i].inputs) live[k] = true;
  return rewrite(g, [&](Rewriter& rw, int i) {
    if (live[i]) rw.keep(i);
  });
}

Graph common_subexpression_elimination(const Graph& g) {
  std::vector<int> forward = identity_forward(g);
  std::unordered_multimap<size_t, int> seen;
  auto resolve = [&](int i) {
    while (forward[i] != i) i = forward[i];
    return i;
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.is_input()) continue;
    std::vector<int> ins;
    size_t h = n.prim->hash();
    for (int k : n.inputs) {
      ins.push_back(resolve(k));
      h = h * 31 + static_cast<size_t>(ins.back());
    }
    auto range = seen.equal_range(h);
    for (auto it = range.first; it != range.second; ++it) {
      const Node& m = g.nodes[it->second];
      std::vector<int> mins;
      for (int k : m.inputs) mins.push_back(resolve(k));
      if (mins == ins && *m.prim == *n.prim && m.shape == n.shape && m.dtype == n.dtype) {
        forward[i] = it->second;
        break;
      }
    }
    if (forward[i] == static_cast<int>(i)) seen.emplace(h, static_cast<int>(i));
  }
  return rebuild_forwarded(g, forward);
}

namespace {

// The axis along which two SliceGrads' slices lie side by side (unit steps,
// one full shape, the same range on every other axis, one range ending where
// the other starts), or -1.
int adjacent_slices(const Node& a, const Node& b) {
  const auto& sa = a.prim->attrs<SliceAttrs>();
  const auto& sb = b.prim->attrs<SliceAttrs>();
  if (sa.full != sb.full || a.dtype != b.dtype || sa.start.size() != sa.full.size() ||
      sb.start.size() != sb.full.size())
    return -1;
  int axis = -1;
  for (size_t d = 0; d < sa.full.size(); ++d) {
    if (sa.step[d] != 1 || sb.step[d] != 1) return -1;
    if (sa.start[d] == sb.start[d] && sa.stop[d] == sb.stop[d]) continue;
    if (axis >= 0 || (sa.stop[d] != sb.start[d] && sb.stop[d] != sa.start[d])) return -1;
    axis = static_cast<int>(d);
  }
  return axis;
}

// The replacement of simplify's "slice-grad sum": the concatenation of the
// two pieces (spliced where one is a concatenation along the same axis),
// and a SliceGrad of it unless it covers the whole array.
int join_slice_grads(Build& b) {
  const Node &na = b.m.node("a"), &nb = b.m.node("b");
  const int ax = adjacent_slices(na, nb);
  const auto& sa = na.prim->attrs<SliceAttrs>();
  const auto& sb = nb.prim->attrs<SliceAttrs>();
  const bool a_first = sa.stop[ax] == sb.start[ax];
  std::vector<int> parts;
  Shape cat = b.m.node("x").shape;
  cat[ax] = 0;
  for (const char* name : {a_first ? "x" : "y", a_first ? "y" : "x"}) {
    const Node& n = b.m.node(name);
    cat[ax] += n.shape[ax];
    if (!n.is_input() && n.prim->op() == Op::Concatenate && n.prim->attrs<AxisAttrs>().axis == ax) {
      for (int k : b.operands_of(name)) parts.push_back(k);
    } else {
      parts.push_back(b(name));
    }
  }
  const DType dt = b.m.root_node().dtype;
  const int joined = b.add(Primitive(Op::Concatenate, AxisAttrs{ax}), std::move(parts), cat, dt);
  SliceAttrs merged = sa;
  merged.start[ax] = std::min(sa.start[ax], sb.start[ax]);
  merged.stop[ax] = std::max(sa.stop[ax], sb.stop[ax]);
  if (cat == sa.full) return joined;
  return b.add(Primitive(Op::SliceGrad, merged), {joined}, sa.full, dt);
}

// simplify's rules. Each makes the graph smaller (or a chain shorter), so
// they reach a fixed point.
std::vector<Rule> simplify_rules() {
  auto same_as_root = [](const std::string& x) {
    return [x](const Match& m) {
      return m.node(x).shape == m.root_node().shape && m.node(x).dtype == m.root_node().dtype;
    };
  };
  // x itself where it has the root's shape, else x reshaped to it.
  auto x_as_root = [](Build& b) {
    const Node& root = b.m.root_node();
    if (b.m.node("x").shape == root.shape) return b("x");
    return b.add(Primitive(Op::Reshape, ShapeAttrs{root.shape}), {b("x")}, root.shape, root.dtype);
  };
  return {
      // A reshape, transpose, broadcast, cast or stop_gradient that changes
      // nothing.
      {"identity",
       op_if([](Op o) { return op_has(o, kIdentityWhenSame); }, {any("x")}),
       same_as_root("x"),
       {},
       [](Build& b) { return b("x"); }},
      // narrow(widen(x)) = x, also through a reshape between them (bf16 mixed
      // precision's VJPs: an op's bf16 gradient widened for the f32 side,
      // then narrowed again for the next bf16 GEMM).
      {"cast pair",
       op(Op::Cast, {either({op(Op::Cast, {any("x")}).named("wide"),
                             op(Op::Reshape, {op(Op::Cast, {any("x")}).named("wide")})})}),
       [](const Match& m) {
         const DType to = m.root_node().dtype;
         return m.node("x").dtype == to && widens_exactly(to, m.node("wide").dtype);
       },
       {},
       x_as_root},
      // f(broadcast_to(x), y) = f(x, y) for a pointwise binary op or
      // comparison whose other operand has the output's shape, where a fused
      // kernel reads x as it is (a row repeated over the leading axes, or a
      // scalar): the broadcast is never stored. (The VJP of a sum over the
      // leading axes broadcasts its cotangent: a BatchNorm's mean's.)
      {"broadcast operand",
       op_if([](Op o) { return op_kind(o) == OpKind::Binary || op_kind(o) == OpKind::Compare; },
             {op(Op::BroadcastTo, {any("x")}).named("bc"), any("y")})
           .commuted(),
       [](const Match& m) {
         const Node& root = m.root_node();
         FusedRead mode;
         return m.node("y").shape == root.shape && m.node("x").dtype == m.node("bc").dtype &&
                m.node("x").shape.size() <= root.shape.size() &&
                read_mode(m.node("x").shape, root.shape, mode);
       },
       {},
       [](Build& b) {
         const Node& root = b.m.root_node();
         const bool first = root.inputs[0] == b.m["bc"];
         std::vector<int> in = first ? std::vector<int>{b("x"), b("y")}
                                     : std::vector<int>{b("y"), b("x")};
         return b.add(*root.prim, std::move(in), root.shape, root.dtype);
       }},
      // SliceGrad(x) + SliceGrad(y) = SliceGrad(concatenate(x, y)) for
      // slices side by side (adjacent_slices): the VJP of an array split in
      // pieces, as GPT-2's q, k and v from one projection, writes each value
      // once where each piece's SliceGrad wrote the whole array (mostly
      // zeros) and adds read them all. A concatenation along the same axis
      // among the pieces is spliced in, and a SliceGrad that covers its
      // whole array is the concatenation itself. Values are unchanged (x + 0
      // is x, but for the sign of a zero).
      {"slice-grad sum",
       op(Op::Add,
          {op(Op::SliceGrad, {any("x")}).named("a"), op(Op::SliceGrad, {any("y")}).named("b")}),
       [](const Match& m) {
         return m.root_node().shape == m.node("a").shape &&
                m.root_node().dtype == m.node("a").dtype &&
                adjacent_slices(m.node("a"), m.node("b")) >= 0;
       },
       {"a", "b"},
       join_slice_grads},
      // reshape(reshape(x)) = reshape(x)
      {"reshape pair", op(Op::Reshape, {op(Op::Reshape, {any("x")})}), nullptr, {}, x_as_root},
      // transpose(transpose(x)) = one transpose (or x)
      {"transpose pair",
       op(Op::Transpose, {op(Op::Transpose, {any("x")}).named("inner")}),
       nullptr,
       {},
       [](Build& b) {
         const auto& outer = b.m.root_node().prim->attrs<PermAttrs>().perm;
         const auto& inner = b.m.node("inner").prim->attrs<PermAttrs>().perm;
         std::vector<int> composed(outer.size());
         bool identity = true;
         for (size_t d = 0; d < outer.size(); ++d) {
           composed[d] = inner[outer[d]];
           identity &= composed[d] == static_cast<int>(d);
         }
         if (identity) return b("x");
         const Node& root = b.m.root_node();
         return b.add(Primitive(Op::Transpose, PermAttrs{composed}), {b("x")}, root.shape,
                      root.dtype);
       }},
  };
}

}  // namespace

Graph simplify(const Graph& g) {
  static const std::vector<Rule> rules = simplify_rules();
  return dead_code_elimination(apply_rules(g, rules, "simplify"));
}

}  // namespace kiln::compiler
