// kiln compiler: the Rewriter every pass builds its result with, Uses, and
// the graph verifier.
#include "compiler/rewrite.h"

#include <algorithm>

#include "ops/op_defs.h"
#include "ops/op_facts.h"

namespace kiln::compiler {

Uses::Uses(const Graph& g)
    : users(g.nodes.size()),
      is_output(g.nodes.size(), false),
      first_use(g.nodes.size(), static_cast<int>(g.nodes.size())),
      last_use(g.nodes.size(), -1) {
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i)
    for (int k : g.nodes[i].inputs) {
      users[k].push_back(i);
      first_use[k] = std::min(first_use[k], i);
      last_use[k] = std::max(last_use[k], i);
    }
  for (int o : g.outputs) is_output[o] = true;
}

int Uses::sole_reader(int i) const {
  if (is_output[i] || users[i].empty()) return -1;
  for (int u : users[i])
    if (u != users[i][0]) return -1;
  return users[i][0];
}

Rewriter::Rewriter(const Graph& g) : g_(g), id_(g.nodes.size(), -1) {
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.is_input()) id_[i] = out_.add_input(n.shape, n.dtype, n.device);
  }
}

int Rewriter::keep(int i) {
  return keep(i, g_.nodes[i].prim, g_.nodes[i].inputs);
}

int Rewriter::keep(int i, std::shared_ptr<const Primitive> prim,
                   const std::vector<int>& old_inputs, const std::optional<Shape>& shape) {
  std::vector<int> ins;
  ins.reserve(old_inputs.size());
  for (int k : old_inputs) ins.push_back(id_[k]);
  const Node& n = g_.nodes[i];
  return id_[i] = out_.add_op(std::move(prim), std::move(ins), shape ? *shape : n.shape, n.dtype,
                              n.device);
}

int Rewriter::keep_over(int i, std::vector<int> new_inputs) {
  const Node& n = g_.nodes[i];
  return id_[i] = out_.add_op(n.prim, std::move(new_inputs), n.shape, n.dtype, n.device);
}

int Rewriter::add(Primitive prim, std::vector<int> new_inputs, Shape shape, DType dtype) {
  return add(std::make_shared<Primitive>(std::move(prim)), std::move(new_inputs),
             std::move(shape), dtype);
}

int Rewriter::add(std::shared_ptr<const Primitive> prim, std::vector<int> new_inputs, Shape shape,
                  DType dtype) {
  return out_.add_op(std::move(prim), std::move(new_inputs), std::move(shape), dtype);
}

Graph Rewriter::finish() {
  for (int o : g_.outputs) {
    if (id_[o] < 0) fail("compile", "a pass dropped graph output %" + std::to_string(o));
    out_.outputs.push_back(id_[o]);
  }
  return std::move(out_);
}

Graph rewrite(const Graph& g, const std::function<void(Rewriter&, int)>& visit) {
  Rewriter rw(g);
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i)
    if (!g.nodes[i].is_input()) visit(rw, i);
  return rw.finish();
}

Graph rewrite_ops(const Graph& g, const std::function<Emit(int)>& decide,
                  const std::vector<int>& value_of) {
  return rewrite(g, [&](Rewriter& rw, int i) {
    Emit e = decide(i);
    switch (e.kind) {
      case Emit::Keep: rw.keep(i); break;
      case Emit::Drop:
        if (!value_of.empty() && value_of[i] != i) rw.map(i, rw[value_of[i]]);
        break;
      case Emit::Replace: rw.keep(i, e.prim, e.inputs, e.shape); break;
    }
  });
}

namespace {

// Whether `in` broadcasts to `out` (NumPy's rule).
bool broadcasts_to(const Shape& in, const Shape& out) {
  if (in.size() > out.size()) return false;
  for (size_t d = 0; d < in.size(); ++d) {
    const int64_t a = in[in.size() - 1 - d], b = out[out.size() - 1 - d];
    if (a != b && a != 1) return false;
  }
  return true;
}

// A fused program's registers are defined before they are read, and its ops
// have scalar functions.
std::string check_program(const FusedAttrs& f) {
  const int ni = static_cast<int>(f.reads.size());
  for (size_t i = 0; i < f.program.size(); ++i) {
    const FusedInstr& in = f.program[i];
    const int defined = ni + static_cast<int>(i);
    if (!op_has(in.op, kFusable)) return std::string(op_name(in.op)) + " is not fusable";
    if (in.a < 0 || in.a >= defined || in.b >= defined ||
        (in.b < 0) != (op_kind(in.op) == OpKind::Unary))
      return "instruction " + std::to_string(i) + " reads an undefined register";
  }
  return {};
}

// What is wrong with op i of g, or "" when nothing.
std::string check_op(const Graph& g, int i) {
  const Node& n = g.nodes[i];
  const Primitive& p = *n.prim;
  const bool transfer = op_kind(p.op()) == OpKind::Transfer;
  if (transfer && p.attrs<DeviceAttrs>().to != n.device)
    return "copies to " + p.attrs<DeviceAttrs>().to.str() + " but runs on " + n.device.str();
  for (int k : n.inputs) {
    if (k < 0 || k >= i) return "reads %" + std::to_string(k) + ", not defined before it";
    if (!transfer && g.nodes[k].device != n.device)
      return "runs on " + n.device.str() + " but reads %" + std::to_string(k) + " on " +
             g.nodes[k].device.str();
  }
  const int want = operand_count(p);
  if (want >= 0 && static_cast<int>(n.inputs.size()) != want)
    return "has " + std::to_string(n.inputs.size()) + " operands, expected " +
           std::to_string(want);
  auto in = [&](size_t j) -> const Node& { return g.nodes[n.inputs[j]]; };
  if (op_has(p.op(), kPointwise) && p.op() != Op::FusedElementwise) {
    for (size_t j = 0; j < n.inputs.size(); ++j)
      if (!broadcasts_to(in(j).shape, n.shape))
        return "operand " + std::to_string(j) + " of shape " + str(in(j).shape) +
               " does not broadcast to " + str(n.shape);
    const OpKind kind = op_kind(p.op());
    const size_t data = kind == OpKind::Select ? 1 : 0;
    if (kind == OpKind::Compare && n.dtype != DType::bool_) return "a comparison not of bool";
    if (kind != OpKind::Compare && kind != OpKind::Convert && in(data).dtype != n.dtype)
      return std::string("dtype ") + name_of(n.dtype) + " differs from its operand's " +
             name_of(in(data).dtype);
  }
  if (op_has(p.op(), kAlias) && numel(in(0).shape) != numel(n.shape))
    return "a view of " + str(in(0).shape) + " as " + str(n.shape);
  if (p.op() == Op::FusedElementwise) {
    const auto& f = p.attrs<FusedAttrs>();
    if (std::string e = check_program(f); !e.empty()) return e;
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const bool ok = f.reads[j] == FusedRead::Whole    ? in(j).shape == n.shape
                      : f.reads[j] == FusedRead::Scalar ? numel(in(j).shape) == 1
                                                        : numel(n.shape) % std::max<int64_t>(1, numel(in(j).shape)) == 0;
      if (!ok) return "operand " + std::to_string(j) + " of shape " + str(in(j).shape) +
                      " does not fit its read mode";
    }
  }
  if (p.op() == Op::FusedReduce) {
    const auto& a = p.attrs<FusedReduceAttrs>();
    if (std::string e = check_program(a.body); !e.empty()) return "body: " + e;
    if (std::string e = check_program(a.epilogue); !e.empty()) return "epilogue: " + e;
  }
  return {};
}

}  // namespace

void verify(const Graph& g, const std::string& after) {
  auto bad = [&](int i, const std::string& what) {
    std::string node = i >= 0 && i < static_cast<int>(g.nodes.size()) && !g.nodes[i].is_input()
                           ? std::string(" (") + g.nodes[i].prim->str() + ")"
                           : "";
    fail("compile", "graph verifier, after " + after + ": %" + std::to_string(i) + node + " " +
                        what);
  };
  int slot = 0;
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const Node& n = g.nodes[i];
    if (n.is_input()) {
      if (n.input_slot != slot++) bad(i, "is input slot " + std::to_string(n.input_slot) +
                                             ", expected " + std::to_string(slot - 1));
      if (!n.inputs.empty()) bad(i, "is an input with operands");
      continue;
    }
    if (std::string e = check_op(g, i); !e.empty()) bad(i, e);
  }
  if (slot != g.num_inputs)
    bad(-1, "graph has " + std::to_string(slot) + " inputs, num_inputs says " +
                std::to_string(g.num_inputs));
  for (int o : g.outputs)
    if (o < 0 || o >= static_cast<int>(g.nodes.size())) bad(o, "is an output out of range");
}

}  // namespace kiln::compiler
