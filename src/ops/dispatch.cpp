// kiln ops: kernel dispatch and array construction.
#include "ops/dispatch.h"

namespace kiln {
namespace {
const KernelTable* g_tables[kDeviceTypes] = {};
}

void register_kernels(DeviceType type, const KernelTable* table) {
  g_tables[static_cast<int>(type)] = table;
}

void run_kernel_with(const Primitive& prim, const std::vector<Array>& inputs, ArrayNode& out) {
  const KernelTable* table = g_tables[static_cast<int>(out.device.type)];
  if (!table) fail(prim.name(), "no backend is available for " + out.device.str());
  Kernel k = table->kernels[static_cast<int>(prim.op())];
  if (!k) fail(prim.name(), "no kernel on " + out.device.str());
  k(prim, inputs, out);
}

void run_kernel(ArrayNode& node) { run_kernel_with(*node.primitive, node.inputs, node); }

void* alloc_output(ArrayNode& out) {
  // A compiled executable assigns output memory ahead of the kernel.
  if (out.buffer) return static_cast<char*>(out.buffer->data()) + out.offset;
  out.buffer = std::make_shared<Buffer>(&allocator_for(out.device),
                                        numel(out.shape) * size_of(out.dtype), out.device);
  out.offset = 0;
  return out.buffer->data();
}

ExecState& exec_state() {
  thread_local ExecState state;
  return state;
}

void detach(ArrayNode& node) {
  node.primitive.reset();
  node.inputs.clear();
}

Array make_array(Primitive prim, std::vector<Array> inputs, Shape shape, DType dtype) {
  auto node = std::make_shared<ArrayNode>();
  node->shape = std::move(shape);
  node->dtype = dtype;
  node->device = inputs.empty() ? Device::cpu() : inputs[0].device();
  for (auto& in : inputs)
    if (in.device() != node->device)
      fail(prim.name(), "inputs on different devices: " + node->device.str() + " and " +
                            in.device().str());
  node->primitive = std::make_shared<Primitive>(std::move(prim));
  node->inputs = std::move(inputs);
  node->id = next_array_id();
  ExecState& st = exec_state();
  if (!st.lazy) {
    for (auto& in : node->inputs) in.eval();
    run_kernel(*node);
    if (st.keep_graph == 0) detach(*node);
  }
  return Array(std::move(node));
}

}  // namespace kiln
