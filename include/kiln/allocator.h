// kiln — device memory. A Buffer owns one allocation and returns it to its
// allocator when the last Array that uses it goes away.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kiln/device.h"

namespace kiln {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr, size_t bytes) = 0;
};

struct AllocatorStats {
  size_t bytes_in_use = 0;    // handed out and not yet returned
  size_t bytes_cached = 0;    // kept for reuse
  size_t bytes_reserved = 0;  // obtained from the system, ever held now
  size_t peak_in_use = 0;
  uint64_t system_allocs = 0;  // calls that had to go to the system
  uint64_t cache_hits = 0;
};

// The CPU allocator: 64-byte aligned blocks, sizes rounded to a few classes per
// power of two, and freed blocks kept in per-size free lists for reuse, so a
// training step that repeats its allocations touches no new pages. Blocks of
// kCpuHugeBlock bytes and more are aligned to 2 MiB and marked for Linux's
// transparent huge pages (madvise MADV_HUGEPAGE), unless the environment has
// KILN_HUGE_PAGES=0.
inline constexpr size_t kCpuHugeBlock = size_t{8} << 20;
Allocator& cpu_allocator();
AllocatorStats cpu_allocator_stats();
void cpu_allocator_trim();  // gives cached blocks and free jit arenas back to the system

// The allocator of a device (backends register theirs:
// src/core/registration.h).
Allocator& allocator_for(Device device);
// The memory statistics of a device's allocator: the cpu's caching
// allocator, or a CUDA device's pool (bytes_in_use, peak_in_use,
// bytes_reserved); zeros on a device whose allocator keeps none.
AllocatorStats device_memory_stats(Device device);

class Buffer {
 public:
  Buffer(Allocator* alloc, size_t bytes, Device device);
  // A buffer over memory that kiln did not allocate (another library's),
  // which its owner frees, never kiln: it must outlive the buffer.
  Buffer(void* borrowed, size_t bytes, Device device);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Allocator* alloc_;  // null for borrowed memory
  void* ptr_;
  size_t bytes_;
  Device device_;
};

}  // namespace kiln
