// kiln ref backend: its allocator (plain aligned host memory), the shared
// f64 load/store and index helpers, Copy and Fill, an emulation of a device
// that records and replays runs (as CUDA Graphs do), and its registration.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "backend/collectives.h"
#include "backend/ref/ref_common.h"
#include "core/registration.h"
#include "kiln/allocator.h"

namespace kiln::ref {
namespace {

// Every buffer straight from the system: no caching, nothing clever.
class RefAllocator : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void release(void* ptr, size_t) override { std::free(ptr); }
};

void copy_kernel(const KernelContext&, const Primitive&,
                 const std::vector<Array>& in, ArrayNode& out) {
  if (!in[0].device().host_visible())
    fail("copy", "from " + in[0].device().str() + " to " + out.device.str() +
                     ": the ref backend reads host memory only");
  void* y = alloc_output(out);
  if (in[0].nbytes()) std::memcpy(y, in[0].raw(), in[0].nbytes());
}

void fill_kernel(const KernelContext&, const Primitive& p,
                 const std::vector<Array>&, ArrayNode& out) {
  const auto& a = p.attrs<FillAttrs>();
  std::vector<double> v(numel(out.shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = a.start + static_cast<double>(i) * a.step;
  store(out, v);
}

// Recording, emulated: between begin and end, every kernel but the alias
// ones (which only point their output at an input's memory, as on a GPU) is
// kept as a call on the memory it was given, not run. As a CUDA Graph bakes
// in its kernels' pointers, each call keeps the buffers its inputs and
// output had when it was recorded, and a replay reads and writes those: an
// executable that replays a recording after moving a value elsewhere gets
// stale results here as it would on a GPU, and the tests see them.
struct Call {
  Kernel kernel;
  Primitive prim;
  std::vector<Array> inputs;            // views of the recorded memory
  std::shared_ptr<ArrayNode> output;    // a view of the recorded memory
};
struct Recording {
  std::vector<Call> calls;
};
thread_local Recording* g_recording = nullptr;
Kernel g_kernels[kOpCount] = {};

template <int I>
void recording_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                      ArrayNode& out) {
  constexpr Op op = static_cast<Op>(I);
  if (!g_recording || op_has(op, kAlias)) return g_kernels[I](ctx, p, in, out);
  if (!out.buffer) fail(op_name(op), "recorded with no output memory");
  Call c{g_kernels[I], p, {}, view_of(out)};
  for (const Array& a : in) c.inputs.emplace_back(view_of(*a.node_ptr()));
  g_recording->calls.push_back(std::move(c));
}

template <int... I>
void route_through_recording(KernelTable& t, std::integer_sequence<int, I...>) {
  ((g_kernels[I] = t.kernels[I], t.kernels[I] = t.kernels[I] ? recording_kernel<I> : nullptr), ...);
}

bool begin_recording(Device) {
  if (g_recording) return false;
  g_recording = new Recording();
  return true;
}
void* end_recording(Device) {
  Recording* r = g_recording;
  g_recording = nullptr;
  return r;
}
void replay(Device d, void* recording) {
  const KernelContext ctx{d, nullptr, &allocator_for(d)};
  for (Call& c : static_cast<Recording*>(recording)->calls)
    c.kernel(ctx, c.prim, c.inputs, *c.output);
}
void release_recording(Device, void* recording) {
  delete static_cast<Recording*>(recording);
}

}  // namespace

std::vector<double> load(const Array& a) {
  std::vector<double> v(a.size());
  convert(a.raw(), a.dtype(), v.data(), DType::f64, a.size());
  return v;
}

void store(ArrayNode& out, const std::vector<double>& v) {
  void* y = alloc_output(out);
  convert(v.data(), DType::f64, y, out.dtype, static_cast<int64_t>(v.size()));
}

std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = s[d] ? i % s[d] : 0;
    i = s[d] ? i / s[d] : 0;
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t i = 0;
  for (size_t d = 0; d < s.size(); ++d) i = i * s[d] + idx[d];
  return i;
}

int64_t broadcast_index(const std::vector<int64_t>& out_idx, const Shape& s) {
  const size_t lead = out_idx.size() - s.size();
  int64_t i = 0;
  for (size_t d = 0; d < s.size(); ++d) i = i * s[d] + (s[d] == 1 ? 0 : out_idx[lead + d]);
  return i;
}

void register_transfer(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Copy)] = copy_kernel;
  t.kernels[static_cast<int>(Op::Fill)] = fill_kernel;
}

void register_backend() {
  static RefAllocator allocator;
  static KernelTable table;
  register_elementwise(table);
  register_reduce(table);
  register_matmul(table);
  register_layout(table);
  register_nn(table);
  register_conv(table);
  register_fused(table);
  register_random(table);
  register_transfer(table);
  dist::register_host_collectives(table);
  route_through_recording(table, std::make_integer_sequence<int, kOpCount>{});
  table.begin_recording = begin_recording;
  table.end_recording = end_recording;
  table.replay = replay;
  table.release_recording = release_recording;
  register_allocator(DeviceType::ref, &allocator);
  register_kernels(DeviceType::ref, &table);
}

}  // namespace kiln::ref
