// kiln compiler: the passes that fold ops into their producer — GEMM
// epilogues (bias, scaling, residual, activation after a matmul), reductions
// with their elementwise prologue and epilogue, and the residual add into
// LayerNorm's backward.
#include <algorithm>
#include <optional>

#include "compiler/fusion.h"
#include "compiler/passes.h"
#include "compiler/rewrite.h"
#include "ops/dispatch.h"
#include "ops/op_defs.h"
#include "ops/op_facts.h"

namespace kiln::compiler {
Graph fuse_matmul_epilogue(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const Uses uses(g);
  const auto& users = uses.users;
  const auto& is_output = uses.is_output;
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
    const auto& ma = mm.prim->attrs<MatmulAttrs>();
    if (matmul_dims(g.nodes[mm.inputs[0]].shape, g.nodes[mm.inputs[1]].shape, ma.transpose_a,
                    ma.transpose_b, "fuse_matmul_epilogue")
            .k == 0)
      continue;
    EpilogueAttrs ea{ma, {}};
    int cur = i;
    while (users[cur].size() == 1 && !is_output[cur]) {
      int u = users[cur][0];
      const Node& un = g.nodes[u];
      if (root_of[u] >= 0 || un.dtype != DType::f32 || un.shape != mm.shape ||
          !op_has(un.prim->op(), kFusable))
        break;
      const bool binary = op_kind(un.prim->op()) == OpKind::Binary;
      const bool commutes = op_has(un.prim->op(), kCommutes);
      EpilogueStep st{un.prim->op(), -1, FusedRead::Whole};
      int other = -1;
      if (binary) {
        int self = un.inputs[0] == cur ? 0 : 1;
        other = un.inputs[1 - self];
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
      }
      ea.steps.push_back(st);
      // The backend must run the longer epilogue (oneDNN: a post-op per step).
      std::vector<DType> dtypes(2 + operands[i].size() + (binary ? 1 : 0), DType::f32);
      dtypes[0] = dtypes[1] = in;
      if (!backend_supports(mm.device, Primitive(Op::MatmulEpilogue, ea), dtypes, DType::f32)) {
        ea.steps.pop_back();
        break;
      }
      if (binary) operands[i].push_back(other);
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
  return rewrite_ops(g, [&](int i) -> Emit {
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

Graph fuse_reductions(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  // Per value: its only reader (one op, perhaps reading it twice), else -1.
  const Uses uses(g);
  std::vector<int> user(n);
  for (int k = 0; k < n; ++k) user[k] = uses.sole_reader(k);
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
  return rewrite_ops(
      g,
      [&](int i) -> Emit {
        if (absorbed_by[i] >= 0) return {Emit::Drop};  // emitted inside its Sum
        if (!fused[i]) return {};
        return {Emit::Replace, std::make_shared<Primitive>(Op::FusedReduce, attrs[i]), inputs[i],
                out_shape[i]};
      },
      value_of);
}

Graph fuse_layer_norm_residual(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const Uses uses(g);
  std::vector<int> absorbed_by(n, -1), residual(n, -1);  // per LayerNormGrad / per Add
  for (int a = 0; a < n; ++a) {
    const Node& add = g.nodes[a];
    if (add.is_input() || add.prim->op() != Op::Add || add.dtype != DType::f32) continue;
    for (int side = 0; side < 2; ++side) {
      int l = add.inputs[side], r = add.inputs[1 - side];
      const Node& lng = g.nodes[l];
      if (lng.is_input() || lng.prim->op() != Op::LayerNormGrad || lng.dtype != DType::f32 ||
          lng.prim->attrs<NormAttrs>().residual || !uses.read_once(l) || absorbed_by[l] >= 0 ||
          g.nodes[r].shape != add.shape || lng.shape != add.shape || g.nodes[r].dtype != DType::f32)
        continue;
      absorbed_by[l] = a;
      residual[a] = r;
      break;
    }
  }
  return rewrite_ops(g, [&](int i) -> Emit {
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

}  // namespace kiln::compiler
