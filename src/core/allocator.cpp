// kiln core: the caching CPU allocator.
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "core/arenas.h"
#include "core/registration.h"
#include "kiln/allocator.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kHugePage = size_t{2} << 20;

// Whether blocks of kCpuHugeBlock and more go on transparent huge pages:
// KILN_HUGE_PAGES=0 turns it off, read once.
bool huge_pages_on() {
  static const bool on = [] {
    const char* env = std::getenv("KILN_HUGE_PAGES");
    if (!env || std::strcmp(env, "1") == 0) return true;
    if (std::strcmp(env, "0") == 0) return false;
    fail("allocator", std::string("KILN_HUGE_PAGES is '") + env + "', expected 0 (off) or 1 (on)");
  }();
  return on;
}

// A block from the system. Blocks of kCpuHugeBlock and more (activations and
// their gradients at batch 32, the compiled step's arena) are aligned to 2 MiB
// and marked for transparent huge pages, which Linux then gives them where
// THP is "always" or "madvise". The GEMMs' and kernels' row-strided loads
// then take fewer TLB misses (no counters in the VM to show it): ViT-S/16's
// bf16 step 3.3% faster in jit, 8.5% in eager, on a Xeon with AMX
// (bench/results/2026-12-07-huge-pages/). From 8 MiB every size class is a
// whole number of huge pages, so none is rounded up.
void* system_alloc(size_t cls) {
  if (cls < kCpuHugeBlock || !huge_pages_on()) return std::aligned_alloc(kAlign, cls);
  void* p = std::aligned_alloc(kHugePage, cls);
  if (p) madvise(p, cls, MADV_HUGEPAGE);  // advice: where refused, small pages
  return p;
}

// Rounds up to a size class: multiples of 64 B below 4 KiB, then four classes
// per power of two (at most 25% slack), so that freed blocks are found again
// by an exact-size lookup.
size_t size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes <= 4096) return (bytes + kAlign - 1) / kAlign * kAlign;
  int top = 63 - __builtin_clzll(bytes);
  size_t step = size_t{1} << (top - 2);
  return (bytes + step - 1) / step * step;
}

class CpuCachingAllocator final : public Allocator {
 public:
  ~CpuCachingAllocator() override { trim(); }

  void* allocate(size_t bytes) override {
    size_t cls = size_class(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        stats_.bytes_cached -= cls;
        note_in_use(cls);
        ++stats_.cache_hits;
        return p;
      }
    }
    void* p = system_alloc(cls);
    if (!p) {
      trim();
      p = system_alloc(cls);
      if (!p) fail("allocator", "out of memory allocating " + std::to_string(cls) + " bytes");
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_reserved += cls;
    ++stats_.system_allocs;
    note_in_use(cls);
    return p;
  }

  void release(void* ptr, size_t bytes) override {
    size_t cls = size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(cls, ptr);
    stats_.bytes_in_use -= cls;
    stats_.bytes_cached += cls;
  }

  void trim() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, p] : free_) {
      std::free(p);
      stats_.bytes_reserved -= cls;
    }
    free_.clear();
    stats_.bytes_cached = 0;
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  void note_in_use(size_t cls) {
    stats_.bytes_in_use += cls;
    if (stats_.bytes_in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.bytes_in_use;
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  AllocatorStats stats_;
};

CpuCachingAllocator& cpu_caching_allocator() {
  // Never destroyed: arrays in static storage may outlive any other object.
  static auto* alloc = new CpuCachingAllocator();
  return *alloc;
}

class ArenaPool {
 public:
  std::shared_ptr<Buffer> borrow(size_t bytes, Device device) {
    std::vector<std::shared_ptr<Buffer>> smaller;  // freed outside the lock
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if ((*it)->device() == device && (*it)->bytes() >= bytes &&
            (best == free_.end() || (*it)->bytes() < (*best)->bytes()))
          best = it;
      if (best != free_.end()) {
        std::shared_ptr<Buffer> b = std::move(*best);
        free_.erase(best);
        return b;
      }
      smaller = take(device);
    }
    smaller.clear();
    return std::make_shared<Buffer>(&allocator_for(device), bytes, device);
  }
  void give_back(std::shared_ptr<Buffer> b) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(b));
  }
  void drop(Device device) {
    std::vector<std::shared_ptr<Buffer>> gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gone = take(device);
    }
  }

 private:
  // The free arenas on `device`, out of the pool (the caller holds the lock).
  std::vector<std::shared_ptr<Buffer>> take(Device device) {
    std::vector<std::shared_ptr<Buffer>> out;
    for (auto it = free_.begin(); it != free_.end();)
      if ((*it)->device() == device) {
        out.push_back(std::move(*it));
        it = free_.erase(it);
      } else {
        ++it;
      }
    return out;
  }

  std::mutex mu_;
  std::vector<std::shared_ptr<Buffer>> free_;
};

ArenaPool& arena_pool() {
  // Never destroyed: executables in static storage may outlive it.
  static auto* pool = new ArenaPool();
  return *pool;
}

}  // namespace

std::shared_ptr<Buffer> borrow_arena(size_t bytes, Device device) {
  return arena_pool().borrow(bytes, device);
}
void give_back_arena(std::shared_ptr<Buffer> arena) {
  arena_pool().give_back(std::move(arena));
}
void drop_free_arenas(Device device) {
  arena_pool().drop(device);
}

Allocator& cpu_allocator() {
  return cpu_caching_allocator();
}
AllocatorStats cpu_allocator_stats() {
  return cpu_caching_allocator().stats();
}
void cpu_allocator_trim() {
  drop_free_arenas(Device::cpu());  // into the cache, then out of it
  cpu_caching_allocator().trim();
}

Buffer::Buffer(Allocator* alloc, size_t bytes, Device device)
    : alloc_(alloc), ptr_(alloc->allocate(bytes)), bytes_(bytes), device_(device) {}

Buffer::Buffer(void* borrowed, size_t bytes, Device device)
    : alloc_(nullptr), ptr_(borrowed), bytes_(bytes), device_(device) {}

Buffer::~Buffer() {
  if (alloc_) alloc_->release(ptr_, bytes_);
}

}  // namespace kiln

namespace kiln {
namespace {
Allocator* g_allocators[kDeviceTypes] = {};
Allocator* (*g_device_allocators[kDeviceTypes])(Device) = {};
}

void register_device_allocators(DeviceType type, Allocator* (*for_device)(Device)) {
  g_device_allocators[static_cast<int>(type)] = for_device;
}

void register_allocator(DeviceType type, Allocator* alloc) {
  g_allocators[static_cast<int>(type)] = alloc;
}

Allocator& allocator_for(Device device) {
  if (device.type == DeviceType::cpu) return cpu_allocator();
  register_builtin_backends();
  if (auto f = g_device_allocators[static_cast<int>(device.type)]) return *f(device);
  Allocator* a = g_allocators[static_cast<int>(device.type)];
  if (!a)
    fail("allocator", "no backend is available for device " + device.str() +
                          (device.type == DeviceType::cuda ? ": " + cuda_unavailable_reason() : ""));
  return *a;
}

}  // namespace kiln
