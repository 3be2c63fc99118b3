// kiln cuda backend: Copy between host memory and a GPU (host-to-device
// copies staged through pinned memory and queued asynchronously; a copy to
// the host waits, since the host reads it next) or between GPUs, and Fill.
#include <cstring>
#include <deque>
#include <mutex>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_common.cuh"

namespace kiln::cuda {
namespace {

// Pinned host blocks that host-to-device copies are staged through, so that
// the copy is a DMA queued on the stream (overlapping the kernels queued
// before it) and the source may be reused at once. A block is reused when the
// copy out of it has finished (its event).
class PinnedStaging {
 public:
  // Copies `bytes` from host memory `src` to device memory `dst` on stream s.
  void copy(void* dst, const void* src, size_t bytes, cudaStream_t s) {
    // Held until the block's event is recorded: before that its event still
    // reads as done, and another thread could take the same block.
    std::lock_guard<std::mutex> lock(mu_);
    Block* b = take(bytes);
    std::memcpy(b->ptr, src, bytes);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, b->ptr, bytes, cudaMemcpyHostToDevice, s));
    KILN_CUDA_CHECK(cudaEventRecord(b->done, s));
  }

 private:
  struct Block {
    void* ptr = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  static constexpr size_t kMaxBlocks = 16;

  // A block whose earlier copy has finished (mu_ held).
  Block* take(size_t bytes) {
    for (auto& b : blocks_)
      if (b.bytes >= bytes && cudaEventQuery(b.done) == cudaSuccess) return &b;
    cudaGetLastError();  // cudaErrorNotReady from the queries
    if (blocks_.size() >= kMaxBlocks) {
      // Every block busy or too small: wait for the oldest and grow it.
      Block& b = blocks_.front();
      KILN_CUDA_CHECK(cudaEventSynchronize(b.done));
      if (b.bytes < bytes) {
        KILN_CUDA_CHECK(cudaFreeHost(b.ptr));
        b.ptr = nullptr;
        b.bytes = 0;  // never taken again should the allocation below fail
        KILN_CUDA_CHECK(cudaHostAlloc(&b.ptr, bytes, cudaHostAllocDefault));
        b.bytes = bytes;
      }
      blocks_.push_back(b);
      blocks_.pop_front();
      return &blocks_.back();
    }
    Block b;
    KILN_CUDA_CHECK(cudaHostAlloc(&b.ptr, bytes, cudaHostAllocDefault));
    b.bytes = bytes;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
    blocks_.push_back(b);
    return &blocks_.back();
  }

  std::mutex mu_;
  std::deque<Block> blocks_;
};

// One per device: a block's event belongs to the device that was current
// when it was made, and can be recorded only on that device's streams.
PinnedStaging& staging(int device) {
  constexpr int kMaxDevices = 64;  // as backend.cpp, which checks the index
  static auto* s = new PinnedStaging[kMaxDevices];  // never destroyed: copies may run during exit
  return s[device];
}

// A CUDA event destroyed at the end of its scope (its pending record completes).
struct ScopedEvent {
  cudaEvent_t e = nullptr;
  ~ScopedEvent() {
    if (e) cudaEventDestroy(e);
  }
};

void copy_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const Device from = in[0].device(), to = out.device;
  const size_t bytes = in[0].nbytes();
  void* dst = alloc_output(out);
  if (bytes == 0) return;
  const void* src = in[0].raw();
  if (from.host_visible()) {
    staging(to.index).copy(dst, src, bytes, s);
  } else if (to.host_visible()) {
    // The host reads the value next: queue the copy and wait for it.
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  } else if (from.index == to.index) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  } else {
    // Between GPUs, ordered by events, not by the host: the copy waits for
    // the source's queue to produce src, and the source's queue waits for the
    // copy, so that src freed there later (stream-ordered) is not reused while
    // the copy still reads it.
    const cudaStream_t from_s = stream(from.index);
    ScopedEvent produced, copied;
    use_device(from.index);
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&produced.e, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(produced.e, from_s));
    use_device(to.index);
    KILN_CUDA_CHECK(cudaStreamWaitEvent(s, produced.e, 0));
    KILN_CUDA_CHECK(cudaMemcpyPeerAsync(dst, to.index, src, from.index, bytes, s));
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&copied.e, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(copied.e, s));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(from_s, copied.e, 0));
  }
}

template <typename T>
__global__ void fill(T* y, int64_t n, double start, double step) {
  KILN_GRID_LOOP(i, n) { y[i] = convert<T>(start + static_cast<double>(i) * step); }
}

void fill_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>&,
                 ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const auto& a = p.attrs<FillAttrs>();
  const int64_t n = numel(out.shape);
  visit_dtype(out.dtype, "fill", [&](auto t) {
    using T = decltype(t);
    T* y = out_ptr<T>(out);
    if (n == 0) return;
    KILN_LAUNCH(blocks_for(n), 256, 0, s, fill<T>)(y, n, a.start, a.step);
    check_launch("fill");
  });
}

}  // namespace

void register_transfer(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Copy)] = copy_kernel;
  t.kernels[static_cast<int>(Op::Fill)] = fill_kernel;
}

}  // namespace kiln::cuda
