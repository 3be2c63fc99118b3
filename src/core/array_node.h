// kiln core: ArrayNode, what an Array handle points to — its buffer (once
// materialized), the primitive and inputs that will produce it, and the graph
// bookkeeping of eager differentiation. Internal: the public API reads it
// through Array (include/kiln/array.h).
#pragma once
#include <atomic>
#include <memory>
#include <vector>

#include "kiln/array.h"

namespace kiln {

struct ArrayNode {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
  std::shared_ptr<Buffer> buffer;        // set once materialized
  size_t offset = 0;                     // byte offset into buffer (views of buffers)
  std::shared_ptr<Primitive> primitive;  // null for leaves
  std::vector<Array> inputs;             // graph edges, kept while someone may differentiate
  uint64_t id = 0;                       // unique, increasing: creation order
  bool donated = false;                  // its buffer was handed to a compiled function
  // Eager differentiation frees the buffers of intermediates that no VJP rule
  // reads once no handle but graph edges refers to them (see make_array):
  // graph_users counts the other nodes whose `inputs` hold this one;
  // value_needed is set when a VJP rule will read this value.
  std::atomic<int32_t> graph_users{0};
  bool value_needed = false;
  ArrayNode() = default;
  ArrayNode(const ArrayNode&) = delete;
  ArrayNode& operator=(const ArrayNode&) = delete;
  ~ArrayNode();
  // Clears `inputs`, keeping the inputs' graph_users in step.
  void drop_inputs();
};

}  // namespace kiln
