// kiln compiler: compiling a graph into an executable, and running it.
#include "compiler/executable.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "compiler/rewrite.h"
#include "core/arenas.h"
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
    verify(graph_, "defer_donated_updates");
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
  // Recordable: every value on the arena's device, whose backend records,
  // no copy between devices (a copy to the host waits for the device) and no
  // fallback (whose primitives allocate as they run).
  const KernelTable* table = kernel_table(plan_.device);
  recordable_ = table && table->begin_recording;
  for (const auto& n : graph_.nodes)
    recordable_ = recordable_ && n.device == plan_.device &&
                  !(n.prim && (op_kind(n.prim->op()) == OpKind::Transfer ||
                               runs_fallback(n.device, n.prim->op())));
  if (plan_.arena_bytes && recordable_)  // else borrowed for each run (core/arenas.h)
    arena_ =
        std::make_shared<Buffer>(&allocator_for(plan_.device), plan_.arena_bytes, plan_.device);
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

struct Executable::Recorded {
  Device device;
  void* recording = nullptr;
  std::vector<const void*> donated;            // per input slot: a donated input's memory
  std::vector<std::shared_ptr<ArrayNode>> staged;  // per input slot: where it is copied (not donated)
  std::vector<std::shared_ptr<Buffer>> fresh;  // per node: a Fresh value's buffer
  ~Recorded() {
    if (recording) kernel_table(device)->release_recording(device, recording);
  }
};

Executable::~Executable() = default;

namespace {

// Whether runs may be recorded and replayed (KILN_REPLAY=0 turns it off).
bool replay_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_REPLAY");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

const void* memory_of(const ArrayNode& n) {
  return n.buffer ? static_cast<const char*>(n.buffer->data()) + n.offset : nullptr;
}

// Copies `from` into `to`'s memory (a Copy on their device).
void copy_into(const Array& from, ArrayNode& to) {
  run_kernel_with(Primitive(Op::Copy, DeviceAttrs{to.device}), {from}, to);
}

}  // namespace

void Executable::run_nodes(Pass pass) {
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
        out.buffer = pass == Pass::Run
                         ? std::make_shared<Buffer>(&allocator_for(n.device), s.bytes, n.device)
                         : recorded_->fresh[i];
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
    // After a replay only the alias kernels run: they set their output's
    // memory on the host and queue nothing.
    if (pass == Pass::Bind && s.kind != MemoryPlan::Kind::Alias) continue;
    args.clear();
    for (int k : n.inputs) args.emplace_back(values_[k]);
    run_kernel_with(*n.prim, args, out);
  }
}

void Executable::record(const std::vector<Array>& inputs) {
  const KernelTable* t = kernel_table(plan_.device);
  auto r = std::make_unique<Recorded>();
  r->device = plan_.device;
  r->donated.assign(inputs.size(), nullptr);
  r->staged.resize(inputs.size());
  r->fresh.resize(graph_.nodes.size());
  for (size_t i = 0; i < graph_.nodes.size(); ++i)
    if (!graph_.nodes[i].is_input() && plan_.slots[i].kind == MemoryPlan::Kind::Fresh)
      r->fresh[i] = std::make_shared<Buffer>(&allocator_for(graph_.nodes[i].device),
                                             plan_.slots[i].bytes, graph_.nodes[i].device);
  recorded_ = std::move(r);
  int slot = 0;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    if (!graph_.nodes[i].is_input()) continue;
    const Array& a = inputs[slot];
    if (donated_[slot]) {
      recorded_->donated[slot] = memory_of(*a.node_ptr());
    } else {
      auto st = std::make_shared<ArrayNode>();
      st->shape = a.shape();
      st->dtype = a.dtype();
      st->device = a.device();
      st->buffer = std::make_shared<Buffer>(&allocator_for(a.device()), a.nbytes(), a.device());
      copy_into(a, *st);
      recorded_->staged[slot] = st;
      values_[i] = st;
    }
    ++slot;
  }
  bool ok = t->begin_recording(plan_.device);
  if (ok) {
    try {
      run_nodes(Pass::Record);
    } catch (...) {
      ok = false;  // whatever failed fails again below, run op by op
    }
    void* rec = t->end_recording(plan_.device);  // ends it even after a failure
    ok = ok && rec;
    if (ok) recorded_->recording = rec;
    else if (rec) t->release_recording(plan_.device, rec);
  }
  if (!ok) {
    // Nothing ran: run the kernels directly, now and from now on.
    record_failed_ = true;
    recorded_.reset();
    if (debug_level() >= 1)
      std::fprintf(stderr, "[compile] %s could not record the executable: running it op by op\n",
                   plan_.device.str().c_str());
    slot = 0;
    for (size_t i = 0; i < graph_.nodes.size(); ++i)
      if (graph_.nodes[i].is_input()) values_[i] = inputs[slot++].node_ptr();
    run_nodes(Pass::Run);
    return;
  }
  ++recordings_;
  t->replay(plan_.device, recorded_->recording);
  run_nodes(Pass::Bind);
}

bool Executable::replay(const std::vector<Array>& inputs) {
  int slot = 0;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    if (!graph_.nodes[i].is_input()) continue;
    if (donated_[slot] && memory_of(*inputs[slot].node_ptr()) != recorded_->donated[slot])
      return false;  // other buffers than the recording's
    ++slot;
  }
  slot = 0;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    if (!graph_.nodes[i].is_input()) continue;
    if (!donated_[slot]) {
      copy_into(inputs[slot], *recorded_->staged[slot]);
      values_[i] = recorded_->staged[slot];
    }
    ++slot;
  }
  kernel_table(plan_.device)->replay(plan_.device, recorded_->recording);
  ++replays_;
  run_nodes(Pass::Bind);
  return true;
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
  // An arena borrowed for this run goes back to the pool when the run ends,
  // also when a kernel fails: no output lives in it.
  struct GiveBack {
    Executable& e;
    ~GiveBack() {
      if (e.recordable_ || !e.arena_) return;
      for (size_t i = 0; i < e.values_.size(); ++i)
        if (e.values_[i] && e.plan_.slots[i].kind == MemoryPlan::Kind::Arena)
          e.values_[i]->buffer.reset();
      give_back_arena(std::move(e.arena_));
    }
  } give_back{*this};
  if (!recordable_ && plan_.arena_bytes) arena_ = borrow_arena(plan_.arena_bytes, plan_.device);
  // The first run runs op by op (and compiles, plans and caches what its
  // kernels need); later ones replay a recording where the backend makes one.
  // (Not while kernels are profiled or checked for NaN: both read results.)
  const bool recorded = recordable_ && !record_failed_ && runs_++ > 0 && replay_enabled() &&
                        !kernel_profile().enabled && !exec_state().check_finite;
  if (!recorded) {
    run_nodes(Pass::Run);
  } else if (!recorded_ || !replay(inputs)) {
    if (recorded_) {
      // Other donated buffers: record again (the input bindings go back to
      // the caller's arrays first).
      recorded_.reset();
      slot = 0;
      for (size_t i = 0; i < graph_.nodes.size(); ++i)
        if (graph_.nodes[i].is_input()) values_[i] = inputs[slot++].node_ptr();
    }
    record(inputs);
  }
  // Memory a replay writes again: outputs there (a Fresh value, or a view
  // of one or of a staged input) are copied for the caller.
  auto recording_owns = [&](const std::shared_ptr<Buffer>& b) {
    if (!recorded_ || !b) return false;
    for (const auto& f : recorded_->fresh)
      if (f == b) return true;
    for (const auto& st : recorded_->staged)
      if (st && st->buffer == b) return true;
    return b == arena_;
  };
  std::vector<Array> outputs;
  for (int o : graph_.outputs) {
    const ArrayNode& v = *values_[o];
    auto node = std::make_shared<ArrayNode>();
    node->shape = v.shape;
    node->dtype = v.dtype;
    node->device = v.device;
    if (graph_.nodes[o].is_input()) {
      // An argument returned as it is: the caller's array, not its staged copy.
      int k = 0;
      for (int j = 0; j < o; ++j) k += graph_.nodes[j].is_input();
      node->buffer = inputs[k].node_ptr()->buffer;
      node->offset = inputs[k].node_ptr()->offset;
    } else if (recording_owns(v.buffer)) {
      // The next replay writes this memory again: the caller gets a copy.
      node->buffer = std::make_shared<Buffer>(&allocator_for(v.device),
                                              numel(v.shape) * size_of(v.dtype), v.device);
      copy_into(Array(values_[o]), *node);
    } else {
      node->buffer = v.buffer;
      node->offset = v.offset;
    }
    node->id = next_array_id();
    outputs.emplace_back(std::move(node));
  }
  // Donated arguments lose their buffers (outputs may live there now).
  for (auto& d : donated_nodes) {
    d->buffer.reset();
    d->donated = true;
  }
  // Keep nothing of this run but a recording's arena and own memory.
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    if (graph_.nodes[i].is_input())
      values_[i].reset();
    else if (plan_.slots[i].kind != MemoryPlan::Kind::Arena)
      values_[i]->buffer.reset();
  }
  return outputs;
}

}  // namespace kiln::compiler
