// kiln compiler: DCE, CSE and algebraic simplification.
#include "compiler/passes.h"

#include <cstdlib>
#include <functional>
#include <sstream>
#include <unordered_map>

namespace kiln::compiler {
namespace {

// Rebuilds g keeping the ops for which keep(i) holds, with each op's inputs
// redirected through `forward` (an op replaced by an earlier node).
Graph rebuild(const Graph& g, const std::vector<bool>& keep, const std::vector<int>& forward) {
  Graph out;
  std::vector<int> id(g.nodes.size(), -1);
  auto resolve = [&](int i) {
    while (forward[i] != i) i = forward[i];
    return id[i];
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.is_input()) {
      id[i] = out.add_input(n.shape, n.dtype);
      continue;
    }
    if (!keep[i] || forward[i] != static_cast<int>(i)) continue;
    std::vector<int> ins;
    for (int k : n.inputs) ins.push_back(resolve(k));
    id[i] = out.add_op(n.prim, ins, n.shape, n.dtype);
  }
  for (int o : g.outputs) out.outputs.push_back(resolve(o));
  return out;
}

std::vector<int> identity_forward(const Graph& g) {
  std::vector<int> f(g.nodes.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<int>(i);
  return f;
}

}  // namespace

Graph dead_code_elimination(const Graph& g) {
  std::vector<bool> live(g.nodes.size(), false);
  for (int o : g.outputs) live[o] = true;
  for (size_t i = g.nodes.size(); i-- > 0;)
    if (live[i])
      for (int k : g.nodes[i].inputs) live[k] = true;
  return rebuild(g, live, identity_forward(g));
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
  return rebuild(g, std::vector<bool>(g.nodes.size(), true), forward);
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
    if ((op == Op::StopGradient || op == Op::Reshape || op == Op::BroadcastTo ||
         (op == Op::Cast && src.dtype == n.dtype)) && same) {
      forward[i] = n.inputs[0];  // an identity
      continue;
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
  return dead_code_elimination(rebuild(w, std::vector<bool>(w.nodes.size(), true), forward));
}

Graph defer_donated_updates(const Graph& g, const std::vector<bool>& donated) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<int> root(n), last_use(n, -1), op_users(n, 0);
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    bool alias = !node.is_input() &&
                 (node.prim->op() == Op::Reshape || node.prim->op() == Op::StopGradient);
    root[i] = alias ? root[node.inputs[0]] : i;
    for (int k : node.inputs) {
      last_use[root[k]] = std::max(last_use[root[k]], i);
      ++op_users[k];
    }
  }
  std::vector<bool> is_output(n, false);
  for (int o : g.outputs) is_output[o] = true;
  std::vector<std::vector<int>> after(n);
  std::vector<bool> moved(n, false);
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (node.is_input() || !is_output[i] || op_users[i] || !is_elementwise(node.prim->op())) continue;
    for (int k : node.inputs) {
      int r = root[k];
      if (g.nodes[r].is_input() && donated[g.nodes[r].input_slot] && g.nodes[k].shape == node.shape &&
          last_use[r] > i) {
        after[last_use[r]].push_back(i);
        moved[i] = true;
        break;
      }
    }
  }
  // Emit in the new order, renumbering operands.
  Graph out;
  std::vector<int> id(n, -1);
  std::function<void(int)> emit = [&](int i) {
    const Node& node = g.nodes[i];
    if (node.is_input()) {
      id[i] = out.add_input(node.shape, node.dtype);
    } else {
      std::vector<int> ins;
      for (int k : node.inputs) ins.push_back(id[k]);
      id[i] = out.add_op(node.prim, ins, node.shape, node.dtype);
    }
    for (int j : after[i]) emit(j);
  };
  for (int i = 0; i < n; ++i)
    if (!moved[i]) emit(i);
  for (int o : g.outputs) out.outputs.push_back(id[o]);
  return out;
}

PassOptions PassOptions::from_env() {
  PassOptions o;
  const char* env = std::getenv("KILN_COMPILE");
  if (!env) return o;
  std::stringstream ss(env);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item == "no_dce") o.dce = false;
    else if (item == "no_cse") o.cse = false;
    else if (item == "no_simplify") o.simplify = false;
    else if (item == "no_plan") o.plan = false;
    else if (item == "no_inplace") o.inplace = false;
    else if (!item.empty())
      fail("compile", "KILN_COMPILE has '" + item +
                          "', expected a comma-separated list of no_dce, no_cse, no_simplify, "
                          "no_plan, no_inplace");
  }
  return o;
}

}  // namespace kiln::compiler
