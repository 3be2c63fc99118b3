// kiln's CUDA emulator: what the device built-ins (device.h, compiled into
// every kernel's translation unit) call in the emulator that runs the
// kernels (scheduler.cpp). Each CUDA thread of a block is a fiber on one host
// thread; a block runs to its end before the next starts, one kernel at a
// time in the process. Every load and store of a kernel's translation unit
// reaches the emulator's memory checks (GCC's kernel-address instrumentation
// calls __asan_loadN/__asan_storeN, which scheduler.cpp defines), so that an
// access outside an allocation or outside shared memory, a shared-memory race
// and a read of memory never written stop the launch with an error that names
// the kernel, the block and the thread.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <driver_types.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kiln::emu {

// CUDA's built-in variables of the running thread.
struct ThreadView {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
// The running thread's, null outside a kernel.
extern thread_local const ThreadView* tls_view;

// Runs the kernel once, as the current thread, with the arguments captured at
// its launch.
using KernelEntry = void (*)(const void* closure);

// Runs a kernel on `stream` (or records it while the stream is captured into
// a graph); a bad configuration or a failed check sets the calling thread's
// last error (cudaGetLastError), as a CUDA launch does.
void launch(const char* name, dim3 grid, dim3 block, size_t dynamic_shared, cudaStream_t stream,
            std::shared_ptr<const void> closure, KernelEntry entry);

// __syncthreads: waits for every thread of the block that has not exited.
void sync_block();
// __syncwarp(mask): waits for the lanes of `mask`; orders the memory accesses
// of the lanes before it against theirs after it.
void sync_warp(unsigned mask);
// A warp collective `op` (a shuffle, a vote, a WMMA operation): the calling
// lane gives `bytes` at `in` and waits for every lane of `mask` that has not
// exited; `out` then holds 32 slots of `bytes`, lane l's value in slot l
// (slots of lanes that gave none are left as they were). `arrived` gets the
// lanes that gave a value.
void warp_gather(const char* op, unsigned mask, const void* in, size_t bytes, void* out,
                 unsigned* arrived);
// Fails the launch (at the thread's next barrier, collective or exit) with
// `what`, naming the kernel, block and thread.
void report(const char* what);
[[noreturn]] void abort_launch(const char* what);

// Shared memory: a variable of the block (KILN_SHARED), placed in the block's
// shared memory when its first thread reaches the declaration, and the
// block's dynamic shared memory (KILN_DYNAMIC_SHARED).
struct SharedSite {
  const char* name;
};
void* shared_variable(const SharedSite* site, size_t bytes, size_t align);
void* dynamic_shared();

// Atomics, each checked as a read and a write of global or shared memory
// (never a race with another atomic).
int atomic_add(int* p, int v);
unsigned atomic_add(unsigned* p, unsigned v);
unsigned long long atomic_add(unsigned long long* p, unsigned long long v);
float atomic_add(float* p, float v);
double atomic_add(double* p, double v);
__nv_bfloat16 atomic_add(__nv_bfloat16* p, __nv_bfloat16 v);  // the sum rounded to bf16
__half atomic_add(__half* p, __half v);
int atomic_max(int* p, int v);
unsigned atomic_max(unsigned* p, unsigned v);
int atomic_min(int* p, int v);
unsigned atomic_min(unsigned* p, unsigned v);
int atomic_exch(int* p, int v);
unsigned atomic_exch(unsigned* p, unsigned v);
float atomic_exch(float* p, float v);
int atomic_cas(int* p, int compare, int v);
unsigned atomic_cas(unsigned* p, unsigned compare, unsigned v);
unsigned long long atomic_cas(unsigned long long* p, unsigned long long compare,
                              unsigned long long v);

}  // namespace kiln::emu
