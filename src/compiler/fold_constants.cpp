// kiln compiler: folding the ops that read only a jitted function's captured
// constants (compile-time evaluation, as XLA folds closed-over arrays).
#include <cstdio>

#include "compiler/executable.h"
#include "compiler/passes.h"
#include "ops/op_facts.h"

namespace kiln::compiler {
namespace {

int64_t bytes_of(const Node& n) {
  return numel(n.shape) * static_cast<int64_t>(size_of(n.dtype));
}

// An op that may run once, at compile time, when every operand is constant:
// not a source (a draw or a fill makes memory out of nothing) or a
// collective (every rank must take part at run time), and no larger than
// its operands together (a broadcast stays in the graph: it would hold
// its whole result).
bool foldable(const Graph& g, const Node& n) {
  if (n.is_input() || n.inputs.empty()) return false;
  const OpKind kind = op_kind(n.prim->op());
  if (kind == OpKind::Source || kind == OpKind::Collective) return false;
  int64_t in = 0;
  for (int k : n.inputs) in += bytes_of(g.nodes[k]);
  return bytes_of(n) <= in;
}

}  // namespace

FoldedGraph fold_constants(const Graph& g, const std::vector<Array>& constants,
                           const PassOptions& opt) {
  const int n = static_cast<int>(g.nodes.size());
  FoldedGraph f;
  // constant[i]: node i's value is the same on every run. An output is not
  // folded: the caller gets a new array from each call, never a folded
  // value that it could donate.
  std::vector<char> constant(n, 0), output(n, 0);
  for (int o : g.outputs) output[o] = 1;
  for (int i = 0; i < n; ++i) {
    const Node& nd = g.nodes[i];
    if (nd.is_input()) {
      constant[i] = constants[nd.input_slot].valid();
      continue;
    }
    bool all = !output[i] && foldable(g, nd);
    for (int k : nd.inputs) all = all && constant[k];
    constant[i] = all;
  }
  // The values to fold: constant ops that a non-constant op reads.
  std::vector<char> frontier(n, 0), read(n, 0);
  for (int i = 0; i < n; ++i) {
    const Node& nd = g.nodes[i];
    if (nd.is_input() || constant[i]) continue;
    for (int k : nd.inputs) {
      read[k] = 1;
      if (constant[k] && !g.nodes[k].is_input()) frontier[k] = 1;
    }
  }
  for (int o : g.outputs) read[o] = 1;
  std::vector<int> folds;
  for (int i = 0; i < n; ++i)
    if (frontier[i]) folds.push_back(i);
  if (!opt.fold || folds.empty()) {
    f.graph = g;
    for (int s = 0; s < g.num_inputs; ++s) f.from_slot.push_back(s);
    f.value.resize(g.num_inputs);
    return f;
  }

  // Evaluate them once: the constant ops they need, compiled as a graph of
  // their own.
  std::vector<char> need(n, 0);
  for (int i : folds) need[i] = 1;
  for (int i = n - 1; i >= 0; --i)
    if (need[i] && !g.nodes[i].is_input())
      for (int k : g.nodes[i].inputs) need[k] = 1;
  Graph sub;
  std::vector<int> in_sub(n, -1);
  std::vector<Array> sub_inputs;
  for (int i = 0; i < n; ++i)
    if (need[i] && g.nodes[i].is_input()) {
      in_sub[i] = sub.add_input(g.nodes[i].shape, g.nodes[i].dtype, g.nodes[i].device);
      sub_inputs.push_back(constants[g.nodes[i].input_slot]);
    }
  for (int i = 0; i < n; ++i) {
    if (!need[i] || g.nodes[i].is_input()) continue;
    const Node& nd = g.nodes[i];
    std::vector<int> ins;
    for (int k : nd.inputs) ins.push_back(in_sub[k]);
    in_sub[i] = sub.add_op(nd.prim, ins, nd.shape, nd.dtype, nd.device);
    f.folded_ops++;
  }
  for (int i : folds) sub.outputs.push_back(in_sub[i]);
  PassOptions sub_opt = opt;
  sub_opt.remat = false;  // nothing is read late: the graph is one pass
  std::vector<Array> values =
      Executable(sub, std::vector<bool>(sub.num_inputs, false), sub_opt).run(sub_inputs);

  // The graph with the folded values as inputs: the arguments and the
  // constants still read come first (in their order), then the folded values.
  std::vector<int> now(n, -1);
  for (int i = 0; i < n; ++i) {
    const Node& nd = g.nodes[i];
    if (!nd.is_input() || (constants[nd.input_slot].valid() && !read[i])) continue;
    now[i] = f.graph.add_input(nd.shape, nd.dtype, nd.device);
    f.from_slot.push_back(nd.input_slot);
    f.value.emplace_back();
  }
  for (size_t j = 0; j < folds.size(); ++j) {
    const Node& nd = g.nodes[folds[j]];
    now[folds[j]] = f.graph.add_input(nd.shape, nd.dtype, nd.device);
    f.from_slot.push_back(-1);
    f.value.push_back(values[j]);
    f.folded_bytes += bytes_of(nd);
  }
  for (int i = 0; i < n; ++i) {
    const Node& nd = g.nodes[i];
    if (nd.is_input() || constant[i]) continue;
    std::vector<int> ins;
    for (int k : nd.inputs) ins.push_back(now[k]);
    now[i] = f.graph.add_op(nd.prim, ins, nd.shape, nd.dtype, nd.device);
  }
  for (int o : g.outputs) f.graph.outputs.push_back(now[o]);
  if (debug_level() >= 1)
    std::fprintf(
        stderr, "[compile] fold_constants: %d ops on captured constants -> %zu inputs (%.1f MiB)\n",
        f.folded_ops, folds.size(), f.folded_bytes / 1048576.0);
  return f;
}

}  // namespace kiln::compiler
