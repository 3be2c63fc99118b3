// kiln ops: kernel dispatch and array construction.
#include "ops/dispatch.h"

#include "core/registration.h"
#include "kiln/ops.h"
#include "ops/op_defs.h"
#include "ops/op_facts.h"
#include "ops/vjp.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>

namespace kiln {
namespace {
const KernelTable* g_tables[kDeviceTypes] = {};
}

void register_kernels(DeviceType type, const KernelTable* table) {
  g_tables[static_cast<int>(type)] = table;
}

namespace {
const KernelTable* table_for(DeviceType type) {
  register_builtin_backends();
  return g_tables[static_cast<int>(type)];
}
}  // namespace

namespace {
void alias_kernel(const KernelContext&, const Primitive&, const std::vector<Array>& in,
                  ArrayNode& out) {
  out.buffer = in[0].node()->buffer;
  out.offset = in[0].node()->offset;
}
}  // namespace

void register_views_and_scalar_ops(KernelTable& t, Kernel unary, Kernel binary, Kernel compare) {
  for (int i = 0; i < kOpCount; ++i) {
    const Op op = static_cast<Op>(i);
    if (op_has(op, kAlias)) t.kernels[i] = alias_kernel;
    if (!op_has(op, kScalar)) continue;
    const OpKind kind = op_kind(op);
    t.kernels[i] = kind == OpKind::Unary ? unary : kind == OpKind::Binary ? binary : compare;
  }
}

int debug_level() {
  static const int level = [] {
    const char* e = std::getenv("KILN_DEBUG");
    return e ? std::atoi(e) : 0;
  }();
  return level;
}

const KernelTable* kernel_table(Device device) {
  return table_for(device.type);
}

namespace {

// The ops that run their fallback in place of their kernel everywhere.
struct ForcedFallbacks {
  std::array<std::atomic<bool>, kOpCount> op{};
  ForcedFallbacks() {
    const char* e = std::getenv("KILN_FALLBACK");
    if (!e || !*e) return;
    std::stringstream list(e);
    for (std::string name; std::getline(list, name, ',');) {
      bool found = false;
      for (int i = 0; i < kOpCount; ++i) {
        const bool named = name == "all" || name == op_name(static_cast<Op>(i));
        if (named && op_def(static_cast<Op>(i)).fallback) op[i] = found = true;
      }
      if (!found)
        fail("KILN_FALLBACK", "'" + name +
                                  "' is not a primitive with a fallback; expected fused "
                                  "primitives' names (Attention, LayerNorm, ...) or all");
    }
  }
};
ForcedFallbacks& forced_fallbacks() {
  static ForcedFallbacks f;
  return f;
}

bool use_fallback(const KernelTable* table, Op op) {
  if (!op_def(op).fallback) return false;
  return !table || !table->kernels[static_cast<int>(op)] ||
         forced_fallbacks().op[static_cast<int>(op)];
}

// Runs prim's fallback eagerly (no graph kept: a kernel's work), then copies
// the value, converted to out's dtype, into out.
void run_fallback(const Primitive& prim, const std::vector<Array>& inputs, ArrayNode& out) {
  if (debug_level() >= 1) {
    static std::mutex mu;
    static std::set<std::pair<int, std::string>> said;
    std::lock_guard<std::mutex> lock(mu);
    if (said.insert({static_cast<int>(prim.op()), out.device.str()}).second)
      std::fprintf(
          stderr, "[fallback] %s on %s runs its fallback of basic primitives (%s)\n", prim.name(),
          out.device.str().c_str(),
          forced_fallbacks().op[static_cast<int>(prim.op())] ? "KILN_FALLBACK" : "no kernel there");
  }
  ExecState& st = exec_state();
  struct Restore {
    ExecState& st;
    ExecState saved;
    ~Restore() { st = saved; }
  } restore{st, st};
  st.lazy = false;
  st.keep_graph = 0;
  Array r = op_def(prim.op()).fallback(prim, inputs, {out.shape, out.dtype});
  if (r.dtype() != out.dtype) r = astype(r, out.dtype);
  if (r.shape() != out.shape)
    fail(prim.name(), "its fallback made " + str(r.shape()) + ", expected " + str(out.shape));
  run_kernel_with(Primitive(Op::Copy, DeviceAttrs{out.device}), {r}, out);
}

}  // namespace

void set_forced_fallbacks(const std::vector<Op>& ops) {
  ForcedFallbacks& f = forced_fallbacks();
  for (auto& x : f.op) x = false;
  for (Op op : ops) f.op[static_cast<int>(op)] = op_def(op).fallback != nullptr;
}

bool runs_fallback(Device device, Op op) {
  return use_fallback(table_for(device.type), op);
}

bool backend_supports(Device device, const Primitive& prim, const std::vector<DType>& inputs,
                      DType out) {
  const KernelTable* table = table_for(device.type);
  if (!table || !table->kernels[static_cast<int>(prim.op())]) return false;
  return !table->supports || table->supports(prim, inputs, out);
}

bool fused_attention_runs_in(Device device, DType dtype) {
  return backend_supports(device, Primitive(Op::Attention, AttentionAttrs{1.0}), {dtype}, dtype);
}

bool sdpa_runs_in(Device device, DType dtype, bool causal) {
  return backend_supports(device, Primitive(Op::Sdpa, SdpaAttrs{1.0, causal, false}),
                          {dtype, dtype, dtype}, dtype);
}

KernelProfile& kernel_profile() {
  static KernelProfile* p = [] {
    auto* k = new KernelProfile();  // never destroyed: kernels may run during exit
    const char* e = std::getenv("KILN_PROFILE");
    k->enabled = e && *e && *e != '0';
    k->by_shape = e && std::string(e) == "shapes";
    return k;
  }();
  return *p;
}

namespace {

void check_finite(const Primitive& prim, const std::vector<Array>& inputs, const ArrayNode& out) {
  if (!out.buffer ||
      (out.dtype != DType::f32 && out.dtype != DType::f64 && out.dtype != DType::bf16))
    return;
  // A device's own memory is read through a copy to the host (the check
  // waits for the device: it is a debugging switch).
  ArrayNode host;
  if (!out.device.host_visible()) {
    host.shape = out.shape;
    host.dtype = out.dtype;
    host.device = Device::cpu();
    run_kernel_with(Primitive(Op::Copy, DeviceAttrs{Device::cpu()}), {Array(view_of(out))}, host);
  }
  const ArrayNode& h = out.device.host_visible() ? out : host;
  const char* base = static_cast<const char*>(h.buffer->data()) + h.offset;
  int64_t n = numel(out.shape);
  int64_t nan = 0, inf = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = out.dtype == DType::f32 ? reinterpret_cast<const float*>(base)[i]
               : out.dtype == DType::f64
                   ? reinterpret_cast<const double*>(base)[i]
                   : static_cast<float>(reinterpret_cast<const bf16*>(base)[i]);
    nan += std::isnan(v);
    inf += std::isinf(v);
  }
  if (!nan && !inf) return;
  std::string ins;
  for (const auto& a : inputs) ins += (ins.empty() ? "" : ", ") + str(a.shape());
  fail("nan-check", prim.str() + " produced " + std::to_string(nan) + " NaN and " +
                        std::to_string(inf) + " infinite values in its " + name_of(out.dtype) +
                        str(out.shape) + " output, from inputs " + ins);
}

}  // namespace

void run_kernel_with(const Primitive& prim, const std::vector<Array>& inputs, ArrayNode& out) {
  // A kernel runs on its output's device; a copy between host memory and a
  // device's own memory runs on that device's backend (either direction).
  Device on = out.device;
  if (op_kind(prim.op()) == OpKind::Transfer && on.host_visible() &&
      !inputs[0].device().host_visible())
    on = inputs[0].device();
  const KernelTable* table = table_for(on.type);
  if (!table)
    fail(prim.name(), "no backend is available for " + on.str() +
                          (on.type == DeviceType::cuda ? ": " + cuda_unavailable_reason() : ""));
  if (use_fallback(table, prim.op())) return run_fallback(prim, inputs, out);
  Kernel k = table->kernels[static_cast<int>(prim.op())];
  if (!k) fail(prim.name(), "no kernel on " + on.str());
  const KernelContext ctx{on, table->stream ? table->stream(on) : nullptr, &allocator_for(on)};
  KernelProfile& prof = kernel_profile();
  if (exec_state().check_finite) {
    k(ctx, prim, inputs, out);
    return check_finite(prim, inputs, out);
  }
  if (!prof.enabled) return k(ctx, prim, inputs, out);
  // An asynchronous device is waited for before and after the kernel, so
  // that the time is the kernel's own.
  if (table->synchronize) table->synchronize(on);
  auto t0 = std::chrono::steady_clock::now();
  k(ctx, prim, inputs, out);
  if (table->synchronize) table->synchronize(on);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string key;
  if (prof.by_shape) {
    key = std::string(op_name(prim.op())) + " -> " + name_of(out.dtype) + str(out.shape) +
          (inputs.empty() ? "" : " from");
    for (const Array& x : inputs) key += std::string(" ") + name_of(x.dtype()) + str(x.shape());
  }
  std::lock_guard<std::mutex> lock(prof.mu);
  prof.seconds[static_cast<int>(prim.op())] += s;
  prof.calls[static_cast<int>(prim.op())] += 1;
  if (prof.by_shape) {
    auto& [sec, calls] = prof.shapes[key];
    sec += s;
    calls += 1;
  }
}

void synchronize(Device device) {
  const KernelTable* table = table_for(device.type);
  if (table && table->synchronize) table->synchronize(device);
}

void* device_stream(Device device) {
  if (device.host_visible()) return nullptr;
  const KernelTable* table = table_for(device.type);
  if (!table || !table->stream)
    fail("device_stream",
         "no backend is available for " + device.str() +
             (device.type == DeviceType::cuda ? ": " + cuda_unavailable_reason() : ""));
  return table->stream(device);
}

bool kernel_profile_enabled() {
  return kernel_profile().enabled;
}
std::string kernel_profile_report() {
  return kernel_profile().report();
}
void kernel_profile_reset() {
  kernel_profile().reset();
}

void KernelProfile::reset() {
  std::lock_guard<std::mutex> lock(mu);
  seconds.fill(0);
  calls.fill(0);
  shapes.clear();
}

std::string KernelProfile::report() {
  std::lock_guard<std::mutex> lock(mu);
  double total = 0;
  std::vector<int> order;
  for (int i = 0; i < kOpCount; ++i) {
    total += seconds[i];
    if (calls[i]) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) { return seconds[a] > seconds[b]; });
  std::ostringstream os;
  os << "kernel time by primitive (KILN_PROFILE), total " << total << " s\n";
  for (int i : order) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-26s %9.3f s %6.1f%% %9llu calls\n",
                  op_name(static_cast<Op>(i)), seconds[i], 100 * seconds[i] / total,
                  static_cast<unsigned long long>(calls[i]));
    os << line;
  }
  if (by_shape) {
    std::vector<std::pair<std::string, std::pair<double, uint64_t>>> rows(shapes.begin(),
                                                                          shapes.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    // KILN_PROFILE_TOP=N shows N rows (40 otherwise, or where N is not a
    // positive number).
    const char* top = std::getenv("KILN_PROFILE_TOP");
    const long asked = top ? std::strtol(top, nullptr, 10) : 0;
    const size_t kTop = asked > 0 ? static_cast<size_t>(asked) : 40;
    os << "by primitive and shapes (KILN_PROFILE=shapes), the " << std::min(kTop, rows.size())
       << " of " << rows.size() << " that took longest\n";
    for (size_t i = 0; i < std::min(kTop, rows.size()); ++i) {
      char line[64];
      std::snprintf(line, sizeof line, "  %9.3f s %6.1f%% %7llu calls  ", rows[i].second.first,
                    100 * rows[i].second.first / total,
                    static_cast<unsigned long long>(rows[i].second.second));
      os << line << rows[i].first << "\n";
    }
  }
  return os.str();
}

void run_kernel(ArrayNode& node) {
  run_kernel_with(*node.primitive, node.inputs, node);
}

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

std::shared_ptr<ArrayNode> view_of(const ArrayNode& n) {
  auto v = std::make_shared<ArrayNode>();
  v->shape = n.shape;
  v->dtype = n.dtype;
  v->device = n.device;
  v->buffer = n.buffer;
  v->offset = n.offset;
  return v;
}

void detach(ArrayNode& node) {
  node.primitive.reset();
  node.drop_inputs();
}

bool drop_graph(const Array& a) {
  if (!a.valid() || !a.node()->buffer) return false;
  detach(*a.node());
  return true;
}

namespace {

// Eager differentiation (a function traced by vjp/grad while it runs): the
// intermediates whose values no VJP rule reads, waiting for their last
// handle outside the graph to go. Then only graph edges refer to them, no new
// consumer can appear, and their buffers are freed (PyTorch's autograd keeps
// only the tensors its backward saved, likewise). A freed value read anyway
// would be recomputed by eval() from its inputs.
std::vector<std::weak_ptr<ArrayNode>>& release_candidates() {
  thread_local std::vector<std::weak_ptr<ArrayNode>> c;
  return c;
}

// Gives `node` input `i`'s buffer when only `node` refers to the input (its
// handle was given up, no other node reads it, no view shares its buffer,
// it was not donated) and no VJP rule reads its value: the kernel then writes
// its result in place (elementwise kernels allow y to alias an input of the
// same shape), and the input drops the buffer once the kernel has run.
bool reuse_input_buffer(ArrayNode& node, int i) {
  static const bool enabled = [] {
    const char* e = std::getenv("KILN_EAGER_INPLACE");
    return !(e && std::string(e) == "0");
  }();
  if (!enabled || i < 0 || i >= static_cast<int>(node.inputs.size()) ||
      !op_has(node.primitive->op(), kInPlace))
    return false;
  const std::shared_ptr<ArrayNode>& in = node.inputs[i].node_ptr();
  if (in.use_count() != 1 || in->value_needed || in->donated || !in->buffer ||
      in->buffer.use_count() != 1 || in->offset != 0 || in->shape != node.shape ||
      in->dtype != node.dtype || in->device != node.device ||
      in->buffer->bytes() != numel(node.shape) * size_of(node.dtype))
    return false;
  node.buffer = in->buffer;
  node.offset = 0;
  return true;
}

void release_unneeded() {
  auto& c = release_candidates();
  size_t kept = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    std::shared_ptr<ArrayNode> n = c[i].lock();
    if (!n || n->value_needed || !n->buffer || !n->primitive) continue;
    // use_count counts `n` here, the graph edges and any other handles.
    if (n.use_count() - 1 == n->graph_users.load(std::memory_order_relaxed)) {
      n->buffer.reset();
      continue;
    }
    c[kept++] = c[i];
  }
  c.resize(kept);
}

}  // namespace

void forget_release_candidates() {
  release_candidates().clear();
}

Array make_array(Primitive prim, std::vector<Array> inputs, Shape shape, DType dtype, int reuse,
                 std::optional<Device> device) {
  for (auto& in : inputs)
    if (!in.valid()) fail(prim.name(), "use of an empty Array handle as an input");
  auto node = std::make_shared<ArrayNode>();
  node->shape = std::move(shape);
  node->dtype = dtype;
  // A transfer makes its value on the device its attributes name; every
  // other op runs on its inputs' device.
  const bool transfer = op_kind(prim.op()) == OpKind::Transfer;
  node->device = transfer         ? prim.attrs<DeviceAttrs>().to
                 : device         ? *device
                 : inputs.empty() ? Device::cpu()
                                  : inputs[0].device();
  for (auto& in : inputs)
    if (!transfer && in.device() != node->device)
      fail(prim.name(),
           "inputs on different devices: " + node->device.str() + " and " + in.device().str());
  node->primitive = std::make_shared<Primitive>(std::move(prim));
  node->inputs = std::move(inputs);
  for (auto& in : node->inputs) in.node()->graph_users.fetch_add(1, std::memory_order_relaxed);
  node->id = next_array_id();
  ExecState& st = exec_state();
  if (!st.lazy) {
    for (auto& in : node->inputs) in.eval();
    const bool reused = reuse >= 0 && reuse_input_buffer(*node, reuse);
    run_kernel(*node);
    if (reused) node->inputs[reuse].node()->buffer.reset();
    if (st.keep_graph == 0) {
      detach(*node);
    } else {
      const VjpReads reads = vjp_reads(node->primitive->op());
      for (size_t i = 0; i < node->inputs.size(); ++i)
        if (reads.input(i)) node->inputs[i].node()->value_needed = true;
      if (reads.output) node->value_needed = true;
      release_unneeded();
      if (!node->value_needed) release_candidates().push_back(node);
    }
  }
  return Array(std::move(node));
}

Array apply(Primitive prim, std::vector<Array> inputs, int reuse, std::optional<Device> device) {
  std::vector<Aval> in;
  in.reserve(inputs.size());
  for (const Array& x : inputs) {
    if (!x.valid()) fail(prim.name(), "use of an empty Array handle as an input");
    in.push_back({x.shape(), x.dtype()});
  }
  Aval out = infer_type(prim, in);
  return make_array(std::move(prim), std::move(inputs), std::move(out.shape), out.dtype, reuse,
                    device);
}

}  // namespace kiln
