// kiln's CUDA emulator: what its parts share inside — a kernel launch, the
// device work lock, the calling thread's current device and last error.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/emulation/emulator.h"

namespace kiln::emu {

// One launch of a kernel, as recorded (its arguments in the closure).
struct KernelLaunch {
  const char* name = "";
  dim3 grid, block;
  size_t dynamic_shared = 0;
  int device = 0;
  std::shared_ptr<const void> closure;
  KernelEntry entry = nullptr;
};

// The most shared memory a block may have (an H100's or H200's opt-in limit).
constexpr size_t kSharedPerBlockOptin = 232448;
constexpr size_t kSharedPerBlock = 48 * 1024;

// Device work (kernels, copies, library calls) runs under this lock, one
// piece at a time in the process.
std::recursive_mutex& device_work();

// The allocations a piece of device work read and wrote (memory.h's ids).
struct Accesses {
  std::vector<uint32_t> reads, writes;
};
// A piece of device work: runs, or says why not (its message in `message`),
// and says what it touched.
using Work = std::function<cudaError_t(std::string& message, Accesses& touched)>;
// Work queued on stream s: run now (under device_work), or recorded into the
// stream's capture; a failure sets the thread's last error and is returned.
cudaError_t submit(cudaStream_t s, const char* what, Work work);
// The device a stream belongs to (the current device's for the default stream).
int stream_device(cudaStream_t s);

// Runs k's blocks one after another (device_work held by the caller):
// cudaSuccess, or the error with its message in `message`; the allocations
// its threads read and wrote in `touched`.
cudaError_t run_kernel(const KernelLaunch& k, std::string& message, Accesses& touched);

// The calling thread's current device (cudaSetDevice) and last error, whose
// message cudaGetErrorString returns for its code.
int current_device();
void set_error(cudaError_t e, std::string message);

// The number of emulated devices ($KILN_CUDA_EMULATOR, default 0: none),
// and of multiprocessors each reports ($KILN_CUDA_EMULATOR_SMS, default 4:
// grids sized from it stay small, and grid-stride loops take several turns).
int device_count();
int multiprocessor_count();

}  // namespace kiln::emu
