// kiln transforms: reverse-mode autodiff over the graph.
#include <unordered_map>
#include <unordered_set>

#include "kiln/ops.h"
#include "kiln/transforms.h"
#include "ops/dispatch.h"
#include "ops/vjp.h"

namespace kiln {
namespace {

// While alive, operations keep their graph edges so that they can be walked
// backwards.
struct KeepGraph {
  KeepGraph() { ++exec_state().keep_graph; }
  ~KeepGraph() {
    if (--exec_state().keep_graph == 0) forget_release_candidates();
  }
};

// A fresh node standing for a primal: an identity (an aliasing reshape) whose
// own identity marks where this walk stops, while an enclosing trace still
// sees through it to the primal (so nested differentiation stays connected).
Array trace_input(const Array& primal) {
  if (!primal.valid()) fail("vjp", "use of an empty Array handle as a primal");
  return apply(Primitive(Op::Reshape, ShapeAttrs{primal.shape()}), {primal});
}

using CotangentFn = std::function<std::vector<Array>(const std::vector<Array>& outputs)>;
using ReadyFn = std::function<void(size_t primal, const Array& grad)>;

// One cotangent per output, of its shape.
void check_cotangents(const std::vector<Array>& outputs, const std::vector<Array>& cotangents) {
  if (cotangents.size() != outputs.size())
    fail("vjp", std::to_string(cotangents.size()) + " cotangents for " +
                    std::to_string(outputs.size()) + " outputs");
  for (size_t i = 0; i < outputs.size(); ++i)
    if (cotangents[i].shape() != outputs[i].shape())
      fail("vjp", "cotangent " + str(cotangents[i].shape()) + " for output " + std::to_string(i) +
                      " of shape " + str(outputs[i].shape()));
}

// The nodes behind `outputs` down to the primals, in topological order
// (iterative DFS), and which of them depend on a primal.
std::pair<std::vector<Array>, std::unordered_map<ArrayNode*, bool>> walk_order(
    const std::vector<Array>& outputs, const std::unordered_set<ArrayNode*>& primal_nodes) {
  std::unordered_map<ArrayNode*, bool> depends;
  std::vector<Array> order;
  std::vector<std::pair<Array, size_t>> stack;
  for (auto& out : outputs) {
    if (depends.count(out.node())) continue;
    stack.push_back({out, 0});
    depends[out.node()] = primal_nodes.count(out.node()) > 0;
    while (!stack.empty()) {
      auto& [arr, next] = stack.back();
      ArrayNode* n = arr.node();
      if (!primal_nodes.count(n) && next < n->inputs.size()) {
        const Array& in = n->inputs[next++];
        if (!depends.count(in.node())) {
          depends[in.node()] = primal_nodes.count(in.node()) > 0;
          stack.push_back({in, 0});
        }
      } else {
        if (!primal_nodes.count(n))
          for (auto& in : n->inputs) depends[n] = depends[n] || depends[in.node()];
        order.push_back(arr);
        stack.pop_back();
      }
    }
  }
  return {std::move(order), std::move(depends)};
}

std::pair<std::vector<Array>, std::vector<Array>> vjp_impl(const VectorFn& f,
                                                           const std::vector<Array>& primals,
                                                           const CotangentFn& make_cotangents,
                                                           const ReadyFn& on_ready = {}) {
  std::vector<Array> traced;
  std::vector<Array> outputs;
  {
    KeepGraph keep;
    for (auto& p : primals) traced.push_back(trace_input(p));
    outputs = f(traced);
  }
  const std::vector<Array> cotangents = make_cotangents(outputs);
  check_cotangents(outputs, cotangents);
  std::unordered_set<ArrayNode*> primal_nodes;
  for (auto& t : traced) primal_nodes.insert(t.node());
  auto [order, depends] = walk_order(outputs, primal_nodes);

  std::unordered_map<ArrayNode*, Array> ct;
  auto accumulate = [&](const Array& target, const Array& c) {
    auto [it, inserted] = ct.try_emplace(target.node(), c);
    if (!inserted) it->second = add(it->second, c);
  };
  for (size_t i = 0; i < outputs.size(); ++i)
    if (depends[outputs[i].node()])
      accumulate(outputs[i], astype(cotangents[i], outputs[i].dtype()));

  // A primal's gradient is final once every node that reads it has been
  // walked: `readers` counts the reads still to come (on_ready is told then).
  std::unordered_map<ArrayNode*, size_t> primal_index;
  std::unordered_map<ArrayNode*, int64_t> readers;
  std::vector<Array> final_grads(traced.size());
  auto grad_of = [&](size_t i) {
    if (final_grads[i].valid()) return final_grads[i];
    auto found = ct.find(traced[i].node());
    final_grads[i] =
        found != ct.end() ? astype(found->second, primals[i].dtype()) : zeros_like(primals[i]);
    return final_grads[i];
  };
  std::vector<bool> told(traced.size(), false);
  if (on_ready) {
    for (size_t i = 0; i < traced.size(); ++i) primal_index.emplace(traced[i].node(), i);
    for (auto& a : order)
      if (!primal_nodes.count(a.node()) && a.node()->primitive && depends[a.node()])
        for (auto& in : a.node()->inputs)
          if (primal_nodes.count(in.node())) ++readers[in.node()];
    // Primals that nothing reads (or only outputs are) are final at once.
    for (size_t i = 0; i < traced.size(); ++i)
      if (!readers.count(traced[i].node()) && !told[i]) {
        told[i] = true;
        on_ready(i, grad_of(i));
      }
  }
  auto walked = [&](ArrayNode* n) {
    if (!on_ready) return;
    for (auto& in : n->inputs) {
      auto r = readers.find(in.node());
      if (r == readers.end() || --r->second > 0) continue;
      const size_t i = primal_index.at(in.node());
      if (!told[i]) {
        told[i] = true;
        on_ready(i, grad_of(i));
      }
    }
  };

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    ArrayNode* n = it->node();
    if (primal_nodes.count(n) || !n->primitive || !depends[n]) continue;
    auto found = ct.find(n);
    if (found == ct.end()) {
      walked(n);
      continue;
    }
    Array g = found->second;
    std::vector<bool> need(n->inputs.size());
    for (size_t i = 0; i < need.size(); ++i)
      need[i] = depends[n->inputs[i].node()] && is_floating(n->inputs[i].dtype());
    auto cts = vjp_rule(*n->primitive, n->inputs, *it, g, need);
    for (size_t i = 0; i < cts.size(); ++i)
      if (need[i] && cts[i].valid()) accumulate(n->inputs[i], cts[i]);
    ct.erase(found);  // frees this cotangent as soon as it has been propagated
    walked(n);
  }

  std::vector<Array> grads;
  for (size_t i = 0; i < traced.size(); ++i) grads.push_back(grad_of(i));
  // Outside any enclosing trace, drop the forward graph held by the outputs.
  if (exec_state().keep_graph == 0)
    for (auto& out : outputs)
      if (out.is_materialized()) detach(*out.node());
  return {outputs, grads};
}

}  // namespace

std::pair<std::vector<Array>, std::vector<Array>> vjp(const VectorFn& f,
                                                      const std::vector<Array>& primals,
                                                      const std::vector<Array>& cotangents) {
  return vjp_impl(f, primals, [&](const std::vector<Array>&) { return cotangents; });
}

std::pair<Array, std::vector<Array>> value_and_grad_vector(
    const std::function<Array(const std::vector<Array>&)>& f, const std::vector<Array>& primals,
    const std::function<void(size_t, const Array&)>& on_ready) {
  auto [outs, grads] = vjp_impl(
      [&](const std::vector<Array>& xs) {
        Array v = f(xs);
        if (!v.valid() || v.size() != 1)
          fail("value_and_grad",
               "function must return a scalar, got shape " + (v.valid() ? str(v.shape()) : "none"));
        return std::vector<Array>{v};
      },
      primals,
      [](const std::vector<Array>& outs) { return std::vector<Array>{ones_like(outs[0])}; },
      on_ready);
  return {outs[0], grads};
}

std::pair<Array, Params> value_and_grad_params(const std::function<Array(const Params&)>& f,
                                               const Params& params, const GradReady& on_ready) {
  std::vector<std::string> names;
  std::vector<Array> flat;
  for (auto& [k, v] : params) {
    names.push_back(k);
    flat.push_back(v);
  }
  auto [value, grads] = value_and_grad_vector(
      [&](const std::vector<Array>& xs) {
        Params p;
        for (size_t i = 0; i < xs.size(); ++i) p.emplace(names[i], xs[i]);
        return f(p);
      },
      flat,
      on_ready ? [&](size_t i, const Array& g) { on_ready(names[i], g); }
               : std::function<void(size_t, const Array&)>());
  Params out;
  for (size_t i = 0; i < names.size(); ++i) out.emplace(names[i], grads[i]);
  return {value, out};
}

}  // namespace kiln
