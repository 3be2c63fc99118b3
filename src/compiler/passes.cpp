// kiln compiler: DCE, CSE and algebraic simplification.
#include "compiler/passes.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <optional>
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

// Per node: read by exactly one op and not a graph output (a value a fused
// kernel may keep to itself).
std::vector<bool> single_reader(const Graph& g) {
  std::vector<int> users(g.nodes.size(), 0);
  for (const auto& node : g.nodes)
    for (int k : node.inputs) ++users[k];
  std::vector<bool> sole(g.nodes.size());
  for (size_t i = 0; i < sole.size(); ++i) sole[i] = users[i] == 1;
  for (int o : g.outputs) sole[o] = false;
  return sole;
}

// Per node: the ops that read it (one entry per operand slot), and whether
// it is a graph output.
struct Readers {
  std::vector<std::vector<int>> users;
  std::vector<bool> is_output;
  explicit Readers(const Graph& g) : users(g.nodes.size()), is_output(g.nodes.size(), false) {
    for (size_t i = 0; i < g.nodes.size(); ++i)
      for (int k : g.nodes[i].inputs) users[k].push_back(static_cast<int>(i));
    for (int o : g.outputs) is_output[o] = true;
  }
};

// What a fusing pass does with one op: keep it, drop it (it lives on inside a
// fused op emitted elsewhere), or replace it with a new primitive over other
// operands (ids in the old graph).
struct Emit {
  enum Kind { Keep, Drop, Replace } kind = Keep;
  std::shared_ptr<const Primitive> prim = nullptr;
  std::vector<int> inputs = {};
  std::optional<Shape> shape = std::nullopt;  // a replacement's, when not the op's
};

// Rebuilds g in order, asking `decide` about every op; a replacement takes
// the op's place, shape and dtype. A dropped op i with value_of[i] != i is
// read as the (earlier) op value_of[i] from then on.
Graph rewrite(const Graph& g, const std::function<Emit(int)>& decide,
              const std::vector<int>& value_of = {}) {
  Graph out;
  std::vector<int> id(g.nodes.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& node = g.nodes[i];
    if (node.is_input()) {
      id[i] = out.add_input(node.shape, node.dtype);
      continue;
    }
    Emit e = decide(static_cast<int>(i));
    if (e.kind == Emit::Drop) {
      if (!value_of.empty() && value_of[i] != static_cast<int>(i)) id[i] = id[value_of[i]];
      continue;
    }
    const auto& from = e.kind == Emit::Replace ? e.inputs : node.inputs;
    std::vector<int> ins;
    for (int k : from) ins.push_back(id[k]);
    id[i] = out.add_op(e.kind == Emit::Replace ? e.prim : node.prim, ins,
                       e.shape ? *e.shape : node.shape, node.dtype);
  }
  for (int o : g.outputs) out.outputs.push_back(id[o]);
  return out;
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
         (op == Op::Cast && src.dtype == n.dtype)) &&
        same) {
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

bool is_pointwise(Op op) {
  return is_elementwise(op) || op == Op::FusedElementwise;
}

namespace {

bool fusable_op(Op op) {
  switch (op) {
    case Op::Neg:
    case Op::Exp:
    case Op::Log:
    case Op::Sqrt:
    case Op::Rsqrt:
    case Op::Tanh:
    case Op::Erf:
    case Op::Gelu:
    case Op::GeluTanh:
    case Op::GeluGrad:
    case Op::GeluTanhGrad:
    case Op::Relu:
    case Op::Abs:
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Maximum:
    case Op::Minimum: return true;
    default: return false;
  }
}

// How a fused kernel reads an operand of shape `in` for an output of shape `out`.
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

}  // namespace

Graph fuse_elementwise(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const std::vector<bool> sole = single_reader(g);
  auto fusable = [&](int i) {
    const Node& node = g.nodes[i];
    if (node.is_input() || node.dtype != DType::f32 || !fusable_op(node.prim->op())) return false;
    FusedRead mode;
    for (int k : node.inputs)
      if (g.nodes[k].dtype != DType::f32 || !read_mode(g.nodes[k].shape, node.shape, mode))
        return false;
    return true;
  };
  // group[i]: the root (last op) of the chain i belongs to, or -1.
  std::vector<int> group(n, -1);
  std::vector<std::vector<int>> members(n);
  for (int i = 0; i < n; ++i) {
    if (!fusable(i)) continue;
    group[i] = i;
    members[i] = {i};
    for (int k : g.nodes[i].inputs) {
      if (group[k] < 0 || group[k] == i || !sole[k] || g.nodes[k].shape != g.nodes[i].shape)
        continue;
      int from = group[k];
      for (int m : members[from]) group[m] = i;
      members[i].insert(members[i].end(), members[from].begin(), members[from].end());
      members[from].clear();
    }
  }
  return rewrite(g, [&](int i) -> Emit {
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
      attrs.program.push_back(
          {g.nodes[m].prim->op(), resolve(ab.first), ab.second == -1 ? -1 : resolve(ab.second)});
    return {Emit::Replace, std::make_shared<Primitive>(Op::FusedElementwise, attrs), ext};
  });
}

namespace {

bool epilogue_op(Op op, bool& binary, bool& commutes) {
  switch (op) {
    case Op::Add:
    case Op::Mul:
    case Op::Maximum:
    case Op::Minimum: binary = commutes = true; return true;
    case Op::Sub:
    case Op::Div: binary = true, commutes = false; return true;
    case Op::Gelu:
    case Op::GeluTanh:
    case Op::Relu:
    case Op::Tanh:
    case Op::Exp:
    case Op::Abs:
    case Op::Neg: binary = commutes = false; return true;
    default: return false;
  }
}

}  // namespace

Graph fuse_matmul_epilogue(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const Readers readers(g);
  const auto& users = readers.users;
  const auto& is_output = readers.is_output;
  // For each fused matmul: the chain members after it and the attributes.
  std::vector<int> root_of(n, -1);  // chain member -> the matmul it joins
  std::vector<EpilogueAttrs> attrs(n);
  std::vector<std::vector<int>> operands(n);
  std::vector<int> last(n, -1);
  for (int i = 0; i < n; ++i) {
    const Node& mm = g.nodes[i];
    if (mm.is_input() || mm.prim->op() != Op::Matmul || mm.dtype != DType::f32) continue;
    DType in = g.nodes[mm.inputs[0]].dtype;
    if ((in != DType::f32 && in != DType::bf16) || mm.shape.size() < 2 || numel(mm.shape) == 0)
      continue;
    const Node& a = g.nodes[mm.inputs[0]];
    const auto& ma = mm.prim->attrs<MatmulAttrs>();
    if (a.shape[a.shape.size() - (ma.transpose_a ? 2 : 1)] == 0) continue;  // k == 0
    EpilogueAttrs ea{ma, {}};
    int cur = i;
    while (users[cur].size() == 1 && !is_output[cur]) {
      int u = users[cur][0];
      const Node& un = g.nodes[u];
      bool binary, commutes;
      if (root_of[u] >= 0 || un.dtype != DType::f32 || un.shape != mm.shape ||
          !epilogue_op(un.prim->op(), binary, commutes))
        break;
      EpilogueStep st{un.prim->op(), -1, FusedRead::Whole};
      if (binary) {
        int self = un.inputs[0] == cur ? 0 : 1;
        int other = un.inputs[1 - self];
        if (other == cur || (self == 1 && !commutes)) break;
        const Node& on = g.nodes[other];
        const int64_t cols = mm.shape.back();
        if (on.dtype != DType::f32) break;
        if (on.shape == mm.shape)
          st.read = FusedRead::Whole;
        else if (numel(on.shape) == 1)
          st.read = FusedRead::Scalar;
        else if (numel(on.shape) == cols && on.shape.back() == cols)
          st.read = FusedRead::Row;
        else
          break;
        st.operand = static_cast<int>(operands[i].size());
        operands[i].push_back(other);
      }
      ea.steps.push_back(st);
      root_of[u] = i;
      cur = u;
    }
    if (ea.steps.empty()) continue;
    attrs[i] = std::move(ea);
    last[i] = cur;
    root_of[cur] = i;
  }
  // The fused op takes the place of the chain's last member (all its operands
  // exist by then); the matmul and the inner members disappear.
  return rewrite(g, [&](int i) -> Emit {
    if (last[i] >= 0) return {Emit::Drop};  // a fused matmul: emitted at its last member
    int r = root_of[i];
    if (r < 0) return {};
    if (last[r] != i) return {Emit::Drop};  // an inner member
    const Node& mm = g.nodes[r];
    std::vector<int> ins{mm.inputs[0], mm.inputs[1]};
    ins.insert(ins.end(), operands[r].begin(), operands[r].end());
    return {Emit::Replace, std::make_shared<Primitive>(Op::MatmulEpilogue, attrs[r]), ins};
  });
}

namespace {

// An f32 op as a FusedAttrs program over its inputs (a FusedElementwise as it
// is, a fusable op as a one-instruction program); false when it is neither.
bool as_program(const Graph& g, int i, FusedAttrs& out) {
  const Node& node = g.nodes[i];
  if (node.is_input() || node.dtype != DType::f32) return false;
  if (node.prim->op() == Op::FusedElementwise) {
    out = node.prim->attrs<FusedAttrs>();
    return true;
  }
  if (!fusable_op(node.prim->op())) return false;
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

// The operands of op i as as_program numbers its input registers.
std::vector<int> program_inputs(const Graph& g, int i) {
  std::vector<int> ins = g.nodes[i].inputs;
  if (g.nodes[i].prim->op() != Op::FusedElementwise && ins.size() == 2 && ins[0] == ins[1])
    ins.pop_back();
  return ins;
}

}  // namespace

Graph fuse_reductions(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  // Per value: its only reader (one op, perhaps reading it twice), else -1.
  std::vector<int> user(n, -1), readers(n, 0);
  for (int i = 0; i < n; ++i)
    for (int k : g.nodes[i].inputs)
      if (user[k] != i) user[k] = i, ++readers[k];
  for (int k = 0; k < n; ++k)
    if (readers[k] != 1) user[k] = -1;
  for (int o : g.outputs) user[o] = -1;
  // absorbed_by[p] = the Sum that absorbs producer p (its prologue) or
  // consumer p (its epilogue).
  std::vector<int> absorbed_by(n, -1);
  std::vector<FusedReduceAttrs> attrs(n);
  std::vector<std::vector<int>> inputs(n);
  std::vector<bool> fused(n, false);
  std::vector<std::optional<Shape>> out_shape(n);  // when an epilogue read the sum reshaped
  for (int s = 0; s < n; ++s) {
    const Node& sum = g.nodes[s];
    if (sum.is_input() || sum.prim->op() != Op::Sum || sum.dtype != DType::f32) continue;
    const auto& ra = sum.prim->attrs<ReduceAttrs>();
    if (ra.axes.empty()) continue;
    bool contiguous = true;
    for (size_t i = 1; i < ra.axes.size(); ++i) contiguous &= ra.axes[i] == ra.axes[i - 1] + 1;
    if (!contiguous) continue;
    int p = sum.inputs[0];
    const Node& prod = g.nodes[p];
    FusedReduceAttrs fr{{}, prod.shape, ra};
    if (user[p] == s && absorbed_by[p] < 0 && as_program(g, p, fr.body)) {
      inputs[s] = program_inputs(g, p);
      absorbed_by[p] = s;
    } else {
      if (prod.dtype != DType::f32) continue;
      fr.body = FusedAttrs{{FusedRead::Whole}, {}};  // the operand itself
      inputs[s] = {p};
    }
    // The epilogue: the Sum's only reader, elementwise in the Sum's shape
    // (or reading it through a reshape that only it reads, as a bias
    // gradient summed with keepdims is), whose other operands all exist
    // before the Sum (the fused op is emitted in the Sum's place, so the
    // prologue's operands die no later).
    int c = user[s], via = -1;
    if (c >= 0 && !g.nodes[c].is_input() && g.nodes[c].prim->op() == Op::Reshape && user[c] >= 0) {
      via = c;
      c = user[via];
    }
    FusedAttrs epi;
    if (c >= 0 && absorbed_by[c] < 0 && g.nodes[c].shape == g.nodes[via >= 0 ? via : s].shape &&
        as_program(g, c, epi)) {
      const int v = via >= 0 ? via : s;  // the value the epilogue reads
      const std::vector<int> cin = program_inputs(g, c);
      int sum_reg = static_cast<int>(std::find(cin.begin(), cin.end(), v) - cin.begin());
      bool ready = epi.reads[sum_reg] == FusedRead::Whole;
      for (int k : cin) ready &= k == v || k < s;
      if (ready) {
        fr.epilogue = std::move(epi);
        fr.epilogue_sum = sum_reg;
        for (int k : cin)
          if (k != v) inputs[s].push_back(k);
        absorbed_by[c] = s;
        if (via >= 0) {
          absorbed_by[via] = s;
          out_shape[s] = g.nodes[c].shape;
        }
      }
    }
    if (fr.body.program.empty() && fr.epilogue.program.empty()) continue;  // a plain Sum
    attrs[s] = std::move(fr);
    fused[s] = true;
  }
  // The consumer an epilogue absorbed is now the fused op's value.
  std::vector<int> value_of(n);
  for (int i = 0; i < n; ++i) value_of[i] = i;
  for (int i = 0; i < n; ++i)
    if (absorbed_by[i] >= 0 && i > absorbed_by[i]) value_of[i] = absorbed_by[i];
  return rewrite(
      g,
      [&](int i) -> Emit {
        if (absorbed_by[i] >= 0) return {Emit::Drop};  // emitted inside its Sum
        if (!fused[i]) return {};
        return {Emit::Replace, std::make_shared<Primitive>(Op::FusedReduce, attrs[i]), inputs[i],
                out_shape[i]};
      },
      value_of);
}

namespace {

// One hand-written attention found by fuse_attention (old node ids; -1 where
// the graph has no such node).
struct AttentionMatch {
  Op scale = Op::Count;  // Mul or Div by the scalar c, or Count: none (s = s0)
  int q = -1, k = -1, v = -1, c = -1, s0 = -1, s = -1, p = -1, o = -1;  // forward
  int g = -1, dp = -1, dv = -1, t1 = -1, t2 = -1, t3 = -1, ds1 = -1, ds0 = -1, dq = -1, dk = -1;
  bool backward() const { return dv >= 0; }
};

}  // namespace

Graph fuse_attention(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const Readers readers(g);
  const auto& users = readers.users;
  const auto& is_output = readers.is_output;
  auto op_is = [&](int i, Op op) {
    return i >= 0 && !g.nodes[i].is_input() && g.nodes[i].prim->op() == op &&
           g.nodes[i].dtype == DType::f32;
  };
  auto mm = [&](int i, bool ta, bool tb) {
    if (!op_is(i, Op::Matmul)) return false;
    const auto& m = g.nodes[i].prim->attrs<MatmulAttrs>();
    return m.transpose_a == ta && m.transpose_b == tb;
  };
  auto in = [&](int i, size_t j) { return g.nodes[i].inputs[j]; };
  // The other operand of binary op i, one of whose operands is x.
  auto other = [&](int i, int x) {
    const auto& ins = g.nodes[i].inputs;
    if (ins.size() != 2) return -1;
    return ins[0] == x ? ins[1] : ins[1] == x ? ins[0] : -1;
  };
  // i is read only by the ops in `allowed` (and is not an output).
  auto read_only_by = [&](int i, std::initializer_list<int> allowed) {
    if (is_output[i]) return false;
    for (int u : users[i])
      if (std::find(allowed.begin(), allowed.end(), u) == allowed.end()) return false;
    return true;
  };
  std::vector<AttentionMatch> matches;
  for (int o = 0; o < n; ++o) {
    if (!mm(o, false, false) || g.nodes[o].shape.size() != 4) continue;
    AttentionMatch m;
    m.o = o, m.p = in(o, 0), m.v = in(o, 1);
    if (!op_is(m.p, Op::Softmax) || g.nodes[m.p].prim->attrs<AxisAttrs>().axis != 3) continue;
    // The scores: q kᵀ, times or divided by a scalar, or as they are.
    m.s = in(m.p, 0);
    auto scalar = [&](int x) {
      return numel(g.nodes[x].shape) == 1 && g.nodes[x].dtype == DType::f32;
    };
    if (op_is(m.s, Op::Mul)) {
      m.scale = Op::Mul;
      for (int side = 0; side < 2; ++side)
        if (m.c < 0 && scalar(in(m.s, side))) m.c = in(m.s, side), m.s0 = in(m.s, 1 - side);
    } else if (op_is(m.s, Op::Div) && scalar(in(m.s, 1))) {
      m.scale = Op::Div, m.c = in(m.s, 1), m.s0 = in(m.s, 0);
    } else {
      m.s0 = m.s;
    }
    if (m.scale != Op::Count && m.c < 0) continue;
    if (!mm(m.s0, false, true) || g.nodes[m.s].shape != g.nodes[m.s0].shape) continue;
    m.q = in(m.s0, 0), m.k = in(m.s0, 1);
    const Shape& qs = g.nodes[m.q].shape;
    bool ok = qs.size() == 4 && g.nodes[m.k].shape == qs && g.nodes[m.v].shape == qs;
    for (int x : {m.q, m.k, m.v}) ok &= g.nodes[x].dtype == DType::f32;
    if (!ok || (m.s0 != m.s && !read_only_by(m.s0, {m.s})) || !read_only_by(m.s, {m.p}) ||
        is_output[m.p])
      continue;
    // The backward, as autodiff writes it: every other reader of the
    // probabilities must be one of its three ops.
    for (int u : users[m.p]) {
      if (u == o) continue;
      int x = op_is(u, Op::Mul) ? other(u, m.p) : -1;
      if (mm(u, true, false) && in(u, 0) == m.p && m.dv < 0) {
        m.dv = u, m.g = in(u, 1);  // dV = Pᵀ G
      } else if (x >= 0 && op_is(x, Op::Sub) && m.ds1 < 0) {
        m.ds1 = u, m.t3 = x;  // P ⊙ (dP - rowsum)
      } else if (x >= 0 && mm(x, false, true) && m.t1 < 0) {
        m.t1 = u, m.dp = x;  // dP ⊙ P
      } else {
        ok = false;
      }
    }
    if (!ok) continue;
    if (m.dv >= 0 || m.t1 >= 0 || m.ds1 >= 0) {
      ok = m.dv >= 0 && m.t1 >= 0 && m.ds1 >= 0 && in(m.dp, 0) == m.g && in(m.dp, 1) == m.v &&
           users[m.t1].size() == 1 && !is_output[m.t1];
      if (ok) {
        m.t2 = users[m.t1][0];
        ok = op_is(m.t2, Op::Sum) &&
             g.nodes[m.t2].prim->attrs<ReduceAttrs>() == ReduceAttrs{{3}, true} &&
             in(m.t3, 0) == m.dp && in(m.t3, 1) == m.t2 && read_only_by(m.dp, {m.t1, m.t3}) &&
             read_only_by(m.t2, {m.t3}) && read_only_by(m.t3, {m.ds1}) &&
             (m.scale == Op::Count || users[m.ds1].size() == 1) && !is_output[m.ds1];
      }
      if (ok && m.scale == Op::Count) {
        m.ds0 = m.ds1;  // no scale: the softmax VJP feeds the matmul VJPs
      } else if (ok) {
        m.ds0 = users[m.ds1][0];
        ok = (m.scale == Op::Mul
                  ? op_is(m.ds0, Op::Mul) && other(m.ds0, m.ds1) == m.c
                  : op_is(m.ds0, Op::Div) && in(m.ds0, 0) == m.ds1 && in(m.ds0, 1) == m.c) &&
             g.nodes[m.ds0].shape == g.nodes[m.s0].shape && !is_output[m.ds0];
      }
      if (ok)
        for (int u : users[m.ds0]) {
          if (mm(u, false, false) && in(u, 0) == m.ds0 && in(u, 1) == m.k && m.dq < 0)
            m.dq = u;  // dQ = dS k
          else if (mm(u, true, false) && in(u, 0) == m.ds0 && in(u, 1) == m.q && m.dk < 0)
            m.dk = u;  // dK = dSᵀ q
          else
            ok = false;
        }
      if (!ok) continue;
    }
    matches.push_back(m);
  }
  if (matches.empty()) return g;

  // Rebuild: the matched ops' values come from the fused kernels, emitted
  // where the old ops stood; the scores, probabilities and softmax backward
  // are not emitted.
  enum Action { Forward, Backward, DV, DQ, DK };
  std::vector<std::vector<std::pair<Action, int>>> at(n);
  std::vector<bool> skip(n, false);
  for (int mi = 0; mi < static_cast<int>(matches.size()); ++mi) {
    const AttentionMatch& m = matches[mi];
    at[m.o].push_back({Forward, mi});
    for (int x : {m.s0, m.s, m.p}) skip[x] = true;  // (s0 == s without a scale)
    if (!m.backward()) continue;
    at[std::min(m.dv, m.dp)].push_back({Backward, mi});
    at[m.dv].push_back({DV, mi});
    if (m.dq >= 0) at[m.dq].push_back({DQ, mi});
    if (m.dk >= 0) at[m.dk].push_back({DK, mi});
    for (int x : {m.dp, m.t1, m.t2, m.t3, m.ds1, m.ds0}) skip[x] = true;
  }
  Graph out;
  std::vector<int> id(n, -1);
  std::vector<int> qkv(matches.size(), -1);
  std::vector<std::array<int, 3>> grads(matches.size());  // d(q·c), dk, dv as [B, T, H, D]
  auto add = [&](Primitive prim, std::vector<int> ins, Shape shape) {
    return out.add_op(std::make_shared<Primitive>(std::move(prim)), std::move(ins),
                      std::move(shape), DType::f32);
  };
  const std::vector<int> heads_tokens{0, 2, 1, 3};  // [B, H, T, D] <-> [B, T, H, D]
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (node.is_input()) {
      id[i] = out.add_input(node.shape, node.dtype);
      continue;
    }
    bool replaced = false;
    for (auto [action, mi] : at[i]) {
      const AttentionMatch& m = matches[mi];
      const Shape& bhtd = g.nodes[m.q].shape;
      const Shape bthd{bhtd[0], bhtd[2], bhtd[1], bhtd[3]};
      const Shape bt1hd{bthd[0], bthd[1], 1, bthd[2], bthd[3]};
      const Shape bt3hd{bthd[0], bthd[1], 3, bthd[2], bthd[3]};
      auto to_bthd = [&](int x) {
        return add(Primitive(Op::Transpose, PermAttrs{heads_tokens}), {x}, bthd);
      };
      auto to_bhtd = [&](int x) {
        return add(Primitive(Op::Transpose, PermAttrs{heads_tokens}), {x}, bhtd);
      };
      switch (action) {
        case Forward: {
          // (q kᵀ) ∘ c = (q ∘ c) kᵀ for ∘ = · or /: the scale goes into q, so
          // that the kernel needs no constant the graph does not know.
          int qc = to_bthd(id[m.q]);
          if (m.scale != Op::Count) qc = add(Primitive(m.scale), {qc, id[m.c]}, bthd);
          std::vector<int> parts;
          for (int x : {qc, to_bthd(id[m.k]), to_bthd(id[m.v])})
            parts.push_back(add(Primitive(Op::Reshape, ShapeAttrs{bt1hd}), {x}, bt1hd));
          qkv[mi] = add(Primitive(Op::Concatenate, AxisAttrs{2}), parts, bt3hd);
          int a = add(Primitive(Op::Attention, AttentionAttrs{1.0}), {qkv[mi]}, bthd);
          id[i] = to_bhtd(a);
          replaced = true;
          break;
        }
        case Backward: {
          int d = add(Primitive(Op::AttentionGrad, AttentionAttrs{1.0}),
                      {qkv[mi], to_bthd(id[m.g])}, bt3hd);
          for (int j = 0; j < 3; ++j) {
            Shape start{0, 0, j, 0, 0}, stop = bt3hd;
            stop[2] = j + 1;
            int part =
                add(Primitive(Op::Slice, SliceAttrs{start, stop, Shape(5, 1), bt3hd}), {d}, bt1hd);
            grads[mi][j] = add(Primitive(Op::Reshape, ShapeAttrs{bthd}), {part}, bthd);
          }
          break;
        }
        case DV: id[i] = to_bhtd(grads[mi][2]), replaced = true; break;
        case DQ: {  // d(q ∘ c) ∘ c
          int d = grads[mi][0];
          if (m.scale != Op::Count) d = add(Primitive(m.scale), {d, id[m.c]}, bthd);
          id[i] = to_bhtd(d), replaced = true;
          break;
        }
        case DK: id[i] = to_bhtd(grads[mi][1]), replaced = true; break;
      }
    }
    if (replaced || skip[i]) continue;
    std::vector<int> ins;
    for (int k : node.inputs) ins.push_back(id[k]);
    id[i] = out.add_op(node.prim, ins, node.shape, node.dtype);
  }
  for (int o : g.outputs) out.outputs.push_back(id[o]);
  return out;
}

Graph fuse_layer_norm_residual(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const std::vector<bool> sole = single_reader(g);
  std::vector<int> absorbed_by(n, -1), residual(n, -1);  // per LayerNormGrad / per Add
  for (int a = 0; a < n; ++a) {
    const Node& add = g.nodes[a];
    if (add.is_input() || add.prim->op() != Op::Add || add.dtype != DType::f32) continue;
    for (int side = 0; side < 2; ++side) {
      int l = add.inputs[side], r = add.inputs[1 - side];
      const Node& lng = g.nodes[l];
      if (lng.is_input() || lng.prim->op() != Op::LayerNormGrad || lng.dtype != DType::f32 ||
          lng.prim->attrs<NormAttrs>().residual || !sole[l] || absorbed_by[l] >= 0 ||
          g.nodes[r].shape != add.shape || lng.shape != add.shape || g.nodes[r].dtype != DType::f32)
        continue;
      absorbed_by[l] = a;
      residual[a] = r;
      break;
    }
  }
  return rewrite(g, [&](int i) -> Emit {
    if (absorbed_by[i] >= 0) return {Emit::Drop};  // emitted in its Add's place
    if (residual[i] < 0) return {};
    const Node& add = g.nodes[i];
    int l = add.inputs[0] == residual[i] ? add.inputs[1] : add.inputs[0];
    NormAttrs attrs = g.nodes[l].prim->attrs<NormAttrs>();
    attrs.residual = true;
    std::vector<int> ins = g.nodes[l].inputs;
    ins.push_back(residual[i]);
    return {Emit::Replace, std::make_shared<Primitive>(Op::LayerNormGrad, attrs), ins};
  });
}

namespace {

// Ops whose recomputation costs one pass over memory, no more than keeping
// their output: casts (bf16 mixed precision's operands), negation, absolute
// value, ReLU. Not the transcendental ones (GELU's erf, exp, tanh) nor
// LayerNorm (a reduction and a second pass): recomputing the MLP's GELU and
// the LayerNorms in the backward cost vit-small 1.5% of its jit step on AVX2
// (0.08 s of kernel time per step), which made jit slower than eager there,
// for 0.39 GiB less peak memory (bench/results/2026-12-01-avx2-modes-cpu/).
bool cheap_to_recompute(Op op) {
  switch (op) {
    case Op::Neg:
    case Op::Abs:
    case Op::Relu: return true;
    default: return op_kind(op) == OpKind::Convert;
  }
}

}  // namespace

Graph rematerialize(const Graph& g, int gap) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<int> first_use(n, n), last_use(n, -1);
  std::vector<bool> is_output(n, false);
  for (int i = 0; i < n; ++i)
    for (int k : g.nodes[i].inputs) {
      first_use[k] = std::min(first_use[k], i);
      last_use[k] = std::max(last_use[k], i);
    }
  for (int o : g.outputs) is_output[o] = true;
  // late[c] = the values op c reads that are recomputed right before it.
  std::vector<std::vector<int>> late(n);
  for (int v = 0; v < n; ++v) {
    const Node& node = g.nodes[v];
    if (node.is_input() || is_output[v]) continue;
    if (!cheap_to_recompute(node.prim->op())) continue;
    for (int c = first_use[v] + gap; c < n; ++c) {  // the reads far after the first
      const auto& ins = g.nodes[c].inputs;
      if (std::find(ins.begin(), ins.end(), v) == ins.end()) continue;
      // Only where the inputs are live at c anyway (else recomputing would
      // keep them alive instead); graph inputs always are.
      bool live = true;
      for (int u : node.inputs)
        live = live && (g.nodes[u].is_input() || last_use[u] >= c || is_output[u]);
      if (live) late[c].push_back(v);
    }
  }
  Graph out;
  std::vector<int> id(n, -1);
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (node.is_input()) {
      id[i] = out.add_input(node.shape, node.dtype);
      continue;
    }
    std::vector<int> ins;
    for (int k : node.inputs) ins.push_back(id[k]);
    for (int v : late[i]) {
      const Node& vn = g.nodes[v];
      std::vector<int> vins;
      for (int u : vn.inputs) vins.push_back(id[u]);
      int copy = out.add_op(vn.prim, vins, vn.shape, vn.dtype);
      for (size_t j = 0; j < node.inputs.size(); ++j)
        if (node.inputs[j] == v) ins[j] = copy;
    }
    id[i] = out.add_op(node.prim, ins, node.shape, node.dtype);
  }
  for (int o : g.outputs) out.outputs.push_back(id[o]);
  return out;
}

Graph defer_donated_updates(const Graph& g, const std::vector<bool>& donated) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<int> root(n), last_use(n, -1), op_users(n, 0);
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    bool alias =
        !node.is_input() && (node.prim->op() == Op::Reshape || node.prim->op() == Op::StopGradient);
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
    if (node.is_input() || !is_output[i] || op_users[i] || !is_pointwise(node.prim->op())) continue;
    for (int k : node.inputs) {
      int r = root[k];
      if (g.nodes[r].is_input() && donated[g.nodes[r].input_slot] &&
          g.nodes[k].shape == node.shape && last_use[r] > i) {
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
  static const std::pair<const char*, bool PassOptions::*> kSwitches[] = {
      {"no_dce", &PassOptions::dce},
      {"no_cse", &PassOptions::cse},
      {"no_simplify", &PassOptions::simplify},
      {"no_fuse", &PassOptions::fuse},
      {"no_epilogue", &PassOptions::epilogue},
      {"no_reduce", &PassOptions::reduce},
      {"no_norm", &PassOptions::norm},
      {"no_remat", &PassOptions::remat},
      {"no_plan", &PassOptions::plan},
      {"no_inplace", &PassOptions::inplace},
      {"no_attention", &PassOptions::attention}};
  PassOptions o;
  const char* env = std::getenv("KILN_COMPILE");
  if (!env) return o;
  std::stringstream ss(env);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    bool known = false;
    for (auto& [name, flag] : kSwitches)
      if (item == name) o.*flag = false, known = true;
    if (!known) {
      std::string all;
      for (auto& [name, flag] : kSwitches) all += (all.empty() ? "" : ", ") + std::string(name);
      fail("compile", "KILN_COMPILE has '" + item + "', expected a comma-separated list of " + all);
    }
  }
  return o;
}

}  // namespace kiln::compiler
