// kiln compiler: the passes that fold ops into their producer — GEMM
// epilogues (bias, scaling, residual, activation after a matmul), reductions
// with their elementwise prologue and epilogue, and the residual add into
// LayerNorm's backward.
#include <algorithm>
#include <optional>

#include "compiler/fusion.h"
#include "compiler/passes.h"
#include "compiler/rewrite.h"
#include "compiler/rules.h"
#include "ops/dispatch.h"
#include "ops/op_defs.h"
#include "ops/op_facts.h"

namespace kiln::compiler {
namespace {

// The GEMM an epilogue step joins: an f32 Matmul of f32 or bf16 operands
// with a nonempty sum (k > 0), or a MatmulEpilogue already.
bool gemm_with_epilogue(const Graph& g, const Node& mm) {
  if (mm.prim->op() == Op::MatmulEpilogue) return true;
  const DType in = g.nodes[mm.inputs[0]].dtype;
  if ((in != DType::f32 && in != DType::bf16) || mm.shape.size() < 2 || numel(mm.shape) == 0)
    return false;
  const auto& ma = mm.prim->attrs<MatmulAttrs>();
  return matmul_dims(g.nodes[mm.inputs[0]].shape, g.nodes[mm.inputs[1]].shape, ma.transpose_a,
                     ma.transpose_b, "fuse_matmul_epilogue")
             .k > 0;
}

// The GEMM's epilogue with the root's step appended, when the backend runs
// it (oneDNN: a post-op per step).
std::optional<EpilogueAttrs> longer_epilogue(const Match& m) {
  const Node& mm = m.node("mm");
  const Node& root = m.root_node();
  EpilogueAttrs ea = mm.prim->op() == Op::MatmulEpilogue
                         ? mm.prim->attrs<EpilogueAttrs>()
                         : EpilogueAttrs{mm.prim->attrs<MatmulAttrs>(), {}};
  EpilogueStep st{root.prim->op(), -1, FusedRead::Whole};
  const int gemm_operands = static_cast<int>(mm.inputs.size());
  if (m.bound("other")) {
    const Node& on = m.node("other");
    const int64_t cols = mm.shape.back();
    if (m["other"] == m["mm"] || on.dtype != DType::f32) return std::nullopt;
    if (on.shape == mm.shape)
      st.read = FusedRead::Whole;
    else if (numel(on.shape) == 1)
      st.read = FusedRead::Scalar;
    else if (numel(on.shape) == cols && on.shape.back() == cols)
      st.read = FusedRead::Row;
    else
      return std::nullopt;
    st.operand = gemm_operands - 2;
  }
  ea.steps.push_back(st);
  const DType in = m.g.nodes[mm.inputs[0]].dtype;
  std::vector<DType> dtypes(gemm_operands + (m.bound("other") ? 1 : 0), DType::f32);
  dtypes[0] = dtypes[1] = in;
  if (!backend_supports(mm.device, Primitive(Op::MatmulEpilogue, ea), dtypes, DType::f32))
    return std::nullopt;
  return ea;
}

// An f32 elementwise op that reads an f32 GEMM's value (read by it alone)
// joins the GEMM's epilogue; run to a fixed point, the chain grows one step
// per sweep while the running value is read once and the backend runs it.
std::vector<Rule> epilogue_rules() {
  auto fusable = [](OpKind kind, bool commutes) {
    return [=](Op o) {
      return op_has(o, kFusable) && op_kind(o) == kind && (!commutes || op_has(o, kCommutes));
    };
  };
  const Pattern gemm = op_if([](Op o) { return o == Op::Matmul || o == Op::MatmulEpilogue; }, {})
                           .named("mm")
                           .where(is_f32);
  auto when = [](const Match& m) {
    // (read by the root alone: two steps absorbing one GEMM would compute it twice)
    return m.uses.read_once(m["mm"]) && m.root_node().shape == m.node("mm").shape &&
           gemm_with_epilogue(m.g, m.node("mm")) && longer_epilogue(m).has_value();
  };
  auto replace = [](Build& b) {
    std::vector<int> ins = b.operands_of("mm");
    if (b.m.bound("other")) ins.push_back(b("other"));
    const Node& root = b.m.root_node();
    return b.add(Primitive(Op::MatmulEpilogue, *longer_epilogue(b.m)), ins, root.shape, root.dtype);
  };
  return {
      {"unary step", op_if(fusable(OpKind::Unary, false), {gemm}).where(is_f32), when, {}, replace},
      {"binary step",
       either({op_if(fusable(OpKind::Binary, false), {gemm, any("other")}),
               op_if(fusable(OpKind::Binary, true), {any("other"), gemm})})
           .where(is_f32),
       when,
       {},
       replace},
  };
}

// Add(r, LayerNormGrad(...)) (either order) whose LayerNormGrad only it reads.
std::vector<Rule> layer_norm_residual_rules() {
  const Pattern lng = op(Op::LayerNormGrad).named("lng").where([](const Node& n) {
    return is_f32(n) && !n.prim->attrs<NormAttrs>().residual;
  });
  return {{"residual into LayerNormGrad",
           op(Op::Add, {lng, any("r")}).commuted().where(is_f32),
           [](const Match& m) {
             const Shape& shape = m.root_node().shape;
             return m.uses.read_once(m["lng"]) && m.node("lng").shape == shape &&
                    m.node("r").shape == shape && is_f32(m.node("r"));
           },
           {},
           [](Build& b) {
             NormAttrs attrs = b.m.node("lng").prim->attrs<NormAttrs>();
             attrs.residual = true;
             std::vector<int> ins = b.operands_of("lng");
             ins.push_back(b("r"));
             const Node& root = b.m.root_node();
             return b.add(Primitive(Op::LayerNormGrad, attrs), ins, root.shape, root.dtype);
           }}};
}

}  // namespace

Graph fuse_matmul_epilogue(const Graph& g) {
  static const std::vector<Rule> rules = epilogue_rules();
  return apply_rules(g, rules, "fuse_epilogue");
}

Graph fuse_layer_norm_residual(const Graph& g) {
  static const std::vector<Rule> rules = layer_norm_residual_rules();
  return apply_rules(g, rules, "fuse_layer_norm_residual");
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
    if (!fuses_as_reduction(ra)) continue;
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

}  // namespace kiln::compiler
