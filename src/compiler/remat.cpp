// kiln compiler: rematerialization — a cheap op (kCheapRecompute in the fact
// table) read again long after it was made is recomputed before that late
// read instead of being kept.
#include <algorithm>

#include "compiler/passes.h"
#include "compiler/rewrite.h"
#include "ops/op_facts.h"

namespace kiln::compiler {

// Which ops count as cheap (ops/op_facts.h, kCheapRecompute): those whose
// recomputation costs one pass over memory, no more than keeping their
// output — casts (bf16 mixed precision's operands), negation, absolute value,
// ReLU. Not the transcendental ones (GELU's erf, exp, tanh) nor LayerNorm (a
// reduction and a second pass): recomputing the MLP's GELU and the LayerNorms
// in the backward cost vit-small 1.5% of its jit step on AVX2 (0.08 s of
// kernel time per step), which made jit slower than eager there, for 0.39 GiB
// less peak memory (bench/results/2026-12-01-avx2-modes-cpu/).
namespace {

// Whether value v is a graph input, or a reshape or concatenation of them.
bool of_parameters(const Graph& g, int v) {
  const Node& n = g.nodes[v];
  if (n.is_input()) return true;
  const Op op = n.prim->op();
  if (op != Op::Concatenate && op != Op::Reshape) return false;
  for (int k : n.inputs)
    if (!of_parameters(g, k)) return false;
  return true;
}

}  // namespace

Graph rematerialize(const Graph& g, int gap) {
  const int n = static_cast<int>(g.nodes.size());
  const Uses uses(g);
  // late[c] = the values op c reads that are recomputed right before it.
  std::vector<std::vector<int>> late(n);
  for (int v = 0; v < n; ++v) {
    const Node& node = g.nodes[v];
    if (node.is_input() || uses.is_output[v] || !op_has(node.prim->op(), kCheapRecompute)) continue;
    // A cast of a parameter (the graph's input, directly or through
    // concatenations of inputs: the ViT's q, k, v weights) is made once per
    // step and kept: the backward's GEMMs read the same bf16 weight as the
    // forward's, which costs weight-sized memory, not activation-sized.
    if (node.prim->op() == Op::Cast && of_parameters(g, node.inputs[0])) continue;
    for (int c = uses.first_use[v] + gap; c < n; ++c) {  // the reads far after the first
      const auto& ins = g.nodes[c].inputs;
      if (std::find(ins.begin(), ins.end(), v) == ins.end()) continue;
      // Only where the inputs are live at c anyway (else recomputing would
      // keep them alive instead); graph inputs always are.
      bool live = true;
      for (int u : node.inputs)
        live = live && (g.nodes[u].is_input() || uses.last_use[u] >= c || uses.is_output[u]);
      if (live) late[c].push_back(v);
    }
  }
  return rewrite(g, [&](Rewriter& rw, int i) {
    const Node& node = g.nodes[i];
    std::vector<int> ins;
    for (int k : node.inputs) ins.push_back(rw[k]);
    for (int v : late[i]) {
      std::vector<int> vins;
      for (int u : g.nodes[v].inputs) vins.push_back(rw[u]);
      const int copy = rw.add(g.nodes[v].prim, vins, g.nodes[v].shape, g.nodes[v].dtype);
      for (size_t j = 0; j < node.inputs.size(); ++j)
        if (node.inputs[j] == v) ins[j] = copy;
    }
    rw.keep_over(i, ins);
  });
}

}  // namespace kiln::compiler
