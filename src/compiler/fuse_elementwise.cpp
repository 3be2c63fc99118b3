// kiln compiler: elementwise fusion — chains of f32 (or of bf16) elementwise
// ops become one FusedElementwise kernel — and the pieces the other fusing
// passes share (compiler/fusion.h).
#include <algorithm>
#include <functional>
#include <numeric>
#include <unordered_map>

#include "compiler/fusion.h"
#include "compiler/passes.h"
#include "compiler/rewrite.h"
#include "ops/dispatch.h"
#include "ops/op_facts.h"

namespace kiln::compiler {

bool backend_fuses(const Node& node) {
  const Op op = node.prim->op();
  if (!op_has(op, kFusable)) return false;
  const bool unary = op_kind(op) == OpKind::Unary;
  const bool bf16 = node.dtype == DType::bf16;  // of bf16 operands, rounding its result
  FusedAttrs one{std::vector<FusedRead>(unary ? 1 : 2, FusedRead::Whole),
                 {{op, 0, unary ? -1 : 1, bf16}}};
  const DType dt = bf16 ? DType::bf16 : DType::f32;
  return backend_supports(node.device, Primitive(Op::FusedElementwise, std::move(one)),
                          std::vector<DType>(unary ? 1 : 2, dt), dt);
}

bool read_mode(const Shape& in, const Shape& out, FusedRead& mode) {
  if (in == out) {
    mode = FusedRead::Whole;
    return true;
  }
  if (numel(in) == 1) {
    mode = FusedRead::Scalar;
    return true;
  }
  size_t lead = 0;
  while (lead < in.size() && in[lead] == 1) ++lead;
  Shape tail(in.begin() + lead, in.end());
  if (tail.size() <= out.size() && std::equal(tail.begin(), tail.end(), out.end() - tail.size())) {
    mode = FusedRead::Row;
    return true;
  }
  return false;
}

bool fuses_as_reduction(const ReduceAttrs& ra) {
  if (ra.axes.empty()) return false;
  for (size_t i = 1; i < ra.axes.size(); ++i)
    if (ra.axes[i] != ra.axes[i - 1] + 1) return false;
  return true;
}

bool as_program(const Graph& g, int i, FusedAttrs& out) {
  const Node& node = g.nodes[i];
  if (node.is_input() || node.dtype != DType::f32) return false;
  if (node.prim->op() == Op::FusedElementwise) {
    out = node.prim->attrs<FusedAttrs>();
    return true;
  }
  if (!backend_fuses(node)) return false;
  out = {};
  for (size_t j = 0; j < node.inputs.size(); ++j) {
    const int k = node.inputs[j];
    FusedRead mode;
    if (g.nodes[k].dtype != DType::f32 || !read_mode(g.nodes[k].shape, node.shape, mode))
      return false;
    if (j == 0 || k != node.inputs[0]) out.reads.push_back(mode);  // x * x reads x once
  }
  const int b = node.inputs.size() < 2 ? -1 : node.inputs[1] == node.inputs[0] ? 0 : 1;
  out.program.push_back({node.prim->op(), 0, b});
  return true;
}

std::vector<int> program_inputs(const Graph& g, int i) {
  std::vector<int> ins = g.nodes[i].inputs;
  if (g.nodes[i].prim->op() != Op::FusedElementwise && ins.size() == 2 && ins[0] == ins[1])
    ins.pop_back();
  return ins;
}

namespace {

// An f32 op, or a bf16 op of bf16 operands, that may join a fused chain: the
// program computes in f32 and rounds a bf16 op's result to bf16, as the op
// stores it unfused (a chain's ops share a dtype: elementwise ops keep their
// operands').
bool chainable(const Graph& g, int i) {
  const Node& node = g.nodes[i];
  if (node.is_input() || (node.dtype != DType::f32 && node.dtype != DType::bf16) ||
      !backend_fuses(node))
    return false;
  FusedRead mode;
  for (int k : node.inputs)
    if (g.nodes[k].dtype != node.dtype || !read_mode(g.nodes[k].shape, node.shape, mode))
      return false;
  return true;
}

}  // namespace

Graph duplicate_shared_producers(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const Uses uses(g);
  std::vector<bool> copy(n, false);
  for (int p = 0; p < n; ++p) {
    const Node& node = g.nodes[p];
    if (node.dtype != DType::f32 || uses.is_output[p] || uses.users[p].size() < 2 ||
        !chainable(g, p) || !op_has(node.prim->op(), kOneInstruction))
      continue;
    int large = 0;
    for (int k : node.inputs) large += g.nodes[k].shape == node.shape;
    if (large > 1) continue;
    bool all = true;
    int readers = 0;
    for (size_t a = 0; a < uses.users[p].size() && all; ++a) {
      const int u = uses.users[p][a];
      const Node& un = g.nodes[u];
      if (a > 0 && uses.users[p][a - 1] == u) continue;  // x * x: one reader, one copy
      ++readers;
      if (un.prim->op() == Op::Sum) {
        all = un.dtype == DType::f32 && fuses_as_reduction(un.prim->attrs<ReduceAttrs>());
      } else {
        all = chainable(g, u) && un.shape == node.shape && un.dtype == node.dtype;
      }
    }
    copy[p] = all && readers > 1;
  }
  return rewrite(g, [&](Rewriter& rw, int i) {
    // A copy of P over copies of those of its operands that are copied too
    // (a copied producer's copy reads no stored value either); one copy per
    // value within one op (x * x).
    std::function<int(int, std::vector<std::pair<int, int>>&)> make =
        [&](int p, std::vector<std::pair<int, int>>& made) {
          for (auto& [v, id] : made)
            if (v == p) return id;
          std::vector<int> pins;
          for (int u : g.nodes[p].inputs) pins.push_back(copy[u] ? make(u, made) : rw[u]);
          const int id = rw.add(g.nodes[p].prim, pins, g.nodes[p].shape, g.nodes[p].dtype);
          made.push_back({p, id});
          return id;
        };
    const Node& node = g.nodes[i];
    std::vector<int> ins;
    std::vector<std::pair<int, int>> made;
    for (int p : node.inputs)  // the first reader keeps P
      ins.push_back(copy[p] && uses.users[p].front() != i ? make(p, made) : rw[p]);
    rw.keep_over(i, ins);
  });
}

// Identical instructions of one program (a producer copied for two readers
// that then fused together: BatchNorm's backward computed x - mu and its
// product twice) computed once; the last instruction, the output, stays last.
void merge_repeated_instructions(FusedAttrs& a) {
  const int ni = static_cast<int>(a.reads.size());
  std::vector<int> to(ni + a.program.size());
  std::iota(to.begin(), to.begin() + ni, 0);
  std::vector<FusedInstr> kept;
  for (size_t i = 0; i < a.program.size(); ++i) {
    FusedInstr ins = a.program[i];
    ins.a = to[ins.a];
    if (ins.b >= 0) ins.b = to[ins.b];
    auto same = std::find(kept.begin(), kept.end(), ins);
    if (same != kept.end() && i + 1 < a.program.size()) {
      to[ni + i] = ni + static_cast<int>(same - kept.begin());
      continue;
    }
    kept.push_back(ins);
    to[ni + i] = ni + static_cast<int>(kept.size()) - 1;
  }
  a.program = std::move(kept);
}

Graph fuse_elementwise(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const Uses uses(g);
  auto fusable = [&](int i) { return chainable(g, i); };
  // group[i]: the root (last op) of the chain i belongs to, or -1.
  std::vector<int> group(n, -1);
  std::vector<std::vector<int>> members(n);
  for (int i = 0; i < n; ++i) {
    if (!fusable(i)) continue;
    group[i] = i;
    members[i] = {i};
    for (int k : g.nodes[i].inputs) {
      if (group[k] < 0 || group[k] == i || uses.sole_reader(k) != i ||
          g.nodes[k].shape != g.nodes[i].shape || g.nodes[k].dtype != g.nodes[i].dtype)
        continue;
      int from = group[k];
      for (int m : members[from]) group[m] = i;
      members[i].insert(members[i].end(), members[from].begin(), members[from].end());
      members[from].clear();
    }
  }
  return rewrite_ops(g, [&](int i) -> Emit {
    if (group[i] < 0 || members[group[i]].size() < 2) return {};
    if (group[i] != i) return {Emit::Drop};  // emitted with its root
    const Node& node = g.nodes[i];
    std::vector<int> chain = members[i];
    std::sort(chain.begin(), chain.end());
    FusedAttrs attrs;
    std::vector<int> ext;              // external operands, by input register
    std::unordered_map<int, int> reg;  // node -> register
    auto operand = [&](int k) {
      if (group[k] == i) return reg.at(k);
      auto it = std::find(ext.begin(), ext.end(), k);
      if (it != ext.end()) return static_cast<int>(it - ext.begin());
      ext.push_back(k);
      FusedRead mode;
      read_mode(g.nodes[k].shape, node.shape, mode);
      attrs.reads.push_back(mode);
      return static_cast<int>(ext.size()) - 1;
    };
    std::vector<std::pair<int, std::pair<int, int>>> pending;  // member, operand registers
    for (int m : chain) {
      const Node& mn = g.nodes[m];
      int a = operand(mn.inputs[0]);
      int b = mn.inputs.size() > 1 ? operand(mn.inputs[1]) : -1;
      pending.push_back({m, {a, b}});
      reg[m] = -2 - static_cast<int>(pending.size() - 1);  // instruction index, resolved below
    }
    // Registers: inputs first, then one per instruction.
    int ni = static_cast<int>(ext.size());
    auto resolve = [&](int r) { return r <= -2 ? ni + (-2 - r) : r; };
    for (auto& [m, ab] : pending)
      attrs.program.push_back({g.nodes[m].prim->op(), resolve(ab.first),
                               ab.second == -1 ? -1 : resolve(ab.second),
                               g.nodes[m].dtype == DType::bf16});
    merge_repeated_instructions(attrs);
    return {Emit::Replace, std::make_shared<Primitive>(Op::FusedElementwise, attrs), ext};
  });
}

}  // namespace kiln::compiler
