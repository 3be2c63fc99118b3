// kiln ops: how a primitive reaches a backend kernel, and the per-thread
// execution state (eager or lazy, whether graph edges are being kept).
#pragma once
#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/array_node.h"
#include "kiln/array.h"
#include "ops/primitive.h"

namespace kiln {

// What a kernel runs with: the device it runs on, that device's stream (null
// for the host backends, whose kernels finish before they return; a queue
// on a device that runs asynchronously, so that ops are enqueued in order and
// only reading a value waits), and the allocator for scratch memory that
// lives until the kernel returns.
struct KernelContext {
  Device device;
  void* stream = nullptr;
  Allocator* scratch = nullptr;
};

// A kernel reads its materialized inputs and materializes `out` (whose shape
// and dtype are already set): it allocates out's buffer, or aliases an input's.
using Kernel = void (*)(const KernelContext& ctx, const Primitive& prim,
                        const std::vector<Array>& inputs, ArrayNode& out);

// What a backend states about what it runs: for each primitive whether it
// runs it with the given attributes on inputs of the given dtypes (its
// output of dtype `out`). The compiler's fusion passes ask before they make a
// fused primitive (a GEMM epilogue's steps, ...), instead of assuming what
// one backend's library does. Without `supports`, a backend runs every
// primitive it has a kernel for.
using Supports = bool (*)(const Primitive& prim, const std::vector<DType>& inputs, DType out);

struct KernelTable {
  std::array<Kernel, kOpCount> kernels{};
  Supports supports = nullptr;
  // A device that runs asynchronously: the stream its kernels queue on (the
  // KernelContext's), and a wait for everything queued on it. Null on the
  // host backends, whose kernels finish before they return.
  void* (*stream)(Device) = nullptr;
  void (*synchronize)(Device) = nullptr;
  // A backend that records a run of kernels and replays it as one launch
  // (CUDA Graphs; the ref backend emulates one, so that every machine tests
  // the compiled executables that use it). Between begin_recording and
  // end_recording the kernels this thread runs on `device` are recorded with
  // the memory they read and write, not run; end_recording returns the
  // recording, or null when the backend could not record it (its kernels
  // then never ran). replay queues a recording; release frees it.
  bool (*begin_recording)(Device) = nullptr;
  void* (*end_recording)(Device) = nullptr;
  void (*replay)(Device, void* recording) = nullptr;
  void (*release_recording)(Device, void* recording) = nullptr;
};

// The entries every backend's table fills alike: the views (kAlias ops,
// whose output is their input's memory: no kernel computes anything) and
// every scalar op, given the backend's kernel for its kind (unary, binary or
// comparison).
void register_views_and_scalar_ops(KernelTable& t, Kernel unary, Kernel binary, Kernel compare);

// The recording functions of `device`'s backend (null members where it has
// none; see KernelTable).
const KernelTable* kernel_table(Device device);

void register_kernels(DeviceType type, const KernelTable* table);
// Whether the backend of `device` runs `prim` (see Supports); false where the
// device has no backend or the backend no kernel for the op.
bool backend_supports(Device device, const Primitive& prim, const std::vector<DType>& inputs,
                      DType out);
// KILN_DEBUG's level (0 when unset), read once.
int debug_level();

// A fused primitive runs its definition's fallback of basic primitives
// (ops/op_defs.h) in place of its kernel where the backend has none, and on
// every backend when it is named in KILN_FALLBACK (primitive names separated
// by commas, or "all": to tell a wrong kernel from a wrong graph) or given to
// set_forced_fallbacks (which replaces that list). KILN_DEBUG=1 says so once
// per op and device.
void set_forced_fallbacks(const std::vector<Op>& ops);
// Whether `op` runs its fallback on `device`.
bool runs_fallback(Device device, Op op);
// Kernel time per primitive, collected when KILN_PROFILE=1; with
// KILN_PROFILE=shapes also per primitive and operand shapes (the top lines).
struct KernelProfile {
  bool enabled = false;
  bool by_shape = false;
  std::mutex mu;
  std::array<double, kOpCount> seconds{};
  std::array<uint64_t, kOpCount> calls{};
  std::unordered_map<std::string, std::pair<double, uint64_t>> shapes;  // key: op and shapes
  std::string report();
  void reset();
};
KernelProfile& kernel_profile();

// Runs node's primitive on its (materialized) inputs.
void run_kernel(ArrayNode& node);
// Runs `prim` on `inputs` into `out` (for executables, which keep no edges).
void run_kernel_with(const Primitive& prim, const std::vector<Array>& inputs, ArrayNode& out);

// The output memory of a kernel: preassigned by a compiled executable, or a
// new buffer on the node's device.
void* alloc_output(ArrayNode& out);

struct ExecState {
  bool lazy = false;          // record instead of run
  bool check_finite = false;  // kernels check their outputs for NaN and Inf
  int keep_graph = 0;         // > 0 while a function is traced for differentiation
};
ExecState& exec_state();

// Creates the array that `prim` computes from `inputs`; runs it at once in
// eager mode, records it otherwise. An elementwise kernel may be offered input
// `reuse` (its shape and dtype the output's) for its output buffer; eager
// mode takes it when no handle, view or VJP rule can read that input again.
// The array is on `device` where given (an op without inputs: a random
// draw), else on its inputs' device (a Copy: on the device it copies to).
Array make_array(Primitive prim, std::vector<Array> inputs, Shape shape, DType dtype,
                 int reuse = -1, std::optional<Device> device = std::nullopt);
// make_array typed by the primitive's shape and dtype rule (ops/op_defs.h):
// how every op makes its node but the few whose type the rule does not fix
// (Fill, AllReduceWait). Fails, naming the primitive, where the inputs do
// not fit it.
Array apply(Primitive prim, std::vector<Array> inputs, int reuse = -1,
            std::optional<Device> device = std::nullopt);

// Drops a materialized node's graph edges (its producer and inputs).
void detach(ArrayNode& node);

// A materialized node on `n`'s memory (its shape, dtype, device, buffer and
// offset; no graph): a view that keeps the buffer alive.
std::shared_ptr<ArrayNode> view_of(const ArrayNode& n);

// Ends eager differentiation's watch over intermediates whose buffers it may
// free (see make_array); called when the outermost vjp returns.
void forget_release_candidates();

}  // namespace kiln
