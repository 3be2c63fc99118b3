// kiln's CUDA emulator: the emulated devices' global memory (memory.h).
#include "backend/cuda/emulation/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

namespace kiln::emu {

uintptr_t g_heap_base = 0, g_heap_size = 0;
uint8_t* g_shadow = nullptr;
uint32_t* g_granule_ids = nullptr;

namespace {

// Address space, not memory: pages are committed as they are touched, and
// given back when their allocation is freed.
constexpr size_t kHeapBytes = size_t{64} << 30;
constexpr size_t kAlign = 256, kRedzone = 256, kPage = 4096;
constexpr size_t kQuarantineBytes = size_t{64} << 20;
constexpr int kMaxDevices = 64;

size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

struct Allocation {
  size_t bytes = 0, span = 0;  // span: bytes rounded up, plus the redzone
  int device = 0;
  uint32_t id = 0;
};

void set_ids(uintptr_t start, size_t span, uint32_t id) {
  uint32_t* g = g_granule_ids + ((start - g_heap_base) >> kGranuleShift);
  std::fill(g, g + (span >> kGranuleShift), id);
}

class Heap {
 public:
  void* allocate(int device, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    reserve();
    if (device < 0 || device >= kMaxDevices) return nullptr;
    if (in_use_[device] + bytes > kDeviceMemory) return nullptr;
    const size_t span = round_up(std::max<size_t>(bytes, 1), kAlign) + kRedzone;
    uintptr_t start = take(span);
    if (!start) return nullptr;
    live_[start] = {bytes, span, device, next_id_++};
    set_ids(start, span, live_[start].id);
    in_use_[device] += bytes;
    peak_[device] = std::max(peak_[device], in_use_[device]);
    void* p = reinterpret_cast<void*>(start);
    std::memset(p, 0xff, bytes);
    std::memset(shadow_of(p), shadow_byte(kFresh, device), bytes);
    return p;
  }

  bool free(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(reinterpret_cast<uintptr_t>(p));
    if (it == live_.end()) return false;
    const uintptr_t start = it->first;
    const Allocation a = it->second;
    live_.erase(it);
    in_use_[a.device] -= a.bytes;
    std::memset(shadow_of(p), kNoMemory, a.bytes);
    set_ids(start, a.span, 0);
    // The pages wholly inside the span go back to the system (they read as
    // zeros until reused).
    const uintptr_t lo = round_up(start, kPage), hi = (start + a.span) / kPage * kPage;
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
    quarantine_.push_back({start, a});
    quarantined_ += a.span;
    while (quarantined_ > kQuarantineBytes) {
      const auto [s, q] = quarantine_.front();
      quarantine_.pop_front();
      quarantined_ -= q.span;
      give_back(s, q.span);
    }
    return true;
  }

  size_t in_use(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    return device >= 0 && device < kMaxDevices ? in_use_[device] : 0;
  }
  size_t peak(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    return device >= 0 && device < kMaxDevices ? peak_[device] : 0;
  }

  std::string describe_id(uint32_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [start, a] : live_)
      if (a.id == id) {
        char at[32];
        std::snprintf(at, sizeof at, "%#zx", static_cast<size_t>(start));
        return "the " + std::to_string(a.bytes) + "-byte allocation at " + at +
               " on cuda:" + std::to_string(a.device);
      }
    return "an allocation that has been freed";
  }

  std::string describe(uintptr_t a, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    auto bytes = [](size_t v) { return std::to_string(v) + "-byte"; };
    auto on = [](int d) { return " on cuda:" + std::to_string(d); };
    auto it = live_.upper_bound(a);
    if (it != live_.begin()) {
      --it;
      const uintptr_t s = it->first;
      const Allocation& al = it->second;
      if (a < s + al.bytes && a + n > s + al.bytes)
        return "bytes " + std::to_string(a - s) + " to " + std::to_string(a - s + n - 1) +
               " of a " + bytes(al.bytes) + " allocation" + on(al.device) +
               ", which ends at byte " + std::to_string(al.bytes - 1);
      if (a < s + al.bytes)
        return "byte " + std::to_string(a - s) + " of a " + bytes(al.bytes) + " allocation" +
               on(al.device);
      if (a < s + al.span)
        return std::to_string(a - (s + al.bytes)) + " bytes past the end of a " + bytes(al.bytes) +
               " allocation" + on(al.device);
    }
    for (auto q = quarantine_.rbegin(); q != quarantine_.rend(); ++q)
      if (a >= q->first && a < q->first + q->second.span)
        return "byte " + std::to_string(a - q->first) + " of a " + bytes(q->second.bytes) +
               " allocation" + on(q->second.device) + " that has been freed";
    if (it != live_.end() && a < it->first)
      return std::to_string(it->first - a) + " bytes before a " + bytes(it->second.bytes) +
             " allocation" + on(it->second.device);
    return "device memory that is not allocated";
  }

 private:
  // The heap's address space and its shadow, reserved on first use.
  void reserve() {
    if (g_heap_base) return;
    const int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void* heap = mmap(nullptr, kHeapBytes, prot, flags, -1, 0);
    void* shadow = mmap(nullptr, kHeapBytes, prot, flags, -1, 0);
    void* ids = mmap(nullptr, (kHeapBytes >> kGranuleShift) * sizeof(uint32_t), prot, flags, -1, 0);
    if (heap == MAP_FAILED || shadow == MAP_FAILED || ids == MAP_FAILED)
      return;  // every allocation then fails
    g_shadow = static_cast<uint8_t*>(shadow);
    g_granule_ids = static_cast<uint32_t*>(ids);
    g_heap_size = kHeapBytes;
    g_heap_base = reinterpret_cast<uintptr_t>(heap);
  }

  // First fit among the spans given back, else fresh address space.
  uintptr_t take(size_t span) {
    if (!g_heap_base) return 0;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < span) continue;
      const uintptr_t s = it->first;
      const size_t left = it->second - span;
      free_.erase(it);
      if (left) free_[s + span] = left;
      return s;
    }
    if (top_ + span > kHeapBytes) return 0;
    const uintptr_t s = g_heap_base + top_;
    top_ += span;
    return s;
  }

  void give_back(uintptr_t s, size_t span) {
    auto next = free_.lower_bound(s);
    if (next != free_.end() && s + span == next->first) {
      span += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == s) {
        prev->second += span;
        return;
      }
    }
    free_[s] = span;
  }

  std::mutex mu_;
  std::map<uintptr_t, Allocation> live_;
  std::map<uintptr_t, size_t> free_;
  std::deque<std::pair<uintptr_t, Allocation>> quarantine_;
  size_t quarantined_ = 0, top_ = 0;
  uint32_t next_id_ = 1;
  size_t in_use_[kMaxDevices] = {}, peak_[kMaxDevices] = {};
};

Heap& heap() {
  static auto* h = new Heap();  // never destroyed: memory may be freed during exit
  return *h;
}

}  // namespace

void* heap_allocate(int device, size_t bytes) {
  return heap().allocate(device, bytes);
}
bool heap_free(void* p) {
  return heap().free(p);
}
size_t heap_in_use(int device) {
  return heap().in_use(device);
}
size_t heap_peak(int device) {
  return heap().peak(device);
}

std::string describe(const void* p, size_t bytes) {
  if (!in_heap(p)) return "host memory, not device memory";
  return heap().describe(reinterpret_cast<uintptr_t>(p), std::max<size_t>(bytes, 1));
}

std::string describe_allocation(uint32_t id) {
  return heap().describe_id(id);
}

std::string check_range(const void* p, size_t bytes, int device, bool need_written,
                        const char* what) {
  if (bytes == 0) return {};
  const auto* b = static_cast<const unsigned char*>(p);
  if (!in_heap(b) || !in_heap(b + bytes - 1))
    return std::string(what) + " (" + std::to_string(bytes) + " bytes at " +
           std::to_string(reinterpret_cast<uintptr_t>(p)) + ") is " + describe(p, bytes);
  const uint8_t* s = shadow_of(p);
  for (size_t i = 0; i < bytes; ++i) {
    const uint8_t v = s[i];
    if (shadow_state(v) == kNoMemory)
      return std::string(what) + " (" + std::to_string(bytes) + " bytes) reaches " +
             describe(b + i, 1);
    if (device >= 0 && shadow_device(v) != device)
      return std::string(what) + " is memory of cuda:" + std::to_string(shadow_device(v)) +
             ", used on cuda:" + std::to_string(device);
    if (need_written && shadow_state(v) == kFresh)
      return std::string(what) + " (" + std::to_string(bytes) + " bytes) holds " +
             describe(b + i, 1) + ", which was never written";
  }
  return {};
}

void allocation_ids(const void* p, size_t bytes, std::vector<uint32_t>& ids) {
  if (!bytes || !in_heap(p)) return;
  const auto* b = static_cast<const unsigned char*>(p);
  for (const unsigned char* q = b; q < b + bytes; q += size_t{1} << kGranuleShift)
    if (const uint32_t id = allocation_id(q); id && (ids.empty() || ids.back() != id))
      ids.push_back(id);
  if (const uint32_t id = allocation_id(b + bytes - 1); id && (ids.empty() || ids.back() != id))
    ids.push_back(id);
}

void mark_written(void* p, size_t bytes) {
  uint8_t* s = shadow_of(p);
  for (size_t i = 0; i < bytes; ++i)
    if (shadow_state(s[i]) != kNoMemory) s[i] = shadow_byte(kWritten, shadow_device(s[i]));
}

void copy_written_state(void* dst, const void* src, size_t bytes) {
  uint8_t* d = shadow_of(dst);
  const uint8_t* s = shadow_of(src);
  for (size_t i = 0; i < bytes; ++i)
    if (shadow_state(d[i]) != kNoMemory)
      d[i] = shadow_byte(shadow_state(s[i]) == kWritten ? kWritten : kFresh, shadow_device(d[i]));
}

}  // namespace kiln::emu
