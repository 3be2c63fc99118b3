// kiln's CUDA emulator: running a kernel's blocks and checking what its
// threads do (emulator.h).
//
// A block's threads are fibers (boost.context) on the host thread that
// launched the kernel, resumed in turn by a scheduler: a thread runs until it
// waits at a barrier (__syncthreads) or a warp collective (__syncwarp, a
// shuffle, a vote, a WMMA operation) that not every thread has reached, or
// until it exits. A pass in which no thread moves is a deadlock, reported with
// where the threads wait.
//
// Memory checks. Every load and store compiled in a kernel's translation unit
// calls __asan_{load,store}N_noabort (GCC's -fsanitize=kernel-address with
// calls instead of inline checks), defined below: an access inside the
// device heap must lie in a live allocation of the kernel's device (memcheck)
// and, for a load, have been written (initcheck); an access inside the
// block's shared memory must lie in a declared variable (memcheck), read
// only what the block wrote (initcheck), and not race (racecheck: two threads
// touch a byte between the same barriers and one of them writes; threads of
// one warp are ordered by __syncwarp too). Other addresses (the threads'
// stacks, the launch's arguments) are not checked. The first failed check
// is the launch's error; the thread goes on to its next barrier, collective or
// exit, where every thread of the block stops.
#include <sys/mman.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <cstdio>
#include <cstring>
#include <list>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/emulation/emulator.h"
#include "backend/cuda/emulation/internal.h"
#include "backend/cuda/emulation/memory.h"

namespace kiln::emu {

thread_local const ThreadView* tls_view = nullptr;

namespace {

namespace ctx = boost::context;

constexpr int kMaxThreads = 1024;
constexpr size_t kStackBytes = 256 * 1024, kGuardBytes = 4096;
// The block's shared memory, with room for the redzones after its variables.
constexpr size_t kArenaBytes = kSharedPerBlockOptin + 64 * 1024;
constexpr size_t kSharedRedzone = 64;
constexpr uint16_t kNobody = 0xffff;

// Thrown in a thread of a block that stops (a failed check, a deadlock):
// unwinds the thread's kernel code to its fiber's entry.
struct Abort {};

// A shared-memory byte's state: addressable, written; and the last writer
// and reader with the barrier and warp epochs of their accesses (racecheck).
struct SharedByte {
  uint8_t state = kNoMemory;
  bool readers = false;  // another reader than `reader` since the writer, unordered
  uint16_t writer = kNobody, reader = kNobody;
  uint32_t w_epoch = 0, w_warp = 0, r_epoch = 0, r_warp = 0;
};

struct Block;

struct Thread {
  ThreadView view;
  Block* block = nullptr;
  int tid = 0, warp = 0, lane = 0;
  bool done = false;
  const char* waiting = nullptr;  // the barrier or collective it waits at
  unsigned waiting_mask = 0;
  ctx::fiber fiber;  // the suspended thread
  ctx::fiber sink;   // the scheduler, while the thread runs
};

// A warp collective under way: its lanes' values, gathered until every
// expected lane has given one, then read by each of them.
struct Collective {
  const char* op = "";
  unsigned mask = 0, expected = 0, arrived = 0, unread = 0;
  size_t bytes = 0;
  bool complete = false, orders_memory = false;
  std::vector<unsigned char> data;
};

struct Warp {
  std::list<Collective> pending;
  uint32_t epoch = 0;  // __syncwarp generations
  unsigned present = 0, exited = 0;
};

struct SharedVariable {
  const SharedSite* site;
  size_t offset, bytes;
};

struct Block {
  const KernelLaunch* k = nullptr;
  uint3 idx{};
  int threads = 0, live = 0, arrived = 0;
  uint64_t generation = 0, events = 0;
  uint32_t epoch = 0;  // __syncthreads generations
  std::vector<Warp> warps;
  std::vector<SharedVariable> variables;
  size_t shared_used = 0;      // bytes of the arena in use, redzones included
  size_t shared_declared = 0;  // bytes declared (dynamic and variables)
  bool abort = false;
  cudaError_t error = cudaSuccess;
  std::string message;
  // The first read of shared memory no thread had written: an initcheck
  // error at the next barrier or the block's end, unless the write that
  // comes after it without a barrier between is reported as a race first.
  bool unwritten_read = false;
  int unwritten_tid = 0;
  size_t unwritten_offset = 0;
};

// The emulator's state: one kernel runs at a time (device_work), so one
// arena and one set of stacks serve every block.
alignas(4096) unsigned char g_arena[kArenaBytes];
SharedByte g_shared[kArenaBytes];
const uintptr_t g_arena_base = reinterpret_cast<uintptr_t>(g_arena);
size_t g_shared_dirty = 0;  // the arena's bytes any block has used since the last reset

// The allocations the running kernel's threads read and wrote (for the
// order of work on streams), the last few of each seen first.
struct Touched {
  Accesses* out = nullptr;
  uint32_t recent[2][4] = {};  // [write][]
  void add(uint32_t id, bool write) {
    uint32_t* r = recent[write];
    if (id == r[0] || id == r[1] || id == r[2] || id == r[3]) return;
    r[3] = r[2], r[2] = r[1], r[1] = r[0], r[0] = id;
    (write ? out->writes : out->reads).push_back(id);
  }
};
Touched g_touched;
thread_local Thread* tls_thread = nullptr;

std::string dim_str(unsigned x, unsigned y, unsigned z) {
  return "(" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(z) + ")";
}

std::string thread_str(const Block& b, int tid) {
  const dim3 d = b.k->block;
  return "thread " + dim_str(tid % d.x, tid / d.x % d.y, tid / (d.x * d.y));
}

std::string where(const Thread& t) {
  const Block& b = *t.block;
  return "kernel " + std::string(b.k->name) + " on cuda:" + std::to_string(b.k->device) +
         ", block " + dim_str(b.idx.x, b.idx.y, b.idx.z) + ", " + thread_str(b, t.tid);
}

// The launch fails with `what` (the first failure only); the block stops.
void fail_block(Block& b, cudaError_t code, const std::string& what) {
  if (b.error == cudaSuccess) {
    b.error = code;
    b.message = what;
  }
  b.abort = true;
}

void fail_thread(Thread& t, cudaError_t code, const std::string& what) {
  if (t.block->error == cudaSuccess) fail_block(*t.block, code, where(t) + ": " + what);
  t.block->abort = true;
}

// ---- stacks ----
struct Stacks {
  std::vector<void*> stacks;
  void* get(int i) {
    while (static_cast<int>(stacks.size()) <= i) {
      void* m = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) throw std::runtime_error("cannot map a fiber stack");
      mprotect(m, kGuardBytes, PROT_NONE);  // the stack grows down into it
      stacks.push_back(static_cast<char*>(m) + kGuardBytes);
    }
    return stacks[i];
  }
};
Stacks& stacks() {
  static auto* s = new Stacks();
  return *s;
}

// A fiber's stack from the pool (kept for the next block).
struct PoolStack {
  void* base;
  ctx::stack_context allocate() {
    ctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = static_cast<char*>(base) + kStackBytes;
    return sc;
  }
  void deallocate(ctx::stack_context&) noexcept {}
};

void yield(Thread& t) {
  t.sink = std::move(t.sink).resume();
}

void check_abort(Thread& t) {
  if (t.block->abort) throw Abort{};
}

std::string shared_name(const Block& b, size_t off);

// Reports the block's pending read of unwritten shared memory.
void report_unwritten_read(Block& b) {
  if (!b.unwritten_read) return;
  b.unwritten_read = false;
  fail_block(b, cudaErrorLaunchFailure,
             "kernel " + std::string(b.k->name) + " on cuda:" + std::to_string(b.k->device) +
                 ", block " + dim_str(b.idx.x, b.idx.y, b.idx.z) + ", " +
                 thread_str(b, b.unwritten_tid) + ": reads " + shared_name(b, b.unwritten_offset) +
                 ", which no thread of the block has written (initcheck)");
}

void release_barrier(Block& b) {
  report_unwritten_read(b);
  b.arrived = 0;
  ++b.generation;
  ++b.epoch;
  ++b.events;
}

void complete(Block& b, Warp& w, Collective& c) {
  c.complete = true;
  c.unread = c.arrived;
  if (c.orders_memory) ++w.epoch;
  ++b.events;
}

// The collectives a lane that has just exited was expected at may be complete.
void lane_exited(Block& b, Warp& w, int lane) {
  w.exited |= 1u << lane;
  for (Collective& c : w.pending) {
    if (c.complete || !(c.expected >> lane & 1u)) continue;
    c.expected &= ~(1u << lane);
    if ((c.arrived & c.expected) == c.expected) complete(b, w, c);
  }
}

void thread_main(Thread& t) {
  Block& b = *t.block;
  ++b.events;
  try {
    b.k->entry(b.k->closure.get());
  } catch (const ctx::detail::forced_unwind&) {
    throw;
  } catch (const Abort&) {
  } catch (const std::exception& e) {
    fail_thread(t, cudaErrorLaunchFailure, std::string("the kernel threw: ") + e.what());
  } catch (...) {
    fail_thread(t, cudaErrorLaunchFailure, "the kernel threw");
  }
  t.done = true;
  t.waiting = nullptr;
  --b.live;
  ++b.events;
  lane_exited(b, b.warps[t.warp], t.lane);
  if (b.arrived > 0 && b.arrived == b.live) release_barrier(b);
}

// Where the threads of a block that no longer moves wait.
std::string deadlock_report(const Block& b, const std::vector<Thread>& threads) {
  std::map<std::string, std::pair<int, int>> at;  // place -> (count, first thread)
  int exited = 0;
  for (const Thread& t : threads) {
    if (t.done) {
      ++exited;
      continue;
    }
    std::string place = t.waiting ? t.waiting : "?";
    if (t.waiting && std::strcmp(t.waiting, "__syncthreads") != 0) {
      char m[64];
      std::snprintf(m, sizeof m, " (warp %d, mask 0x%08x)", t.warp, t.waiting_mask);
      place += m;
    }
    auto& e = at.try_emplace(place, 0, t.tid).first->second;
    ++e.first;
  }
  std::string s = "deadlock: the block's threads wait for each other:";
  for (const auto& [place, e] : at)
    s += " " + std::to_string(e.first) + " at " + place + " (" + thread_str(b, e.second) +
         " first);";
  s += " " + std::to_string(exited) + " exited";
  return s;
}

void reset_shared(Block& b) {
  const size_t n = std::min(g_shared_dirty, kArenaBytes);
  std::fill(g_shared, g_shared + n, SharedByte{});
  std::memset(g_arena, 0xff, n);
  // The dynamic shared memory first, 128-byte aligned (the arena is).
  b.shared_used = b.k->dynamic_shared + kSharedRedzone;
  b.shared_declared = b.k->dynamic_shared;
  g_shared_dirty = b.shared_used;
  for (size_t i = 0; i < b.k->dynamic_shared; ++i) g_shared[i].state = kFresh;
}

void run_block(Block& b, std::vector<Thread>& threads) {
  Stacks& pool = stacks();
  for (int i = 0; i < b.threads; ++i) {
    Thread& t = threads[i];
    const dim3 d = b.k->block;
    t = Thread{};
    t.block = &b;
    t.tid = i;
    t.warp = i / 32;
    t.lane = i % 32;
    t.view.thread_idx = {i % d.x, i / d.x % d.y, i / (d.x * d.y)};
    t.view.block_idx = b.idx;
    t.view.block_dim = d;
    t.view.grid_dim = b.k->grid;
    t.fiber = ctx::fiber(std::allocator_arg, PoolStack{pool.get(i)}, [&t](ctx::fiber&& sink) {
      t.sink = std::move(sink);
      thread_main(t);
      return std::move(t.sink);
    });
  }
  while (b.live > 0) {
    const uint64_t before = b.events;
    for (int i = 0; i < b.threads; ++i) {
      Thread& t = threads[i];
      if (t.done) continue;
      tls_thread = &t;
      tls_view = &t.view;
      t.fiber = std::move(t.fiber).resume();
      tls_thread = nullptr;
      tls_view = nullptr;
    }
    if (b.events == before && b.live > 0) {
      if (b.abort) throw std::logic_error("kiln CUDA emulator: threads ignored the block's abort");
      fail_block(b, cudaErrorLaunchFailure,
                 "kernel " + std::string(b.k->name) + " on cuda:" + std::to_string(b.k->device) +
                     ", block " + dim_str(b.idx.x, b.idx.y, b.idx.z) + ": " +
                     deadlock_report(b, threads));
    }
  }
}

// ---- memory checks ----
bool ordered(const Thread& t, uint16_t tid, uint32_t epoch, uint32_t warp_epoch) {
  const Block& b = *t.block;
  return epoch < b.epoch || (tid / 32 == t.warp && warp_epoch < b.warps[t.warp].epoch);
}

std::string shared_name(const Block& b, size_t off) {
  if (off < b.k->dynamic_shared + kSharedRedzone)
    return "dynamic shared memory, byte " + std::to_string(off);
  for (const SharedVariable& v : b.variables)
    if (off >= v.offset && off < v.offset + v.bytes + kSharedRedzone)
      return "shared variable `" + std::string(v.site->name) + "`, byte " +
             std::to_string(off - v.offset);
  return "shared memory, byte " + std::to_string(off);
}

std::string out_of_shared(const Block& b, size_t off, size_t n) {
  const std::string size = std::to_string(n) + "-byte";
  if (off < b.k->dynamic_shared + kSharedRedzone)
    return size + " access at byte " + std::to_string(off) + " of the block's " +
           std::to_string(b.k->dynamic_shared) + " bytes of dynamic shared memory: past its end";
  for (const SharedVariable& v : b.variables)
    if (off >= v.offset + v.bytes && off < v.offset + v.bytes + kSharedRedzone)
      return size + " access " + std::to_string(off - v.offset - v.bytes) +
             " bytes past the end of shared variable `" + v.site->name + "` (" +
             std::to_string(v.bytes) + " bytes)";
  return size + " access outside the block's shared memory";
}

void shared_access(Thread& t, uintptr_t a, size_t n, bool write) {
  Block& b = *t.block;
  const size_t off = a - g_arena_base;
  const uint32_t warp_epoch = b.warps[t.warp].epoch;
  const auto tid = static_cast<uint16_t>(t.tid);
  for (size_t i = 0; i < n; ++i) {
    if (off + i >= kArenaBytes)
      return fail_thread(t, cudaErrorIllegalAddress, out_of_shared(b, off, n));
    SharedByte& s = g_shared[off + i];
    if (s.state == kNoMemory)
      return fail_thread(t, cudaErrorIllegalAddress, out_of_shared(b, off, n));
    const char* access = write ? "writes" : "reads";
    if (s.writer != kNobody && s.writer != tid && !ordered(t, s.writer, s.w_epoch, s.w_warp))
      return fail_thread(t, cudaErrorLaunchFailure,
                         std::string("race: ") + access + " " + shared_name(b, off + i) +
                             ", which " + thread_str(b, s.writer) +
                             " wrote with no __syncthreads (or __syncwarp in one warp) between "
                             "(racecheck's " +
                             (write ? "write-after-write" : "read-after-write") + " hazard)");
    if (write) {
      if (s.reader != kNobody && (s.reader != tid || s.readers) &&
          !ordered(t, s.reader, s.r_epoch, s.r_warp))
        return fail_thread(t, cudaErrorLaunchFailure,
                           "race: writes " + shared_name(b, off + i) + ", which " +
                               (s.reader != tid ? thread_str(b, s.reader) : "another thread") +
                               " read with no __syncthreads (or __syncwarp in one warp) between "
                               "(racecheck's write-after-read hazard)");
      s.state = kWritten;
      s.writer = tid;
      s.w_epoch = b.epoch;
      s.w_warp = warp_epoch;
      s.reader = kNobody;
      s.readers = false;
    } else {
      if (s.state == kFresh && !b.unwritten_read) {
        b.unwritten_read = true;
        b.unwritten_tid = t.tid;
        b.unwritten_offset = off + i;
      }
      if (s.reader == kNobody || ordered(t, s.reader, s.r_epoch, s.r_warp)) {
        s.readers = false;
      } else if (s.reader != tid) {
        s.readers = true;
      }
      s.reader = tid;
      s.r_epoch = b.epoch;
      s.r_warp = warp_epoch;
    }
  }
}

void global_access(Thread& t, uintptr_t a, size_t n, bool write) {
  uint8_t* s = g_shadow + (a - g_heap_base);
  const int device = t.block->k->device;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t v = s[i];
    if (shadow_state(v) == kNoMemory || shadow_device(v) != device) {
      std::string what = std::to_string(n) + "-byte " + (write ? "write" : "read") + " of " +
                         describe(reinterpret_cast<void*>(a), n);
      if (shadow_state(v) != kNoMemory)
        what = std::to_string(n) + "-byte " + (write ? "write" : "read") +
               " of cuda:" + std::to_string(shadow_device(v)) +
               "'s memory from cuda:" + std::to_string(device) + " (peer access is not enabled)";
      return fail_thread(t, cudaErrorIllegalAddress, what);
    }
    if (write) {
      s[i] = shadow_byte(kWritten, device);
    } else if (shadow_state(v) == kFresh) {
      return fail_thread(t, cudaErrorLaunchFailure,
                         std::to_string(n) + "-byte read of " +
                             describe(reinterpret_cast<void*>(a + i), 1) +
                             ", which was never written (initcheck)");
    }
  }
  if (g_touched.out) g_touched.add(allocation_id(reinterpret_cast<void*>(a)), write);
}

// A GPU loads and stores a value of 2, 4, 8 or 16 bytes (a float4, an
// aligned vector struct) only at a multiple of its size.
void misaligned(Thread& t, uintptr_t a, size_t n, bool write, const char* space) {
  fail_thread(t, cudaErrorMisalignedAddress,
              std::to_string(n) + "-byte " + (write ? "write" : "read") + " of " + space +
                  " at an address that is not a multiple of " + std::to_string(n) + " (" +
                  (space[0] == 's' ? "byte " + std::to_string(a - g_arena_base)
                                   : describe(reinterpret_cast<void*>(a), n)) +
                  ")");
}

inline void access(uintptr_t a, size_t n, bool write, bool sized) {
  Thread* t = tls_thread;
  if (!t || t->block->abort) return;
  if (a - g_arena_base < kArenaBytes) {
    if (sized && a % n) return misaligned(*t, a, n, write, "shared memory");
    return shared_access(*t, a, n, write);
  }
  if (a - g_heap_base < g_heap_size) {
    if (sized && a % n) return misaligned(*t, a, n, write, "global memory");
    return global_access(*t, a, n, write);
  }
}

// An atomic's read and write: checked as one write, never a race with
// another atomic (the last writer is then not recorded).
void atomic_access(const void* p, size_t n) {
  Thread* t = tls_thread;
  if (!t) abort_launch("an atomic outside a kernel");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a - g_arena_base < kArenaBytes) {
    Block& b = *t->block;
    const size_t off = a - g_arena_base;
    for (size_t i = 0; i < n; ++i)
      if (off + i >= kArenaBytes || g_shared[off + i].state == kNoMemory)
        return fail_thread(*t, cudaErrorIllegalAddress, "atomic: " + out_of_shared(b, off, n));
    for (size_t i = 0; i < n; ++i) g_shared[off + i].state = kWritten;
  } else if (a - g_heap_base < g_heap_size) {
    uint8_t* s = g_shadow + (a - g_heap_base);
    const int device = t->block->k->device;
    for (size_t i = 0; i < n; ++i)
      if (shadow_state(s[i]) == kNoMemory || shadow_device(s[i]) != device)
        return fail_thread(*t, cudaErrorIllegalAddress, "atomic on " + describe(p, n));
    for (size_t i = 0; i < n; ++i) s[i] = shadow_byte(kWritten, device);
    if (g_touched.out) g_touched.add(allocation_id(p), true);
  } else {
    fail_thread(*t, cudaErrorIllegalAddress, "atomic on " + describe(p, n));
  }
}

template <typename T, typename F>
T atomic(T* p, F f) {
  atomic_access(p, sizeof(T));
  const T old = *p;
  *p = f(old);
  return old;
}

}  // namespace

// ---- the kernel's built-ins (emulator.h) ----
void sync_block() {
  Thread& t = *tls_thread;
  Block& b = *t.block;
  check_abort(t);
  const uint64_t generation = b.generation;
  ++b.arrived;
  ++b.events;
  if (b.arrived == b.live) return release_barrier(b);
  t.waiting = "__syncthreads";
  while (b.generation == generation) {
    yield(t);
    check_abort(t);
  }
  t.waiting = nullptr;
}

namespace {

void gather(const char* op, unsigned mask, const void* in, size_t bytes, void* out,
            unsigned* arrived, bool orders_memory) {
  Thread& t = *tls_thread;
  Block& b = *t.block;
  check_abort(t);
  Warp& w = b.warps[t.warp];
  const unsigned bit = 1u << t.lane;
  char what[256];
  if (!(mask & bit)) {
    std::snprintf(what, sizeof what, "%s with mask 0x%08x, which does not name the calling lane %d",
                  op, mask, t.lane);
    abort_launch(what);
  }
  Collective* c = nullptr;
  for (Collective& p : w.pending) {
    if (p.complete || !(p.mask & mask)) continue;
    if (p.mask != mask || std::strcmp(p.op, op) != 0 || p.bytes != bytes) {
      std::snprintf(what, sizeof what,
                    "divergent warp: lane %d reached %s (mask 0x%08x) while lanes 0x%08x of its "
                    "warp wait at %s (mask 0x%08x)",
                    t.lane, op, mask, p.arrived, p.op, p.mask);
      abort_launch(what);
    }
    c = &p;
  }
  if (!c) {
    c = &w.pending.emplace_back();
    c->op = op;
    c->mask = mask;
    c->expected = mask & w.present & ~w.exited;
    c->bytes = bytes;
    c->orders_memory = orders_memory;
    c->data.resize(32 * bytes);
  }
  if (bytes) std::memcpy(c->data.data() + t.lane * bytes, in, bytes);
  c->arrived |= bit;
  ++b.events;
  if ((c->arrived & c->expected) == c->expected) {
    complete(b, w, *c);
  } else {
    t.waiting = op;
    t.waiting_mask = mask;
    while (!c->complete) {
      yield(t);
      check_abort(t);
    }
    t.waiting = nullptr;
  }
  if (out && bytes)
    for (int l = 0; l < 32; ++l)
      if (c->arrived >> l & 1u)
        std::memcpy(static_cast<unsigned char*>(out) + l * bytes, c->data.data() + l * bytes,
                    bytes);
  if (arrived) *arrived = c->arrived;
  c->unread &= ~bit;
  if (!c->unread) w.pending.remove_if([c](const Collective& x) { return &x == c; });
}

}  // namespace

void sync_warp(unsigned mask) {
  gather("__syncwarp", mask, nullptr, 0, nullptr, nullptr, true);
}

void warp_gather(const char* op, unsigned mask, const void* in, size_t bytes, void* out,
                 unsigned* arrived) {
  gather(op, mask, in, bytes, out, arrived, false);
}

void report(const char* what) {
  if (Thread* t = tls_thread) fail_thread(*t, cudaErrorLaunchFailure, what);
}

void abort_launch(const char* what) {
  report(what);
  throw Abort{};
}

void* shared_variable(const SharedSite* site, size_t bytes, size_t align) {
  Thread& t = *tls_thread;
  Block& b = *t.block;
  for (const SharedVariable& v : b.variables)
    if (v.site == site) return g_arena + v.offset;
  const size_t offset = (b.shared_used + align - 1) / align * align;
  if (b.shared_declared + bytes > kSharedPerBlockOptin ||
      offset + bytes + kSharedRedzone > kArenaBytes) {
    char what[200];
    std::snprintf(what, sizeof what,
                  "shared variable `%s` (%zu bytes) takes the block past the %zu bytes of shared "
                  "memory a block may have",
                  site->name, bytes, kSharedPerBlockOptin);
    abort_launch(what);
  }
  b.variables.push_back({site, offset, bytes});
  b.shared_declared += bytes;
  b.shared_used = offset + bytes + kSharedRedzone;
  g_shared_dirty = std::max(g_shared_dirty, b.shared_used);
  for (size_t i = 0; i < bytes; ++i) g_shared[offset + i].state = kFresh;
  return g_arena + offset;
}

void* dynamic_shared() {
  return g_arena;
}

int atomic_add(int* p, int v) {
  return atomic(p, [v](int o) { return o + v; });
}
unsigned atomic_add(unsigned* p, unsigned v) {
  return atomic(p, [v](unsigned o) { return o + v; });
}
unsigned long long atomic_add(unsigned long long* p, unsigned long long v) {
  return atomic(p, [v](unsigned long long o) { return o + v; });
}
float atomic_add(float* p, float v) {
  return atomic(p, [v](float o) { return o + v; });
}
double atomic_add(double* p, double v) {
  return atomic(p, [v](double o) { return o + v; });
}
__nv_bfloat16 atomic_add(__nv_bfloat16* p, __nv_bfloat16 v) {
  return atomic(p, [v](__nv_bfloat16 o) {
    return __float2bfloat16_rn(__bfloat162float(o) + __bfloat162float(v));
  });
}
__half atomic_add(__half* p, __half v) {
  return atomic(p, [v](__half o) { return __float2half_rn(__half2float(o) + __half2float(v)); });
}
int atomic_max(int* p, int v) {
  return atomic(p, [v](int o) { return std::max(o, v); });
}
unsigned atomic_max(unsigned* p, unsigned v) {
  return atomic(p, [v](unsigned o) { return std::max(o, v); });
}
int atomic_min(int* p, int v) {
  return atomic(p, [v](int o) { return std::min(o, v); });
}
unsigned atomic_min(unsigned* p, unsigned v) {
  return atomic(p, [v](unsigned o) { return std::min(o, v); });
}
int atomic_exch(int* p, int v) {
  return atomic(p, [v](int) { return v; });
}
unsigned atomic_exch(unsigned* p, unsigned v) {
  return atomic(p, [v](unsigned) { return v; });
}
float atomic_exch(float* p, float v) {
  return atomic(p, [v](float) { return v; });
}
int atomic_cas(int* p, int c, int v) {
  return atomic(p, [c, v](int o) { return o == c ? v : o; });
}
unsigned atomic_cas(unsigned* p, unsigned c, unsigned v) {
  return atomic(p, [c, v](unsigned o) { return o == c ? v : o; });
}
unsigned long long atomic_cas(unsigned long long* p, unsigned long long c, unsigned long long v) {
  return atomic(p, [c, v](unsigned long long o) { return o == c ? v : o; });
}

cudaError_t run_kernel(const KernelLaunch& k, std::string& message, Accesses& touched) {
  g_touched = Touched{};
  g_touched.out = &touched;
  struct Done {
    ~Done() {
      for (auto* v : {&g_touched.out->reads, &g_touched.out->writes}) {
        std::sort(v->begin(), v->end());
        v->erase(std::unique(v->begin(), v->end()), v->end());
      }
      g_touched.out = nullptr;
    }
  } done;
  static thread_local std::vector<Thread>* threads = new std::vector<Thread>(kMaxThreads);
  const int n = static_cast<int>(k.block.x * k.block.y * k.block.z);
  Block b;
  b.k = &k;
  b.threads = n;
  b.warps.resize((n + 31) / 32);
  for (size_t w = 0; w < b.warps.size(); ++w) {
    const int lanes = std::min(32, n - static_cast<int>(w) * 32);
    b.warps[w].present = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
  }
  for (unsigned z = 0; z < k.grid.z; ++z)
    for (unsigned y = 0; y < k.grid.y; ++y)
      for (unsigned x = 0; x < k.grid.x; ++x) {
        b.idx = {x, y, z};
        b.live = n;
        b.arrived = 0;
        b.abort = false;
        b.epoch = 0;
        for (Warp& w : b.warps) {
          w.pending.clear();
          w.epoch = 0;
          w.exited = 0;
        }
        reset_shared(b);
        b.variables.clear();
        b.unwritten_read = false;
        run_block(b, *threads);
        report_unwritten_read(b);
        if (b.error != cudaSuccess) {
          message = b.message;
          return b.error;
        }
      }
  return cudaSuccess;
}

}  // namespace kiln::emu

// The instrumentation's calls (GCC's -fsanitize=kernel-address with
// --param asan-instrumentation-with-call-threshold=0): one per load and store
// of a kernel's translation unit, exported for the programs the emulated
// NVRTC compiles.
#define KILN_EMU_HOOKS(n)                                                                         \
  extern "C" __attribute__((visibility("default"))) void __asan_load##n##_noabort(uintptr_t a) {  \
    kiln::emu::access(a, n, false, true);                                                         \
  }                                                                                               \
  extern "C" __attribute__((visibility("default"))) void __asan_store##n##_noabort(uintptr_t a) { \
    kiln::emu::access(a, n, true, true);                                                          \
  }
KILN_EMU_HOOKS(1)
KILN_EMU_HOOKS(2)
KILN_EMU_HOOKS(4)
KILN_EMU_HOOKS(8)
KILN_EMU_HOOKS(16)
#undef KILN_EMU_HOOKS
extern "C" __attribute__((visibility("default"))) void __asan_loadN_noabort(uintptr_t a, size_t n) {
  kiln::emu::access(a, n, false, false);
}
extern "C" __attribute__((visibility("default"))) void __asan_storeN_noabort(uintptr_t a,
                                                                             size_t n) {
  kiln::emu::access(a, n, true, false);
}
extern "C" __attribute__((visibility("default"))) void __asan_handle_no_return() {}
extern "C" __attribute__((visibility("default"))) void __asan_before_dynamic_init(const char*) {}
extern "C" __attribute__((visibility("default"))) void __asan_after_dynamic_init() {}
