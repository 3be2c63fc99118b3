// kiln's CUDA emulator: the global memory of the emulated devices. One range
// of reserved address space holds every device's allocations (256-byte
// aligned, as cudaMalloc's, each followed by at least 256 bytes that belong
// to none, and filled with 0xff bytes when fresh: NaN in any float type); a
// shadow byte per byte says whether it belongs to a live allocation, of which
// device, and whether it has been written since the allocation. Freed memory
// rests in a quarantine before it is handed out again, so that a use after a
// free is seen as such.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::emu {

// Shadow byte: the state in bits 0-1, the device in bits 2-7.
enum : uint8_t { kNoMemory = 0, kFresh = 1, kWritten = 2 };
inline uint8_t shadow_state(uint8_t s) {
  return s & 3u;
}
inline int shadow_device(uint8_t s) {
  return s >> 2;
}
inline uint8_t shadow_byte(uint8_t state, int device) {
  return static_cast<uint8_t>(state | device << 2);
}

// The heap's range and its shadow (set once, before the first allocation),
// and the id of the allocation each 256-byte granule belongs to (0: none).
// Ids count up from 1 and are never reused.
extern uintptr_t g_heap_base, g_heap_size;
extern uint8_t* g_shadow;
extern uint32_t* g_granule_ids;
constexpr int kGranuleShift = 8;
inline uint32_t allocation_id(const void* p) {
  return g_granule_ids[(reinterpret_cast<uintptr_t>(p) - g_heap_base) >> kGranuleShift];
}
inline bool in_heap(const void* p) {
  return reinterpret_cast<uintptr_t>(p) - g_heap_base < g_heap_size;
}
inline uint8_t* shadow_of(const void* p) {
  return g_shadow + (reinterpret_cast<uintptr_t>(p) - g_heap_base);
}

// The memory each emulated device reports (and allows) in all.
constexpr size_t kDeviceMemory = size_t{16} << 30;

// A fresh allocation of `bytes` on `device` (null when the device's memory
// or the heap is exhausted).
void* heap_allocate(int device, size_t bytes);
// Frees an allocation: false where p is not the start of a live one.
bool heap_free(void* p);
// The bytes in live allocations on `device`, and the most there have been.
size_t heap_in_use(int device);
size_t heap_peak(int device);

// What the address range [p, p + bytes) is, for an error message: "12 bytes
// past the end of a 1024-byte allocation on cuda:0", "inside a 64-byte
// allocation on cuda:1 that was freed", "not device memory".
std::string describe(const void* p, size_t bytes);

// Checks that [p, p + bytes) is live memory of `device` (any device where -1)
// and, with need_written, written: an empty string, else what is wrong
// (`what` names the range: "the source of cudaMemcpyAsync").
std::string check_range(const void* p, size_t bytes, int device, bool need_written,
                        const char* what);
// The ids of the allocations [p, p + bytes) lies in (one, for a range
// check_range accepted), appended to `ids`.
void allocation_ids(const void* p, size_t bytes, std::vector<uint32_t>& ids);

// What allocation `id` is, for an error message ("the 4096-byte allocation
// at 0x... on cuda:0", or that it has been freed).
std::string describe_allocation(uint32_t id);

// Marks [p, p + bytes) as written (a copy, a fill, a library's output).
void mark_written(void* p, size_t bytes);
// The written-state of [src, src + bytes) onto [dst, ...), for a copy
// between device ranges (an unwritten byte stays unwritten).
void copy_written_state(void* dst, const void* src, size_t bytes);

}  // namespace kiln::emu
