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
  // The operand count and the output's type by the op's definition
  // (src/ops/defs/).
  std::vector<Aval> in;
  for (int k : n.inputs) in.push_back({g.nodes[k].shape, g.nodes[k].dtype});
  return check_type(p, in, {n.shape, n.dtype});
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
