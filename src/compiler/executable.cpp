// kiln compiler: compiling a graph into an executable, and running it.
#include "compiler/executable.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "compiler/rewrite.h"
#include "ops/dispatch.h"

namespace kiln::compiler {

Executable::Executable(const Graph& g, std::vector<bool> donated, const PassOptions& opt)
    : donated_(std::move(donated)) {
  auto t0 = std::chrono::steady_clock::now();
  graph_ = optimize(g, opt);
  bool any_donated = false;
  for (bool d : donated_) any_donated |= d;
  if (any_donated && opt.plan) {
    graph_ = defer_donated_updates(graph_, donated_);
    if (debug_level() >= 1) verify(graph_, "defer_donated_updates");
  }
  if (opt.plan) {
    plan_ = plan_memory(graph_, donated_, opt.inplace);
  } else {
    // Without a plan every value gets its own buffer per run.
    plan_ = plan_memory(graph_, std::vector<bool>(donated_.size(), false), false);
    for (auto& s : plan_.slots)
      if (s.kind == MemoryPlan::Kind::Arena) s.kind = MemoryPlan::Kind::Fresh;
    plan_.arena_bytes = 0;
  }
  if (plan_.arena_bytes)
    arena_ = std::make_shared<Buffer>(&allocator_for(plan_.device), plan_.arena_bytes,
                                      plan_.device);
  values_.resize(graph_.nodes.size());
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    if (graph_.nodes[i].is_input()) continue;
    auto node = std::make_shared<ArrayNode>();
    node->shape = graph_.nodes[i].shape;
    node->dtype = graph_.nodes[i].dtype;
    node->device = graph_.nodes[i].device;
    values_[i] = std::move(node);
  }
  stats_.nodes_traced = g.num_ops();
  stats_.nodes_compiled = graph_.num_ops();
  stats_.arena_bytes = plan_.arena_bytes;
  stats_.intermediate_bytes = plan_.naive_bytes;
  stats_.inplace = plan_.inplace;
  stats_.donated = plan_.donated;
  stats_.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (debug_level() >= 1)
    std::fprintf(stderr,
                 "[compile] %zu -> %zu ops; arena %.1f MiB (peak live %.1f MiB) vs %.1f MiB of "
                 "intermediates; %d in place, %d donated; %.1f ms\n",
                 stats_.nodes_traced, stats_.nodes_compiled, plan_.arena_bytes / 1048576.0,
                 plan_.peak_live_bytes / 1048576.0, plan_.naive_bytes / 1048576.0, plan_.inplace,
                 plan_.donated, stats_.compile_ms);
  if (debug_level() >= 3)
    std::fprintf(stderr, "[compile] memory plan:\n%s", plan_.str(graph_).c_str());
}

std::vector<Array> Executable::run(const std::vector<Array>& inputs) {
  if (inputs.size() != static_cast<size_t>(graph_.num_inputs))
    fail("compile", "executable takes " + std::to_string(graph_.num_inputs) + " inputs, got " +
                        std::to_string(inputs.size()));
  // Inputs are materialized first: they are the caller's arrays.
  for (const auto& in : inputs) in.eval();
  int slot = 0;
  std::vector<std::shared_ptr<ArrayNode>> donated_nodes;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    if (!n.is_input()) continue;
    const Array& a = inputs[slot];
    if (a.device() != n.device)
      fail("compile", "input " + std::to_string(slot) + " is on " + a.device().str() +
                          ", the executable was compiled for " + n.device.str());
    if (a.shape() != n.shape || a.dtype() != n.dtype)
      fail("compile", "input " + std::to_string(slot) + " is " + name_of(a.dtype()) + " " +
                          str(a.shape()) + ", the executable was compiled for " + name_of(n.dtype) +
                          " " + str(n.shape));
    values_[i] = a.node_ptr();
    if (donated_[slot]) donated_nodes.push_back(a.node_ptr());
    ++slot;
  }
  std::vector<Array> args;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    if (n.is_input()) continue;
    ArrayNode& out = *values_[i];
    const auto& s = plan_.slots[i];
    switch (s.kind) {
      case MemoryPlan::Kind::Arena:
        out.buffer = arena_;
        out.offset = s.offset;
        break;
      case MemoryPlan::Kind::Fresh:
        out.buffer = std::make_shared<Buffer>(&allocator_for(n.device), s.bytes, n.device);
        out.offset = 0;
        break;
      case MemoryPlan::Kind::Donated:
        out.buffer = values_[s.source]->buffer;
        out.offset = values_[s.source]->offset;
        break;
      default:
        out.buffer.reset();  // alias kernels set it
        break;
    }
    args.clear();
    for (int k : n.inputs) args.emplace_back(values_[k]);
    run_kernel_with(*n.prim, args, out);
  }
  std::vector<Array> outputs;
  for (int o : graph_.outputs) {
    const ArrayNode& v = *values_[o];
    auto node = std::make_shared<ArrayNode>();
    node->shape = v.shape;
    node->dtype = v.dtype;
    node->device = v.device;
    node->buffer = v.buffer;
    node->offset = v.offset;
    node->id = next_array_id();
    outputs.emplace_back(std::move(node));
  }
  // Donated arguments lose their buffers (outputs may live there now).
  for (auto& d : donated_nodes) {
    d->buffer.reset();
    d->donated = true;
  }
  // Keep nothing of this run but the arena.
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    if (graph_.nodes[i].is_input())
      values_[i].reset();
    else if (plan_.slots[i].kind != MemoryPlan::Kind::Arena)
      values_[i]->buffer.reset();
  }
  return outputs;
}

}  // namespace kiln::compiler
