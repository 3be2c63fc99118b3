// kiln cuda backend: devices, their streams and stream-ordered caching
// allocators, the kernel table and its registration, and the public device
// functions (count, name, synchronize, memory statistics).
#include <cstdlib>
#include <memory>
#include <mutex>

#include "backend/cuda/cuda_common.h"
#include "core/registration.h"
#include "kiln/device.h"

namespace kiln::cuda {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a sticky-free error so that the next call starts clean
  fail("cuda", std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

void check_launch(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail("cuda", std::string("launch of ") + kernel + ": " + cudaGetErrorString(e));
}

namespace {

// The devices this process sees, counted once. A missing driver or GPU is
// not an error until a CUDA device is used.
struct Devices {
  int count = 0;
  std::string reason;  // why count is 0
};

const Devices& devices() {
  static const Devices d = [] {
    Devices r;
    cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      cudaGetLastError();
      r.count = 0;
      r.reason = std::string("no usable CUDA driver or GPU (") + cudaGetErrorName(e) + ": " +
                 cudaGetErrorString(e) + ")";
    } else if (r.count == 0) {
      r.reason = "no CUDA GPU is visible";
    }
    return r;
  }();
  return d;
}

// One device's state: its stream (ops queue on it in program order; the
// host waits only where it reads a value) and its memory pool.
struct DeviceState {
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  DeviceInfo info;
};

constexpr int kMaxDevices = 64;
std::once_flag g_once[kMaxDevices];
DeviceState g_state[kMaxDevices];

void check_index(int index) {
  const Devices& d = devices();
  if (d.count == 0) fail("cuda", "cuda:" + std::to_string(index) + " is not available: " + d.reason);
  if (index < 0 || index >= d.count || index >= kMaxDevices)
    fail("cuda", "cuda:" + std::to_string(index) + ": no such device (" +
                     std::to_string(d.count) + " CUDA device" + (d.count == 1 ? "" : "s") +
                     " visible)");
}

DeviceState& state(int index) {
  check_index(index);
  std::call_once(g_once[index], [index] {
    DeviceState& s = g_state[index];
    KILN_CUDA_CHECK(cudaSetDevice(index));
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&s.pool, index));
    // Keep freed memory in the pool: a training step that repeats its
    // allocations takes them from the cache, never from the driver.
    uint64_t keep = UINT64_MAX;
    KILN_CUDA_CHECK(cudaMemPoolSetAttribute(s.pool, cudaMemPoolAttrReleaseThreshold, &keep));
    cudaDeviceProp p{};
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
    s.info.name = p.name;
    s.info.multiprocessors = p.multiProcessorCount;
    s.info.major = p.major;
    s.info.minor = p.minor;
    s.info.shared_per_block_optin = p.sharedMemPerBlockOptin;
    s.info.total_memory = p.totalGlobalMem;
  });
  return g_state[index];
}

// A stream-ordered caching allocator on one device: CUDA's memory pool
// (cudaMallocFromPoolAsync / cudaFreeAsync on the device's stream), so that a
// buffer freed while kernels that read it are still queued is reused only by
// work queued after them. Counts bytes in use and the peak, like the CPU's.
class CudaAllocator : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}
  void* allocate(size_t bytes) override {
    DeviceState& s = state(index_);
    KILN_CUDA_CHECK(cudaSetDevice(index_));
    void* p = nullptr;
    cudaError_t e = cudaMallocFromPoolAsync(&p, bytes ? bytes : 1, s.pool, s.stream);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      std::lock_guard<std::mutex> lock(mu_);
      fail("cuda", "out of memory on cuda:" + std::to_string(index_) + " allocating " +
                       std::to_string(bytes) + " bytes (" + std::to_string(stats_.bytes_in_use) +
                       " bytes in use by kiln)");
    }
    check(e, "cudaMallocFromPoolAsync");
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_in_use += bytes;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.bytes_in_use);
    stats_.system_allocs += 1;
    return p;
  }
  void release(void* ptr, size_t bytes) override {
    // Arrays may outlive the driver at exit; a failed free then is harmless.
    if (cudaSetDevice(index_) == cudaSuccess) cudaFreeAsync(ptr, g_state[index_].stream);
    cudaGetLastError();
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_in_use -= std::min(bytes, stats_.bytes_in_use);
  }
  AllocatorStats stats() {
    AllocatorStats s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = stats_;
    }
    uint64_t reserved = 0;
    if (cudaMemPoolGetAttribute(state(index_).pool, cudaMemPoolAttrReservedMemCurrent, &reserved) ==
        cudaSuccess)
      s.bytes_reserved = reserved;
    s.bytes_cached = s.bytes_reserved > s.bytes_in_use ? s.bytes_reserved - s.bytes_in_use : 0;
    return s;
  }

 private:
  int index_;
  std::mutex mu_;
  AllocatorStats stats_;
};

CudaAllocator& allocator(int index) {
  check_index(index);
  // Never destroyed: arrays in static storage may be freed during exit.
  static CudaAllocator* allocs[kMaxDevices] = {};
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!allocs[index]) allocs[index] = new CudaAllocator(index);
  return *allocs[index];
}

Allocator* allocator_of(Device d) {
  return &allocator(d.index);
}

void* stream_of(Device d) {
  return stream(d.index);
}

// Recording is stream capture: the kernels queued on the device's stream by
// this thread become a CUDA Graph, instantiated once and launched as one.
bool begin_recording(Device d) {
  use_device(d.index);
  if (cudaStreamBeginCapture(stream(d.index), cudaStreamCaptureModeThreadLocal) == cudaSuccess)
    return true;
  cudaGetLastError();
  return false;
}

void* end_recording(Device d) {
  use_device(d.index);
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(stream(d.index), &graph);
  if (e != cudaSuccess || !graph) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return exec;
}

void replay(Device d, void* recording) {
  use_device(d.index);
  KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(recording), stream(d.index)));
}

void release_recording(Device d, void* recording) {
  // At exit the driver may be gone already; the graph goes with it.
  if (cudaSetDevice(d.index) == cudaSuccess)
    cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(recording));
  cudaGetLastError();
}

void synchronize_device(Device d) {
  use_device(d.index);
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream(d.index)));
}

}  // namespace

void use_device(int index) {
  state(index);
  KILN_CUDA_CHECK(cudaSetDevice(index));
}

cudaStream_t stream(int index) {
  return state(index).stream;
}

cudaStream_t begin(const KernelContext& ctx) {
  use_device(ctx.device.index);
  return static_cast<cudaStream_t>(ctx.stream);
}

const DeviceInfo& device_info(int index) {
  return state(index).info;
}

int device_count() {
  return devices().count;
}
std::string unavailable_reason() {
  return devices().reason;
}
void synchronize(int index) {
  synchronize_device(Device::cuda(index));
}
std::string device_name(int index) {
  return device_info(index).name;
}
AllocatorStats memory_stats(int index) {
  return allocator(index).stats();
}

namespace {

// What the backend runs beyond having a kernel: the GEMM epilogues whose steps
// matmul.cpp runs, the fused programs fused.cpp generates.
bool supports(const Primitive& p, const std::vector<DType>& inputs, DType out) {
  if (p.op() == Op::MatmulEpilogue)
    return std::holds_alternative<EpilogueAttrs>(p.attrs_variant()) &&
           supports_epilogue(p.attrs<EpilogueAttrs>(), inputs, out);
  if (p.op() == Op::Attention || p.op() == Op::AttentionGrad || p.op() == Op::Sdpa ||
      p.op() == Op::SdpaGrad)  // f32, f64, bf16 (attention.cu, sdpa.cu)
    return !inputs.empty() &&
           (inputs[0] == DType::f32 || inputs[0] == DType::f64 || inputs[0] == DType::bf16);
  // LayerNorm and the cross-entropy's gradient: the input's dtype (no bf16
  // output from f32 yet).
  if (p.op() == Op::LayerNorm || p.op() == Op::SoftmaxCrossEntropyGrad)
    return !inputs.empty() && out == inputs[0];
  if (p.op() == Op::LayerNormGrad || p.op() == Op::LayerNormParamGrad) {  // one dtype
    for (DType d : inputs)
      if (d != inputs[0]) return false;
  }
  if (p.op() == Op::FusedElementwise || p.op() == Op::FusedReduce) {
    // The generated kernels read and write f32 only.
    for (DType d : inputs)
      if (d != DType::f32) return false;
    if (out != DType::f32) return false;
  }
  return supports_fused(p);
}

}  // namespace

void register_backend() {
  static KernelTable table;
  register_transfer(table);
  register_elementwise(table);
  register_reduce(table);
  register_layout(table);
  register_matmul(table);
  register_fused(table);
  register_attention(table);
  register_sdpa(table);
  register_nn(table);
  register_conv(table);
  register_random(table);
  register_collectives(table);
  table.supports = supports;
  table.stream = stream_of;
  table.synchronize = synchronize_device;
  table.begin_recording = begin_recording;
  table.end_recording = end_recording;
  table.replay = replay;
  table.release_recording = release_recording;
  register_device_allocators(DeviceType::cuda, allocator_of);
  register_kernels(DeviceType::cuda, &table);
}

}  // namespace kiln::cuda
