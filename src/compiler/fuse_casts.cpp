// kiln compiler: casts folded into the kernels beside them — bf16 mixed
// precision's casts between f32 ops and bf16 GEMM operands cost a pass over
// memory each unless the producer writes bf16 or the consumer reads it.
#include <algorithm>
#include <optional>

#include "compiler/fusion.h"
#include "compiler/passes.h"
#include "compiler/rewrite.h"
#include "ops/dispatch.h"
#include "ops/op_facts.h"

namespace kiln::compiler {
namespace {

bool is_cast_to(const Node& n, DType to) {
  return !n.is_input() && n.prim->op() == Op::Cast && n.dtype == to;
}

// The primitive (and operands, old ids) that op i becomes when it reads
// bf16 values in place of their f32 casts and writes `out`; null when op i
// is not a fused program or elementwise op, or its backend cannot.
struct Folded {
  std::shared_ptr<const Primitive> prim;
  std::vector<int> inputs;
};

// The bf16 value that value k widens, directly or through reshapes (which a
// whole read ignores), or -1.
int widened_bf16(const Graph& g, int k) {
  while (!g.nodes[k].is_input() && g.nodes[k].prim->op() == Op::Reshape) k = g.nodes[k].inputs[0];
  const Node& c = g.nodes[k];
  if (!is_cast_to(c, DType::f32) || g.nodes[c.inputs[0]].dtype != DType::bf16) return -1;
  return c.inputs[0];
}

Folded fold(const Graph& g, int i, DType out) {
  const Node& n = g.nodes[i];
  Folded f{n.prim, n.inputs};
  const Op op = n.prim->op();
  if (op == Op::Sum) {
    // A sum over contiguous axes of a widened bf16 value: a FusedReduce whose
    // body reads the bf16 value (the Sum kernel's order, so the same bits).
    const auto& ra = n.prim->attrs<ReduceAttrs>();
    bool contiguous = !ra.axes.empty() && n.dtype == DType::f32 && out == n.dtype;
    for (size_t j = 1; j < ra.axes.size(); ++j) contiguous &= ra.axes[j] == ra.axes[j - 1] + 1;
    const int x = contiguous ? widened_bf16(g, n.inputs[0]) : -1;
    if (x < 0) return {};
    f.prim = std::make_shared<Primitive>(
        Op::FusedReduce,
        FusedReduceAttrs{FusedAttrs{{FusedRead::Whole}, {}}, g.nodes[n.inputs[0]].shape, ra});
    f.inputs = {x};
    if (!backend_supports(n.device, *f.prim, {DType::bf16}, out)) return {};
    return f;
  }
  // The operands that may be read as bf16 in place of their f32 cast: all of
  // a program's; LayerNorm's backward's dy; none of the others'.
  auto widening_read = [&](size_t j) {
    if (op == Op::LayerNormGrad || op == Op::LayerNormParamGrad)
      return j == layer_norm_dy_slot(*n.prim, n.inputs.size());
    return op == Op::FusedElementwise || op == Op::FusedReduce || op_has(op, kFusable);
  };
  if (op == Op::MatmulEpilogue && out != n.dtype) {
    EpilogueAttrs e = n.prim->attrs<EpilogueAttrs>();
    e.mm.out = out;
    f.prim = std::make_shared<Primitive>(Op::MatmulEpilogue, std::move(e));
  } else if (op == Op::Matmul) {
    if (out == n.dtype || g.nodes[n.inputs[0]].dtype != DType::bf16) return {};
    MatmulAttrs m = n.prim->attrs<MatmulAttrs>();
    m.out = out;  // from bf16 operands: f32 sums rounded once
    f.prim = std::make_shared<Primitive>(Op::Matmul, m);
  } else if (op != Op::FusedElementwise && op != Op::FusedReduce && op != Op::LayerNorm &&
             op != Op::LayerNormGrad && op != Op::LayerNormParamGrad && op != Op::MatmulEpilogue &&
             op != Op::SoftmaxCrossEntropyGrad) {
    FusedAttrs program;
    if (!as_program(g, i, program)) return {};
    f.prim = std::make_shared<Primitive>(Op::FusedElementwise, std::move(program));
    f.inputs = program_inputs(g, i);
  }
  // Read a bf16 value where the op read its f32 cast (exact: a cast to f32
  // widens).
  bool changed = out != n.dtype;
  for (size_t j = 0; j < f.inputs.size(); ++j) {
    int& k = f.inputs[j];
    if (widening_read(j) && is_cast_to(g.nodes[k], DType::f32) &&
        g.nodes[g.nodes[k].inputs[0]].dtype == DType::bf16) {
      k = g.nodes[k].inputs[0];
      changed = true;
    }
  }
  if (!changed) return {};
  std::vector<DType> dtypes;
  for (int k : f.inputs) dtypes.push_back(g.nodes[k].dtype);
  if (!backend_supports(n.device, *f.prim, dtypes, out)) return {};
  return f;
}

}  // namespace

Graph fuse_casts(const Graph& g) {
  const Uses uses(g);
  const int n = static_cast<int>(g.nodes.size());
  // narrowed[y]: y (f32, read by a cast to bf16 alone, directly or through
  // reshapes that only it reads) writes bf16 itself, and so do the reshapes.
  std::vector<bool> narrowed(n, false), casts_away(n, false);
  std::vector<Folded> as_bf16(n);  // a narrowed producer's new primitive
  for (int i = 0; i < n; ++i) {
    const Node& c = g.nodes[i];
    if (!is_cast_to(c, DType::bf16)) continue;
    std::vector<int> chain;  // the reshapes between the producer and the cast
    int y = c.inputs[0];
    while (!g.nodes[y].is_input() && g.nodes[y].prim->op() == Op::Reshape && uses.read_once(y)) {
      chain.push_back(y);
      y = g.nodes[y].inputs[0];
    }
    const Node& p = g.nodes[y];
    if (p.is_input() || p.dtype != DType::f32 || !uses.read_once(y)) continue;
    as_bf16[y] = fold(g, y, DType::bf16);
    if (!as_bf16[y].prim) continue;
    narrowed[y] = true;
    for (int r : chain) narrowed[r] = true;
    casts_away[i] = true;
  }
  Graph out = rewrite(g, [&](Rewriter& rw, int i) {
    const Node& node = g.nodes[i];
    if (casts_away[i]) {
      rw.map(i, rw[node.inputs[0]]);  // its producer wrote bf16
      return;
    }
    if (narrowed[i] && node.prim->op() == Op::Reshape) {
      rw.map(i, rw.add(node.prim, {rw[node.inputs[0]]}, node.shape, DType::bf16));
      return;
    }
    Folded f = narrowed[i] ? std::move(as_bf16[i]) : fold(g, i, node.dtype);
    if (!f.prim) {
      rw.keep(i);
      return;
    }
    std::vector<int> ins;
    for (int k : f.inputs) ins.push_back(rw[k]);
    rw.map(i, rw.add(f.prim, std::move(ins), node.shape, narrowed[i] ? DType::bf16 : node.dtype));
  });
  return dead_code_elimination(out);  // the casts no one reads now
}

namespace {

// A bf16 program: a FusedElementwise writing bf16, or a fusable bf16 op of
// bf16 operands as a one-instruction program (its result rounded).
struct Bf16Program {
  FusedAttrs attrs;
  std::vector<int> inputs;  // old ids, by input register
};

std::optional<Bf16Program> bf16_program(const Graph& g, int i) {
  const Node& node = g.nodes[i];
  if (node.is_input() || node.dtype != DType::bf16) return std::nullopt;
  if (node.prim->op() == Op::FusedElementwise)
    return Bf16Program{node.prim->attrs<FusedAttrs>(), node.inputs};
  if (!backend_fuses(node)) return std::nullopt;
  Bf16Program p{{}, program_inputs(g, i)};
  for (int k : p.inputs) {
    FusedRead mode;
    if (g.nodes[k].dtype != DType::bf16 || !read_mode(g.nodes[k].shape, node.shape, mode))
      return std::nullopt;
    p.attrs.reads.push_back(mode);
  }
  const int b = node.inputs.size() < 2 ? -1 : node.inputs[1] == node.inputs[0] ? 0 : 1;
  p.attrs.program.push_back({node.prim->op(), 0, b, true});
  return p;
}

// c with its input register r replaced by producer p's program: p's inputs,
// then c's others; p's instructions, its last rounded to bf16 as p stored it;
// then c's.
Bf16Program absorb(const Bf16Program& c, int r, const Bf16Program& p) {
  const int np = static_cast<int>(p.attrs.reads.size()),
            nc = static_cast<int>(c.attrs.reads.size());
  const int ni = np + nc - 1, ip = static_cast<int>(p.attrs.program.size());
  Bf16Program m;
  m.attrs.reads = p.attrs.reads;
  m.inputs = p.inputs;
  for (int j = 0; j < nc; ++j)
    if (j != r) {
      m.attrs.reads.push_back(c.attrs.reads[j]);
      m.inputs.push_back(c.inputs[j]);
    }
  for (FusedInstr ins : p.attrs.program) {
    auto to = [&](int x) { return x < np ? x : x - np + ni; };
    ins.a = to(ins.a);
    if (ins.b >= 0) ins.b = to(ins.b);
    m.attrs.program.push_back(ins);
  }
  m.attrs.program.back().round_bf16 = true;
  const int p_out = ni + ip - 1;
  for (FusedInstr ins : c.attrs.program) {
    auto to = [&](int x) {
      if (x == r) return p_out;
      if (x < nc) return x < r ? np + x : np + x - 1;
      return x - nc + ni + ip;
    };
    ins.a = to(ins.a);
    if (ins.b >= 0) ins.b = to(ins.b);
    m.attrs.program.push_back(ins);
  }
  return m;
}

}  // namespace

Graph fuse_bf16_programs(const Graph& g) {
  const Uses uses(g);
  const int n = static_cast<int>(g.nodes.size());
  std::vector<std::optional<Bf16Program>> prog(n);
  std::vector<bool> absorbed(n, false), grown(n, false);
  for (int i = 0; i < n; ++i) {
    prog[i] = bf16_program(g, i);
    if (!prog[i]) continue;
    const Node& node = g.nodes[i];
    for (size_t r = 0; r < prog[i]->inputs.size();) {
      const int k = prog[i]->inputs[r];
      if (!prog[k] || prog[i]->attrs.reads[r] != FusedRead::Whole ||
          g.nodes[k].shape != node.shape || uses.sole_reader(k) != i || uses.is_output[k] ||
          std::count(prog[i]->inputs.begin(), prog[i]->inputs.end(), k) != 1) {
        ++r;
        continue;
      }
      Bf16Program m = absorb(*prog[i], static_cast<int>(r), *prog[k]);
      std::vector<DType> dtypes;
      for (int x : m.inputs) dtypes.push_back(g.nodes[x].dtype);
      if (!backend_supports(node.device, Primitive(Op::FusedElementwise, m.attrs), dtypes,
                            DType::bf16)) {
        ++r;
        continue;
      }
      prog[i] = std::move(m);  // its inputs now begin with k's: look at them again
      absorbed[k] = grown[i] = true;
      r = 0;
    }
  }
  return rewrite_ops(g, [&](int i) -> Emit {
    if (absorbed[i]) return {Emit::Drop};
    if (!grown[i]) return {};
    return {Emit::Replace, std::make_shared<Primitive>(Op::FusedElementwise, prog[i]->attrs),
            prog[i]->inputs};
  });
}

}  // namespace kiln::compiler
