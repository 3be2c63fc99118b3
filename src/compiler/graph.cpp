// kiln compiler: graph construction, hashing and printing.
#include "compiler/graph.h"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include "core/array_node.h"

namespace kiln::compiler {
namespace {
size_t mix(size_t h, size_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
}
}  // namespace

int Graph::add_input(const Shape& shape, DType dtype, Device device) {
  Node n;
  n.shape = shape;
  n.dtype = dtype;
  n.device = device;
  n.input_slot = num_inputs++;
  nodes.push_back(std::move(n));
  return static_cast<int>(nodes.size()) - 1;
}

int Graph::add_op(std::shared_ptr<const Primitive> prim, std::vector<int> inputs, Shape shape,
                  DType dtype, std::optional<Device> device) {
  Node n;
  n.device = device ? *device : inputs.empty() ? Device::cpu() : nodes.at(inputs[0]).device;
  n.prim = std::move(prim);
  n.inputs = std::move(inputs);
  n.shape = std::move(shape);
  n.dtype = dtype;
  nodes.push_back(std::move(n));
  return static_cast<int>(nodes.size()) - 1;
}

size_t Graph::hash() const {
  size_t h = mix(0, nodes.size());
  for (const auto& n : nodes) {
    h = mix(h, n.prim ? n.prim->hash() : 0x51u + n.input_slot);
    h = mix(h, static_cast<size_t>(n.dtype));
    h = mix(h, static_cast<size_t>(n.device.type) * 1024 + static_cast<size_t>(n.device.index));
    for (auto d : n.shape) h = mix(h, static_cast<size_t>(d));
    for (int i : n.inputs) h = mix(h, static_cast<size_t>(i));
  }
  for (int o : outputs) h = mix(h, static_cast<size_t>(o) + 1000003u);
  return h;
}

bool Graph::operator==(const Graph& o) const {
  if (nodes.size() != o.nodes.size() || outputs != o.outputs || num_inputs != o.num_inputs)
    return false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node &a = nodes[i], &b = o.nodes[i];
    if (a.shape != b.shape || a.dtype != b.dtype || a.inputs != b.inputs ||
        a.input_slot != b.input_slot || a.device != b.device ||
        (a.prim == nullptr) != (b.prim == nullptr))
      return false;
    if (a.prim && !(*a.prim == *b.prim)) return false;
  }
  return true;
}

std::string Graph::str() const {
  std::ostringstream os;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    os << "%" << i << " = ";
    if (n.is_input()) {
      os << "input[" << n.input_slot << "]";
    } else {
      os << n.prim->str() << "(";
      for (size_t k = 0; k < n.inputs.size(); ++k) os << (k ? ", " : "") << "%" << n.inputs[k];
      os << ")";
    }
    os << " : " << name_of(n.dtype) << kiln::str(n.shape);
    if (n.device != Device::cpu()) os << " @" << n.device.str();
    os << "\n";
  }
  os << "return";
  for (int o : outputs) os << " %" << o;
  os << "\n";
  return os.str();
}

Array tracer(const Shape& shape, DType dtype, Device device) {
  auto node = std::make_shared<ArrayNode>();
  node->shape = shape;
  node->dtype = dtype;
  node->device = device;
  node->id = next_array_id();
  return Array(std::move(node));
}

Graph capture(const std::vector<Array>& outputs, std::vector<Array>& leaves) {
  Graph g;
  std::vector<uint64_t> created;  // per op of g: its ArrayNode's creation number
  std::unordered_map<ArrayNode*, int> ids;
  // Post-order DFS (iterative) so that nodes come out topologically sorted.
  std::vector<std::pair<Array, size_t>> stack;
  auto leaf = [](const Array& a) { return a.is_materialized() || !a.has_primitive(); };
  for (const auto& out : outputs) {
    if (!out.valid()) fail("compile", "an output is an empty Array handle");
    if (ids.count(out.node())) continue;
    stack.push_back({out, 0});
    while (!stack.empty()) {
      auto& [arr, next] = stack.back();
      ArrayNode* n = arr.node();
      if (!leaf(arr) && next < n->inputs.size()) {
        const Array& in = n->inputs[next++];
        if (!ids.count(in.node())) stack.push_back({in, 0});
        continue;
      }
      if (!ids.count(n)) {
        if (leaf(arr)) {
          ids[n] = -1 - static_cast<int>(leaves.size());  // inputs are numbered after the walk
          leaves.push_back(arr);
        } else {
          ids[n] = -1;  // set below
        }
        if (!leaf(arr)) {
          std::vector<int> ins;
          for (auto& in : n->inputs) ins.push_back(ids.at(in.node()));
          // Ops are numbered in a second pass; keep them in a temporary list.
          g.nodes.push_back(Node{n->primitive, ins, n->shape, n->dtype, -1, n->device});
          created.push_back(n->id);
          ids[n] = 1 << 30 | static_cast<int>(g.nodes.size() - 1);
        }
      }
      stack.pop_back();
    }
  }
  // Renumber: inputs first (in leaf order), then the ops in the order they
  // were created: the program's order (a topological one: an array's inputs
  // exist before it). The DFS order would run, say, the whole input-gradient
  // chain of a backward pass before any weight gradient (the first parameter
  // output needs that chain), keeping every layer's activation gradients alive
  // at once; creation order interleaves them as autodiff emitted them.
  std::vector<int> order(g.nodes.size()), position(g.nodes.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return created[a] < created[b]; });
  for (size_t k = 0; k < order.size(); ++k) position[order[k]] = static_cast<int>(k);
  bool topological = true;  // creation numbers always are; keep the DFS order if not
  for (size_t k = 0; k < g.nodes.size() && topological; ++k)
    for (int i : g.nodes[k].inputs)
      if (i >= 0 && position[i & ~(1 << 30)] >= position[k]) topological = false;
  if (!topological)
    for (size_t k = 0; k < order.size(); ++k) order[k] = position[k] = static_cast<int>(k);
  Graph out;
  for (const auto& l : leaves) out.add_input(l.shape(), l.dtype(), l.device());
  int base = static_cast<int>(leaves.size());
  auto map = [&](int id) { return id < 0 ? -1 - id : base + position[id & ~(1 << 30)]; };
  for (int k : order) {
    Node n = std::move(g.nodes[k]);
    for (auto& i : n.inputs) i = map(i);
    out.nodes.push_back(std::move(n));
  }
  for (const auto& o : outputs) out.outputs.push_back(map(ids.at(o.node())));
  return out;
}

}  // namespace kiln::compiler
