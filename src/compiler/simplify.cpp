// kiln compiler: the simplifying passes — dead-code elimination, common-
// subexpression elimination and algebraic simplification.
#include <unordered_map>

#include "compiler/passes.h"
#include "compiler/rewrite.h"
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

Graph simplify(const Graph& g) {
  // Work on a copy whose primitives may be replaced (folded).
  Graph w = g;
  std::vector<int> forward = identity_forward(w);
  auto resolve = [&](int i) {
    while (forward[i] != i) i = forward[i];
    return i;
  };
  for (size_t i = 0; i < w.nodes.size(); ++i) {
    Node& n = w.nodes[i];
    if (n.is_input()) continue;
    for (auto& k : n.inputs) k = resolve(k);
    Op op = n.prim->op();
    const Node& src = w.nodes[n.inputs.empty() ? 0 : n.inputs[0]];
    bool same = !n.inputs.empty() && src.shape == n.shape && src.dtype == n.dtype;
    if (op_has(op, kIdentityWhenSame) && same) {
      forward[i] = n.inputs[0];  // an identity
      continue;
    }
    if (op == Op::Cast) {
      // narrow(widen(x)) = x, also through reshapes between them (bf16 mixed
      // precision's VJPs: an op's bf16 gradient widened for the f32 side,
      // then narrowed again for the next bf16 GEMM).
      int widened = n.inputs[0];
      while (!w.nodes[widened].is_input() && w.nodes[widened].prim->op() == Op::Reshape)
        widened = w.nodes[widened].inputs[0];
      const Node& wide = w.nodes[widened];
      if (!wide.is_input() && wide.prim->op() == Op::Cast &&
          w.nodes[wide.inputs[0]].dtype == n.dtype && widens_exactly(n.dtype, wide.dtype)) {
        const int x = wide.inputs[0];
        if (w.nodes[x].shape == n.shape) {
          forward[i] = x;
        } else {
          n.inputs[0] = x;
          n.prim = std::make_shared<Primitive>(Op::Reshape, ShapeAttrs{n.shape});
        }
        continue;
      }
    }
    if (op == Op::Reshape && !src.is_input() && src.prim->op() == Op::Reshape) {
      n.inputs[0] = src.inputs[0];  // reshape(reshape(x)) = reshape(x)
      if (w.nodes[n.inputs[0]].shape == n.shape) forward[i] = n.inputs[0];
      continue;
    }
    if (op == Op::Transpose && !src.is_input() && src.prim->op() == Op::Transpose) {
      const auto& outer = n.prim->attrs<PermAttrs>().perm;
      const auto& inner = src.prim->attrs<PermAttrs>().perm;
      std::vector<int> composed(outer.size());
      bool identity = true;
      for (size_t d = 0; d < outer.size(); ++d) {
        composed[d] = inner[outer[d]];
        identity &= composed[d] == static_cast<int>(d);
      }
      n.inputs[0] = src.inputs[0];
      if (identity)
        forward[i] = n.inputs[0];
      else
        n.prim = std::make_shared<Primitive>(Op::Transpose, PermAttrs{composed});
    }
  }
  return dead_code_elimination(rebuild_forwarded(w, forward));
}


}  // namespace kiln::compiler
