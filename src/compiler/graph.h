// kiln compiler: the graph IR. Nodes are in topological (SSA) order; inputs
// come first. A pass is a function from Graph to Graph.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/array.h"
#include "ops/primitive.h"

namespace kiln::compiler {

struct Node {
  std::shared_ptr<const Primitive> prim;  // null for an input
  std::vector<int> inputs;                // node ids
  Shape shape;
  DType dtype = DType::f32;
  int input_slot = -1;  // inputs: position in the executable's arguments
  Device device = Device::cpu();  // where the value lives and the op runs
  bool is_input() const { return prim == nullptr; }
};

struct Graph {
  std::vector<Node> nodes;
  std::vector<int> outputs;  // node ids, in the caller's order (repeats allowed)
  int num_inputs = 0;

  int add_input(const Shape& shape, DType dtype, Device device = Device::cpu());
  // An op runs on its first input's device (the cpu when it has none) unless
  // `device` says otherwise.
  int add_op(std::shared_ptr<const Primitive> prim, std::vector<int> inputs, Shape shape,
             DType dtype, std::optional<Device> device = std::nullopt);
  // Structural hash: primitives, attributes, shapes, dtypes, devices and wiring.
  size_t hash() const;
  bool operator==(const Graph& o) const;
  std::string str() const;  // one line per node, as printed by KILN_DEBUG=2
  size_t num_ops() const { return nodes.size() - num_inputs; }
};

// The graph that computes `outputs` from what they are pending on. Every
// leaf (a materialized array, or a tracer made by tracing) becomes an
// input; `leaves` receives them in input-slot order.
Graph capture(const std::vector<Array>& outputs, std::vector<Array>& leaves);

// A pending array without a producer: stands for an argument while tracing.
Array tracer(const Shape& shape, DType dtype, Device device = Device::cpu());

}  // namespace kiln::compiler
