// kiln transforms: evaluation of pending graphs and the lazy mode.
#include <unordered_set>

#include "kiln/transforms.h"
#include "ops/dispatch.h"

namespace kiln {

void eval(const std::vector<Array>& roots) {
  // Iterative post-order DFS over pending nodes (graphs can be deep).
  std::vector<ArrayNode*> order;
  std::unordered_set<ArrayNode*> seen;
  std::vector<std::pair<ArrayNode*, size_t>> stack;
  for (const auto& r : roots) {
    if (!r.valid()) fail("eval", "use of an empty Array handle");
    ArrayNode* n = r.node();
    if (n->buffer || !seen.insert(n).second) continue;
    stack.push_back({n, 0});
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs.size()) {
        ArrayNode* in = node->inputs[next++].node();
        if (!in->buffer && seen.insert(in).second) stack.push_back({in, 0});
      } else {
        order.push_back(node);
        stack.pop_back();
      }
    }
  }
  // Every node in `order` stays referenced by a later consumer's inputs or by
  // a root until it runs; detaching after running frees what nothing needs.
  bool keep = exec_state().keep_graph > 0;
  for (ArrayNode* n : order) {
    if (n->donated)
      fail("eval",
           "this array was donated to a compiled function, which reused its buffer; "
           "use the arrays that function returned");
    if (!n->primitive)
      fail("eval",
           "the value of a traced argument was requested while tracing (item(), "
           "to_vector() or eval() inside a function being compiled)");
    run_kernel(*n);
    if (!keep) detach(*n);
  }
}

void eval(const Params& params) {
  std::vector<Array> v;
  v.reserve(params.size());
  for (auto& [name, a] : params) v.push_back(a);
  eval(v);
}

void Array::eval() const {
  if (!node_) fail("eval", "use of an empty Array handle");
  if (!node_->buffer) kiln::eval(std::vector<Array>{*this});
}

CheckFiniteScope::CheckFiniteScope() : previous_(exec_state().check_finite) {
  exec_state().check_finite = true;
}
CheckFiniteScope::~CheckFiniteScope() {
  exec_state().check_finite = previous_;
}

LazyScope::LazyScope() : previous_(exec_state().lazy) {
  exec_state().lazy = true;
}
LazyScope::~LazyScope() {
  exec_state().lazy = previous_;
}
bool is_lazy() {
  return exec_state().lazy;
}

}  // namespace kiln
