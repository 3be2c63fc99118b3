// kiln cuda backend: AllReduceStart / AllReduceWait on NCCL, with the host
// kernels' semantics (src/backend/collectives.cpp) on device memory.
//
// Start packs its inputs into the bucket's device buffer on the device's
// stream, then forks to the device's communication stream (an event the latter waits for), queues NCCL's
// in-place sum of the buffer there and records the bucket's `done` event;
// Wait joins back (the device's stream waits for `done`) and copies its slice
// of the sums out, scaled. The host never waits: the exchange runs while the
// kernels queued between the two compute. Fork and join are events, which
// stream capture turns into graph edges, so that a compiled step that starts
// and waits records both into one CUDA Graph. A process alone goes through
// NCCL too (a communicator of one rank): the GPU check runs the path on the
// one GPU it has.
#include <map>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/dynlib.h"
#include "kiln/distributed.h"

namespace kiln::cuda {
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("nccl", std::string(what) + ": " + dyn::ncclGetErrorString(r));
}
#define KILN_NCCL_CHECK(expr) check_nccl((expr), #expr)

// Where the work queued on a stream goes: run, or into capture `id`.
struct Capture {
  bool on = false;
  unsigned long long id = 0;
  bool operator==(const Capture&) const = default;
};

Capture capture_of(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  KILN_CUDA_CHECK(cudaStreamGetCaptureInfo(s, &status, &id));
  if (status == cudaStreamCaptureStatusNone) return {};
  return {true, id};
}

// A gradient bucket on one device: its packed values, and its exchange while
// the device's stream has not waited for it.
struct Bucket {
  void* data = nullptr;  // grows, never shrinks
  size_t capacity = 0;
  DType dtype = DType::f32;
  int64_t count = 0;
  bool started = false;
  cudaEvent_t done = nullptr;  // recorded on the communication stream after the sum
  bool in_flight = false;      // the device's stream has not waited for `done`
  Capture capture;             // where `done` was recorded
};

// One device's collectives: the communication stream, the fork event and the
// NCCL communicator (made by the first exchange), and the buckets.
struct DeviceCollectives {
  cudaStream_t comm_stream = nullptr;
  cudaEvent_t packed = nullptr;
  ncclComm_t comm = nullptr;
  std::map<int, Bucket> buckets;
};

std::mutex g_mu;  // guards every device's DeviceCollectives

DeviceCollectives& collectives(int device) {
  constexpr int kMaxDevices = 64;  // as backend.cpp, which checks the index
  // Never destroyed: recorded graphs hold the buffers, streams and
  // communicators until exit.
  static auto* d = new DeviceCollectives[kMaxDevices];
  return d[device];
}

std::string bucket_name(int id) {
  return "bucket " + std::to_string(id);
}

// Orders the device's stream `s` after the bucket's exchange, where it has
// not waited for it yet. An exchange recorded into a capture that has ended
// is ordered already: the launches of its graph are queued on `s` and end
// with the whole graph (or, where the capture failed, it never ran).
void join(Bucket& b, int id, cudaStream_t s, const char* who) {
  if (!b.in_flight) return;
  const Capture now = capture_of(s);
  if (b.capture == now) {
    KILN_CUDA_CHECK(cudaStreamWaitEvent(s, b.done, 0));
  } else if (!b.capture.on) {
    // A graph may not wait for work queued outside it (the executable then
    // runs op by op, and waits).
    fail(who, bucket_name(id) +
                  "'s exchange was started outside the CUDA Graph being recorded and not "
                  "waited for before it");
  }
  b.in_flight = false;
}

// Grows the bucket's buffer to hold `bytes`, from the device's stream-ordered
// allocator: the memory is ready for what `s` queues next. The old buffer is
// never freed: a recorded graph may still pack into it and sum it. Growing
// while a graph is recorded would make the new buffer the graph's own (a
// captured allocation, gone after each launch), so it fails instead; the
// executable then runs op by op. (Its first run, never recorded, has grown
// the buffer already.)
void reserve(Bucket& b, int id, size_t bytes, Device device, cudaStream_t s) {
  if (bytes <= b.capacity) return;
  if (capture_of(s).on)
    fail("all_reduce_start", bucket_name(id) + " would grow to " + std::to_string(bytes) +
                                 " bytes while a CUDA Graph is recorded");
  b.data = allocator_for(device).allocate(bytes);
  b.capacity = bytes;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    default: fail("all_reduce_start", std::string("no NCCL type for ") + name_of(t));
  }
}

// The device's communication stream and NCCL communicator, made by its first
// exchange: rank 0 makes NCCL's id, the process group hands it to every
// rank, and each joins with the current device, the kernel's (one GPU per
// rank).
void open_communicator(DeviceCollectives& d) {
  if (d.comm) return;
  ncclUniqueId id{};
  if (dist::rank() == 0) KILN_NCCL_CHECK(dyn::ncclGetUniqueId(&id));
  dist::broadcast(&id, sizeof id, 0);
  if (!d.comm_stream) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&d.comm_stream, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&d.packed, cudaEventDisableTiming));
  }
  KILN_NCCL_CHECK(dyn::ncclCommInitRank(&d.comm, dist::size(), id, dist::rank()));
}

// Sums the packed bucket over the ranks, in place, on the communication
// stream once `s` has packed it; `done` marks the end.
void exchange(DeviceCollectives& d, Bucket& b, cudaStream_t s) {
  open_communicator(d);
  if (!b.done) KILN_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaEventRecord(d.packed, s));
  KILN_CUDA_CHECK(cudaStreamWaitEvent(d.comm_stream, d.packed, 0));
  KILN_NCCL_CHECK(dyn::ncclAllReduce(b.data, b.data, static_cast<size_t>(b.count),
                                     nccl_type(b.dtype), ncclSum, d.comm, d.comm_stream));
  KILN_CUDA_CHECK(cudaEventRecord(b.done, d.comm_stream));
  b.in_flight = true;
  b.capture = capture_of(s);
}

void start_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                  ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const int id = p.attrs<CollectiveAttrs>().bucket;
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceCollectives& d = collectives(ctx.device.index);
  Bucket& b = d.buckets[id];
  join(b, id, s, "all_reduce_start");  // the bucket's last exchange must be over
  int64_t count = 0;
  for (const Array& x : in) count += x.size();
  const DType dtype = in[0].dtype();
  reserve(b, id, count * size_of(dtype), ctx.device, s);
  char* dst = static_cast<char*>(b.data);
  for (const Array& x : in) {
    if (x.nbytes() == 0) continue;
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, x.raw(), x.nbytes(), cudaMemcpyDeviceToDevice, s));
    dst += x.nbytes();
  }
  b.dtype = dtype;
  b.count = count;
  b.started = true;
  if (count > 0) exchange(d, b, s);
  // The token only orders the waits after the start: its value is unused.
  KILN_CUDA_CHECK(cudaMemsetAsync(alloc_output(out), 0, sizeof(int64_t), s));
}

template <typename T>
__global__ void scaled_copy(T* y, const T* x, int64_t n, T scale) {
  KILN_GRID_LOOP(i, n) { y[i] = x[i] * scale; }
}

template <typename T>
void launch_scaled_copy(void* y, const void* x, int64_t n, double scale, cudaStream_t s) {
  KILN_LAUNCH(blocks_for(n), 256, 0, s, scaled_copy<T>)
  (static_cast<T*>(y), static_cast<const T*>(x), n, static_cast<T>(scale));
  check_launch("all_reduce_wait");
}

void wait_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>&,
                 ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const auto& a = p.attrs<CollectiveAttrs>();
  std::lock_guard<std::mutex> lock(g_mu);
  auto& buckets = collectives(ctx.device.index).buckets;
  auto it = buckets.find(a.bucket);
  if (it == buckets.end() || !it->second.started)
    fail("all_reduce_wait", bucket_name(a.bucket) + " was never started on " + ctx.device.str());
  Bucket& b = it->second;
  join(b, a.bucket, s, "all_reduce_wait");
  const int64_t n = numel(out.shape);
  if (out.dtype != b.dtype || a.offset < 0 || a.offset + n > b.count)
    fail("all_reduce_wait", bucket_name(a.bucket) + " holds " + std::to_string(b.count) + " " +
                                name_of(b.dtype) + " values, the wait asks for " +
                                std::to_string(n) + " " + name_of(out.dtype) + " at " +
                                std::to_string(a.offset));
  const double scale = a.mean ? 1.0 / dist::size() : 1.0;
  void* y = alloc_output(out);
  if (n == 0) return;
  const size_t elem = size_of(b.dtype);
  const char* x = static_cast<const char*>(b.data) + a.offset * elem;
  if (scale == 1.0)
    KILN_CUDA_CHECK(cudaMemcpyAsync(y, x, n * elem, cudaMemcpyDeviceToDevice, s));
  else if (b.dtype == DType::f32)
    launch_scaled_copy<float>(y, x, n, scale, s);
  else
    launch_scaled_copy<double>(y, x, n, scale, s);
}

}  // namespace

void register_collectives(KernelTable& t) {
  t.kernels[static_cast<int>(Op::AllReduceStart)] = start_kernel;
  t.kernels[static_cast<int>(Op::AllReduceWait)] = wait_kernel;
}

}  // namespace kiln::cuda
