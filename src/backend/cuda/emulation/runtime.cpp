// kiln's CUDA emulator: the CUDA runtime functions the backend calls, on the
// host. Devices are emulated where KILN_CUDA_EMULATOR names how many (none by
// default: a user of this build without a GPU sees none); their
// memory is the emulator's heap (memory.h). Work queued on a stream runs
// when it is queued, in order, one piece at a time in the process (so every
// event has completed when it is recorded); while a stream is captured, the
// work is recorded into the capture instead and runs at each launch of the
// graph made from it. What CUDA forbids is an error here too: a launch on
// another device's stream, a copy out of range or of memory never written, a
// synchronization inside a capture, a capture waiting for work outside it,
// a capture that ends before the streams it forked have joined it.
//
// The functions are CUDA's own declarations (cuda_runtime_api.h), exported
// (KILN_EMU_RUNTIME) so that tests and programs of the emulation build call
// them as CUDA's; libkiln binds its own calls to them (-Bsymbolic-functions),
// so that a CUDA runtime elsewhere in the process does not take their place.
#include <dlfcn.h>
#include <elf.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/cuda/emulation/internal.h"
#include "backend/cuda/emulation/memory.h"

namespace kiln::emu {
struct Capture;

// A vector clock: for each stream (by its id), how much of its work is
// ordered before a point (CUDA's stream semantics: a stream's work is
// ordered; another stream's only through an event it waited for, or a host
// synchronization before the work was queued).
struct Clock {
  std::vector<uint64_t> t;
  uint64_t at(int i) const { return static_cast<size_t>(i) < t.size() ? t[i] : 0; }
  uint64_t& own(int i) {
    if (static_cast<size_t>(i) >= t.size()) t.resize(i + 1);
    return t[i];
  }
  void join(const Clock& o) {
    if (o.t.size() > t.size()) t.resize(o.t.size());
    for (size_t i = 0; i < o.t.size(); ++i) t[i] = std::max(t[i], o.t[i]);
  }
};
}  // namespace kiln::emu

struct CUstream_st {
  int device = 0;
  kiln::emu::Capture* capture = nullptr;  // the capture it records into
  int id = -1;                            // its index among the streams, once it has work
  kiln::emu::Clock clock;                 // the work ordered before its next work
};

struct CUevent_st {
  int device = 0;
  kiln::emu::Clock clock;  // the work ordered before its last record
  uint64_t capture = 0;  // the capture it was recorded into (0: none)
  cudaStream_t stream = nullptr;
  size_t position = 0;  // the capture's work recorded before it, from `stream`
};

// Memory a graph allocated while it was captured: kept until the graph goes.
struct GraphMemory {
  std::vector<void*> allocations;
  ~GraphMemory() {
    for (void* p : allocations) kiln::emu::heap_free(p);
  }
};

struct CUgraph_st {
  std::vector<kiln::emu::Work> work;
  std::shared_ptr<GraphMemory> memory;
};

struct CUgraphExec_st {
  std::vector<kiln::emu::Work> work;
  std::shared_ptr<GraphMemory> memory;
};

struct CUmemPoolHandle_st {
  int device = 0;
};

// A program the emulated NVRTC compiled: a shared object, loaded.
struct CUlib_st {
  void* handle = nullptr;
  int fd = -1;
};

// One of its kernels: the entry that launches it from cudaLaunchKernel's
// argument array (written by the emulated NVRTC for each kernel).
using KernelThunk = void (*)(dim3, dim3, size_t, cudaStream_t, void**);
struct CUkern_st {
  KernelThunk thunk = nullptr;
};

namespace kiln::emu {

struct Capture {
  uint64_t id = 0;
  cudaStream_t origin = nullptr;
  std::thread::id thread;
  std::vector<Work> work;
  std::map<cudaStream_t, size_t> last;    // stream -> work recorded from it (count)
  std::map<cudaStream_t, size_t> joined;  // stream -> its work the origin has waited for
  std::shared_ptr<GraphMemory> memory = std::make_shared<GraphMemory>();
  std::set<void*> allocated;  // by this capture, not freed in it
  cudaError_t invalid = cudaSuccess;
  std::string why;
};

namespace {

std::mutex g_mu;  // streams' capture state, the captures
std::map<uint64_t, Capture*> g_captures;
uint64_t g_next_capture = 1;

thread_local int tls_device = 0;
thread_local cudaError_t tls_error = cudaSuccess;  // the sticky last error
thread_local cudaError_t tls_message_code = cudaSuccess;
thread_local std::string tls_message;
thread_local int tls_capturing = 0;  // captures this thread has begun and not ended

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end || n < lo || n > hi) return fallback;
  return static_cast<int>(n);
}

cudaError_t fail(cudaError_t e, std::string message) {
  set_error(e, std::move(message));
  return e;
}

bool valid_device(int d) {
  return d >= 0 && d < device_count();
}

CUstream_st* default_stream(int device) {
  static CUstream_st streams[64];
  streams[device].device = device;
  return &streams[device];
}

CUstream_st* resolve(cudaStream_t s) {
  return s ? s : default_stream(tls_device);
}

// ---- the order of work on streams ----
// Each piece of work is a tick of its stream's clock; each allocation keeps
// the last write and the reads since (per stream) as (stream, tick). Work
// that touches an allocation must be ordered after the last write, and
// a write after the reads, unless they came from its own stream.
struct Touch {
  int stream = -1;
  uint64_t tick = 0;
};
struct Record {
  Touch write;
  std::vector<Touch> reads;  // the latest of each stream
};

std::mutex g_order_mu;
std::vector<CUstream_st*> g_streams;  // by id
kiln::emu::Clock g_host;              // the work the host has waited for
std::unordered_map<uint32_t, Record> g_records;

int stream_id(CUstream_st* s) {
  if (s->id < 0) {
    s->id = static_cast<int>(g_streams.size());
    g_streams.push_back(s);
  }
  return s->id;
}

std::string stream_name(int id) {
  const CUstream_st* s = g_streams[id];
  return "stream " + std::to_string(id) + " (cuda:" + std::to_string(s->device) +
         (s == default_stream(s->device) ? ", the default stream)" : ")");
}

// Checks and records what a piece of work on stream s touched; false (with
// the message) where it was not ordered after another stream's work on the
// same memory.
bool check_order(CUstream_st* s, const char* what, const Accesses& touched, std::string& message) {
  std::lock_guard<std::mutex> lock(g_order_mu);
  const int me = stream_id(s);
  s->clock.join(g_host);
  const uint64_t tick = ++s->clock.own(me);
  auto ordered = [&](const Touch& t) {
    return t.stream < 0 || t.stream == me || s->clock.at(t.stream) >= t.tick;
  };
  auto report = [&](uint32_t id, const Touch& t, const char* did) {
    message = std::string(what) + " on " + stream_name(me) + " touches " + describe_allocation(id) +
              ", which " + stream_name(t.stream) + " " + did + " in its work #" +
              std::to_string(t.tick) + ", and " + stream_name(me) +
              " has not waited for that work (an event recorded on the one stream after it and "
              "waited for by the other, or a host synchronization before this was queued)";
    return false;
  };
  for (uint32_t id : touched.reads) {
    auto it = g_records.find(id);
    if (it != g_records.end() && !ordered(it->second.write))
      return report(id, it->second.write, "wrote");
  }
  for (uint32_t id : touched.writes) {
    auto it = g_records.find(id);
    if (it == g_records.end()) continue;
    if (!ordered(it->second.write)) return report(id, it->second.write, "wrote");
    for (const Touch& r : it->second.reads)
      if (!ordered(r)) return report(id, r, "read");
  }
  for (uint32_t id : touched.reads) {
    auto& reads = g_records[id].reads;
    auto r =
        std::find_if(reads.begin(), reads.end(), [&](const Touch& x) { return x.stream == me; });
    if (r == reads.end())
      reads.push_back({me, tick});
    else
      r->tick = tick;
  }
  for (uint32_t id : touched.writes) {
    Record& r = g_records[id];
    r.write = {me, tick};
    r.reads.clear();
  }
  return true;
}

// The host has waited for the work ordered before `c`.
void host_waited(const kiln::emu::Clock& c) {
  std::lock_guard<std::mutex> lock(g_order_mu);
  g_host.join(c);
}

void forget(uint32_t id) {
  std::lock_guard<std::mutex> lock(g_order_mu);
  g_records.erase(id);
}

}  // namespace

// Work on stream s: run now, or recorded into its capture.
cudaError_t submit(cudaStream_t stream, const char* what, Work work) {
  CUstream_st* s = resolve(stream);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (Capture* c = s->capture) {
      if (c->invalid != cudaSuccess)
        return fail(cudaErrorStreamCaptureInvalidated,
                    std::string(what) + " on a stream whose capture was invalidated: " + c->why);
      c->work.push_back(std::move(work));
      c->last[s] = c->work.size();
      return cudaSuccess;
    }
  }
  std::lock_guard<std::recursive_mutex> lock(device_work());
  std::string message;
  Accesses touched;
  const cudaError_t e = work(message, touched);
  if (e != cudaSuccess) return fail(e, message);
  if (!check_order(s, what, touched, message)) return fail(cudaErrorLaunchFailure, message);
  return cudaSuccess;
}

int stream_device(cudaStream_t stream) {
  return resolve(stream)->device;
}

namespace {

// Invalidates the capture of stream s, as CUDA does when a captured stream
// is used in a way a graph cannot record.
cudaError_t invalidate(CUstream_st* s, cudaError_t e, const std::string& why) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (s->capture && s->capture->invalid == cudaSuccess) {
    s->capture->invalid = e;
    s->capture->why = why;
  }
  return fail(e, why);
}

// Fails (cudaErrorStreamCaptureUnsupported) where this thread is capturing:
// `what` would synchronize with work that is being recorded, not run.
bool forbidden_in_capture(const char* what) {
  if (!tls_capturing) return false;
  fail(cudaErrorStreamCaptureUnsupported,
       std::string(what) +
           " while this thread captures a stream (cudaStreamCaptureModeThreadLocal)");
  return true;
}

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidKernelImage, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation is not permitted in the current state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined",
     "capture was not joined with the origin stream"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "the capture was not initiated in this stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
};

const ErrorText* error_text(cudaError_t e) {
  for (const ErrorText& t : kErrors)
    if (t.code == e) return &t;
  return nullptr;
}

// A copy's ranges, checked when it runs: device ranges must be live memory
// (of the given device, where >= 0), a device source written; host ranges
// must not be device memory.
struct CopyEnd {
  const void* p;
  bool device;
  int index;  // the device, or -1 for any
};

std::string check_copy(const char* what, const CopyEnd& dst, const CopyEnd& src, size_t n) {
  const std::string w = what;
  if (src.device) {
    if (std::string e = check_range(src.p, n, src.index, true, (w + "'s source").c_str());
        !e.empty())
      return e;
  } else if (in_heap(src.p)) {
    return w + "'s source is device memory, but the copy's kind says host memory";
  }
  if (dst.device) {
    if (std::string e = check_range(dst.p, n, dst.index, false, (w + "'s destination").c_str());
        !e.empty())
      return e;
  } else if (in_heap(dst.p)) {
    return w + "'s destination is device memory, but the copy's kind says host memory";
  }
  return {};
}

cudaError_t copy(const char* what, void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                 int dst_device, int src_device, cudaStream_t stream) {
  bool from_device, to_device;
  switch (kind) {
    case cudaMemcpyHostToHost: from_device = to_device = false; break;
    case cudaMemcpyHostToDevice: from_device = false, to_device = true; break;
    case cudaMemcpyDeviceToHost: from_device = true, to_device = false; break;
    case cudaMemcpyDeviceToDevice: from_device = to_device = true; break;
    case cudaMemcpyDefault: from_device = in_heap(src), to_device = in_heap(dst); break;
    default: return fail(cudaErrorInvalidValue, std::string(what) + ": unknown copy kind");
  }
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue, std::string(what) + " with a null pointer");
  const CopyEnd d{dst, to_device, dst_device}, s{src, from_device, src_device};
  return submit(stream, what, [=](std::string& message, Accesses& touched) {
    if (std::string e = check_copy(what, d, s, n); !e.empty()) {
      message = e;
      return cudaErrorInvalidValue;
    }
    if (from_device) allocation_ids(src, n, touched.reads);
    if (to_device) allocation_ids(dst, n, touched.writes);
    std::memmove(dst, src, n);
    if (to_device && from_device)
      copy_written_state(dst, src, n);
    else if (to_device)
      mark_written(dst, n);
    return cudaSuccess;
  });
}

}  // namespace

std::recursive_mutex& device_work() {
  static std::recursive_mutex mu;
  return mu;
}

int current_device() {
  return tls_device;
}

void set_error(cudaError_t e, std::string message) {
  tls_error = e;
  tls_message_code = e;
  tls_message = std::move(message);
}

int device_count() {
  static const int n = env_int("KILN_CUDA_EMULATOR", 0, 0, 64);
  return n;
}

int multiprocessor_count() {
  static const int n = env_int("KILN_CUDA_EMULATOR_SMS", 4, 1, 1024);
  return n;
}

void launch(const char* name, dim3 grid, dim3 block, size_t dynamic_shared, cudaStream_t stream,
            std::shared_ptr<const void> closure, KernelEntry entry) {
  CUstream_st* s = resolve(stream);
  const std::string who = std::string("launch of ") + name;
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64) {
    fail(cudaErrorInvalidConfiguration,
         who + ": a block of " + std::to_string(block.x) + " x " + std::to_string(block.y) + " x " +
             std::to_string(block.z) + " threads (at most 1024, and 1024 x 1024 x 64)");
    return;
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535) {
    fail(cudaErrorInvalidConfiguration,
         who + ": a grid of " + std::to_string(grid.x) + " x " + std::to_string(grid.y) + " x " +
             std::to_string(grid.z) +
             " blocks (each at least 1; at most 2^31 - 1 x 65535 x 65535)");
    return;
  }
  if (dynamic_shared > kSharedPerBlockOptin) {
    fail(cudaErrorInvalidValue,
         who + ": " + std::to_string(dynamic_shared) +
             " bytes of dynamic shared memory, more than a block may have (" +
             std::to_string(kSharedPerBlockOptin) + ")");
    return;
  }
  if (s->device != tls_device) {
    fail(cudaErrorInvalidResourceHandle, who + " on a stream of cuda:" + std::to_string(s->device) +
                                             " while cuda:" + std::to_string(tls_device) +
                                             " is the current device");
    return;
  }
  KernelLaunch k;
  k.name = name;
  k.grid = grid;
  k.block = block;
  k.dynamic_shared = dynamic_shared;
  k.device = s->device;
  k.closure = std::move(closure);
  k.entry = entry;
  submit(s, who.c_str(),
         [k](std::string& message, Accesses& touched) { return run_kernel(k, message, touched); });
}

}  // namespace kiln::emu

using namespace kiln::emu;

#define KILN_EMU_RUNTIME __attribute__((visibility("default")))

// ---- errors ----
KILN_EMU_RUNTIME cudaError_t cudaGetLastError() {
  const cudaError_t e = tls_error;
  tls_error = cudaSuccess;
  return e;
}

KILN_EMU_RUNTIME cudaError_t cudaPeekAtLastError() {
  return tls_error;
}

KILN_EMU_RUNTIME const char* cudaGetErrorName(cudaError_t e) {
  const ErrorText* t = error_text(e);
  return t ? t->name : "cudaErrorUnknown";
}

// The emulator's own message for the thread's last error, where it has one.
KILN_EMU_RUNTIME const char* cudaGetErrorString(cudaError_t e) {
  if (e == tls_message_code && !tls_message.empty()) return tls_message.c_str();
  const ErrorText* t = error_text(e);
  return t ? t->text : "unknown error";
}

// ---- devices ----
KILN_EMU_RUNTIME cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  if (*count == 0)
    return fail(cudaErrorNoDevice,
                "this kiln runs its CUDA backend on kiln's CUDA emulator (built where no GPU was "
                "visible); KILN_CUDA_EMULATOR=2 gives it two emulated devices (slow: for tests)");
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device))
    return fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) +
                                            "): the emulator has " +
                                            std::to_string(device_count()) + " devices");
  tls_device = device;
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaGetDevice(int* device) {
  *device = tls_device;
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties");
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "kiln CUDA emulator (sm_90)");
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = multiprocessor_count();
  p->totalGlobalMem = kDeviceMemory;
  p->sharedMemPerBlock = kSharedPerBlock;
  p->sharedMemPerBlockOptin = kSharedPerBlockOptin;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->regsPerBlock = 65536;
  p->unifiedAddressing = 1;
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaDeviceSynchronize() {
  if (forbidden_in_capture("cudaDeviceSynchronize")) return cudaErrorStreamCaptureUnsupported;
  std::lock_guard<std::mutex> lock(g_order_mu);
  for (CUstream_st* s : g_streams)
    if (s->device == tls_device) g_host.join(s->clock);
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize &&
      (value < 0 || static_cast<size_t>(value) > kSharedPerBlockOptin))
    return fail(cudaErrorInvalidValue,
                "cudaFuncSetAttribute: " + std::to_string(value) +
                    " bytes of dynamic shared memory, more than a block may have (" +
                    std::to_string(kSharedPerBlockOptin) + ")");
  return cudaSuccess;
}

// ---- memory ----
KILN_EMU_RUNTIME cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  static CUmemPoolHandle_st pools[64];
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice, "cudaDeviceGetDefaultMemPool");
  pools[device].device = device;
  *pool = &pools[device];
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) {
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr,
                                                     void* value) {
  uint64_t v = 0;
  switch (attr) {
    case cudaMemPoolAttrReservedMemCurrent:
    case cudaMemPoolAttrUsedMemCurrent: v = heap_in_use(pool->device); break;
    case cudaMemPoolAttrReservedMemHigh:
    case cudaMemPoolAttrUsedMemHigh: v = heap_peak(pool->device); break;
    default:
      return fail(cudaErrorNotSupported,
                  "cudaMemPoolGetAttribute: an attribute the emulator has not");
  }
  std::memcpy(value, &v, sizeof v);
  return cudaSuccess;
}

namespace {

cudaError_t allocate(void** p, size_t bytes, int device, cudaStream_t stream, const char* who) {
  *p = heap_allocate(device, bytes);
  if (!*p)
    return fail(cudaErrorMemoryAllocation,
                std::string(who) + ": out of memory on cuda:" + std::to_string(device) + " (" +
                    std::to_string(bytes) + " bytes asked, " + std::to_string(heap_in_use(device)) +
                    " of " + std::to_string(kDeviceMemory) + " in use)");
  CUstream_st* s = stream ? stream : nullptr;
  if (!s) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mu);
  if (Capture* c = s->capture) {
    // A graph's allocation: fresh again at each launch, kept until the graph goes.
    c->memory->allocations.push_back(*p);
    c->allocated.insert(*p);
    void* q = *p;
    c->work.push_back([q, bytes, device](std::string&, Accesses& touched) {
      allocation_ids(q, bytes, touched.writes);
      std::memset(q, 0xff, bytes);
      std::memset(shadow_of(q), shadow_byte(kFresh, device), bytes);
      return cudaSuccess;
    });
    c->last[s] = c->work.size();
    return cudaSuccess;
  }
  // Memory of the pool is the stream's from here on: another stream must wait for it.
  std::string message;
  Accesses touched;
  touched.writes.push_back(allocation_id(*p));
  if (!check_order(s, who, touched, message)) return fail(cudaErrorLaunchFailure, message);
  return cudaSuccess;
}

}  // namespace

KILN_EMU_RUNTIME cudaError_t cudaMallocFromPoolAsync(void** p, size_t bytes, cudaMemPool_t pool,
                                                     cudaStream_t stream) {
  return allocate(p, bytes, pool->device, resolve(stream), "cudaMallocFromPoolAsync");
}

KILN_EMU_RUNTIME cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (forbidden_in_capture("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
  return allocate(p, bytes, tls_device, nullptr, "cudaMalloc");
}

KILN_EMU_RUNTIME cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (!p) return cudaSuccess;
  CUstream_st* s = resolve(stream);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (Capture* c = s->capture) {
      if (c->allocated.erase(p)) {
        // Freed inside the graph: unusable from here to the graph's end.
        const size_t bytes = [&] {
          size_t n = 0;
          const uint8_t* sh = shadow_of(p);
          while (shadow_state(sh[n]) != kNoMemory) ++n;
          return n;
        }();
        c->work.push_back([p, bytes](std::string&, Accesses& touched) {
          allocation_ids(p, 1, touched.writes);
          std::memset(shadow_of(p), kNoMemory, bytes);
          return cudaSuccess;
        });
      } else {
        c->work.push_back([p](std::string& message, Accesses& touched) {
          const uint32_t id = in_heap(p) ? allocation_id(p) : 0;
          if (id) touched.writes.push_back(id);
          if (heap_free(p)) return cudaSuccess;
          message = "a graph frees " + describe(p, 1) + " (freed by an earlier launch of it?)";
          return cudaErrorInvalidValue;
        });
      }
      c->last[s] = c->work.size();
      return cudaSuccess;
    }
  }
  std::lock_guard<std::recursive_mutex> lock(device_work());
  const uint32_t id = in_heap(p) ? allocation_id(p) : 0;
  if (id) {
    // A free is a write: the work of other streams on the memory must be ordered before it.
    std::string message;
    Accesses touched;
    touched.writes.push_back(id);
    if (!check_order(s, "cudaFreeAsync", touched, message))
      return fail(cudaErrorLaunchFailure, message);
  }
  if (!heap_free(p))
    return fail(cudaErrorInvalidValue,
                "cudaFreeAsync of " + describe(p, 1) + ", not the start of a live allocation");
  forget(id);
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaFree(void* p) {
  if (forbidden_in_capture("cudaFree")) return cudaErrorStreamCaptureUnsupported;
  if (!p) return cudaSuccess;
  cudaDeviceSynchronize();  // cudaFree waits for the device, as CUDA's does
  std::lock_guard<std::recursive_mutex> lock(device_work());
  const uint32_t id = in_heap(p) ? allocation_id(p) : 0;
  if (!heap_free(p))
    return fail(cudaErrorInvalidValue,
                "cudaFree of " + describe(p, 1) + ", not the start of a live allocation");
  forget(id);
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  *p = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation, "cudaHostAlloc");
}

KILN_EMU_RUNTIME cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return cudaHostAlloc(p, bytes, 0);
}

KILN_EMU_RUNTIME cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

// ---- copies and fills ----
KILN_EMU_RUNTIME cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n,
                                             cudaMemcpyKind kind, cudaStream_t stream) {
  return copy("cudaMemcpyAsync", dst, src, n, kind, -1, -1, stream);
}

KILN_EMU_RUNTIME cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (forbidden_in_capture("cudaMemcpy")) return cudaErrorStreamCaptureUnsupported;
  const cudaError_t e = copy("cudaMemcpy", dst, src, n, kind, -1, -1, nullptr);
  host_waited(default_stream(tls_device)->clock);  // a blocking copy
  return e;
}

KILN_EMU_RUNTIME cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src,
                                                 int src_device, size_t n, cudaStream_t stream) {
  if (!valid_device(dst_device) || !valid_device(src_device))
    return fail(cudaErrorInvalidDevice,
                "cudaMemcpyPeerAsync between cuda:" + std::to_string(src_device) +
                    " and cuda:" + std::to_string(dst_device));
  return copy("cudaMemcpyPeerAsync", dst, src, n, cudaMemcpyDeviceToDevice, dst_device, src_device,
              stream);
}

KILN_EMU_RUNTIME cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return submit(stream, "cudaMemsetAsync", [=](std::string& message, Accesses& touched) {
    if (std::string e = check_range(p, n, -1, false, "cudaMemsetAsync's range"); !e.empty()) {
      message = e;
      return cudaErrorInvalidValue;
    }
    allocation_ids(p, n, touched.writes);
    std::memset(p, value, n);
    mark_written(p, n);
    return cudaSuccess;
  });
}

KILN_EMU_RUNTIME cudaError_t cudaMemset(void* p, int value, size_t n) {
  if (forbidden_in_capture("cudaMemset")) return cudaErrorStreamCaptureUnsupported;
  const cudaError_t e = cudaMemsetAsync(p, value, n, nullptr);
  host_waited(default_stream(tls_device)->clock);
  return e;
}

// ---- streams and events ----
KILN_EMU_RUNTIME cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  auto* s = new CUstream_st();
  s->device = tls_device;
  *stream = s;
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, 0);
}

KILN_EMU_RUNTIME cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream)
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of the default stream");
  std::lock_guard<std::mutex> lock(g_mu);
  if (stream->capture)
    return fail(cudaErrorIllegalState, "cudaStreamDestroy of a stream that is being captured");
  if (stream->id >= 0) {
    // Its work stays in the order (records name it, a device synchronization
    // waits for it): its id keeps the device and clock it had.
    std::lock_guard<std::mutex> order(g_order_mu);
    auto* retired = new CUstream_st();
    retired->device = stream->device;
    retired->id = stream->id;
    retired->clock = stream->clock;
    g_streams[stream->id] = retired;
  }
  delete stream;
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (s->capture)
    return invalidate(s, cudaErrorStreamCaptureUnsupported,
                      "cudaStreamSynchronize of a stream that is being captured");
  if (forbidden_in_capture("cudaStreamSynchronize")) return cudaErrorStreamCaptureUnsupported;
  host_waited(s->clock);
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  auto* e = new CUevent_st();
  e->device = tls_device;
  *event = e;
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, 0);
}

KILN_EMU_RUNTIME cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (s->device != event->device)
    return fail(cudaErrorInvalidResourceHandle,
                "cudaEventRecord of an event of cuda:" + std::to_string(event->device) +
                    " on a stream of cuda:" + std::to_string(s->device));
  std::lock_guard<std::mutex> lock(g_mu);
  if (Capture* c = s->capture) {
    event->capture = c->id;
    event->stream = s;
    event->position = c->last.count(s) ? c->last[s] : 0;
  } else {
    event->capture = 0;
    event->stream = s;
    std::lock_guard<std::mutex> order(g_order_mu);
    stream_id(s);
    s->clock.join(g_host);
    event->clock = s->clock;
  }
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (event->capture && g_captures.count(event->capture))
    return fail(cudaErrorStreamCaptureUnsupported,
                "cudaEventQuery of an event recorded in a capture");
  // Work runs when it is queued: every recorded event has completed, and the
  // host that asks knows it.
  std::lock_guard<std::mutex> order(g_order_mu);
  g_host.join(event->clock);
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (forbidden_in_capture("cudaEventSynchronize")) return cudaErrorStreamCaptureUnsupported;
  return cudaEventQuery(event);
}

KILN_EMU_RUNTIME cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                                 unsigned int) {
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = event->capture ? g_captures.find(event->capture) : g_captures.end();
  Capture* from = it == g_captures.end() ? nullptr : it->second;
  if (from) {
    if (!s->capture) {
      // The stream joins the capture (CUDA's fork of a captured stream).
      s->capture = from;
      from->last.try_emplace(s, from->work.size());
    } else if (s->capture != from) {
      return fail(cudaErrorStreamCaptureIsolation,
                  "cudaStreamWaitEvent: a stream captured into one graph waits for an event "
                  "recorded in another capture");
    }
    if (s == from->origin && event->stream != s) {
      size_t& j = from->joined[event->stream];
      j = std::max(j, event->position);
    }
  } else if (s->capture && s->capture->invalid == cudaSuccess) {
    s->capture->invalid = cudaErrorStreamCaptureIsolation;
    s->capture->why = "a captured stream waited for an event recorded outside the capture";
    return fail(cudaErrorStreamCaptureIsolation, s->capture->why);
  } else if (!s->capture) {
    std::lock_guard<std::mutex> order(g_order_mu);
    s->clock.join(event->clock);
  }
  return cudaSuccess;
}

// ---- stream capture and graphs ----
KILN_EMU_RUNTIME cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  CUstream_st* s = resolve(stream);
  if (!stream)
    return fail(cudaErrorStreamCaptureUnsupported, "capture of the legacy default stream");
  std::lock_guard<std::mutex> lock(g_mu);
  if (s->capture)
    return fail(cudaErrorIllegalState, "cudaStreamBeginCapture of a stream already captured");
  auto* c = new Capture();
  c->id = g_next_capture++;
  c->origin = s;
  c->thread = std::this_thread::get_id();
  c->last[s] = 0;
  g_captures[c->id] = c;
  s->capture = c;
  ++tls_capturing;
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  *graph = nullptr;
  CUstream_st* s = resolve(stream);
  std::unique_ptr<Capture> c;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!s->capture)
      return fail(cudaErrorIllegalState, "cudaStreamEndCapture of a stream not captured");
    if (s->capture->origin != s)
      return fail(cudaErrorStreamCaptureUnmatched,
                  "cudaStreamEndCapture of a stream that joined a capture begun on another");
    if (s->capture->thread != std::this_thread::get_id())
      return fail(cudaErrorStreamCaptureWrongThread, "cudaStreamEndCapture from another thread");
    c.reset(s->capture);
    g_captures.erase(c->id);
    --tls_capturing;
    std::string unjoined;
    for (auto& [other, count] : c->last) {
      other->capture = nullptr;
      if (other == s) continue;
      auto j = c->joined.find(other);
      if (count > (j == c->joined.end() ? 0 : j->second)) unjoined = "a stream forked from it";
    }
    if (c->invalid == cudaSuccess && !unjoined.empty()) {
      c->invalid = cudaErrorStreamCaptureUnjoined;
      c->why = "the capture ended before " + unjoined +
               " joined it again (an event the origin stream waited for)";
    }
  }
  if (c->invalid != cudaSuccess) {
    const cudaError_t e = c->invalid == cudaErrorStreamCaptureUnsupported ||
                                  c->invalid == cudaErrorStreamCaptureIsolation
                              ? cudaErrorStreamCaptureInvalidated
                              : c->invalid;
    return fail(e, "the capture failed: " + c->why);
  }
  *graph = new CUgraph_st{std::move(c->work), c->memory};
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                                      cudaStreamCaptureStatus* status,
                                                      unsigned long long* id, cudaGraph_t* graph,
                                                      const cudaGraphNode_t** dependencies,
                                                      const cudaGraphEdgeData** edges,
                                                      size_t* count) {
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!s->capture) {
    *status = cudaStreamCaptureStatusNone;
  } else {
    *status = s->capture->invalid == cudaSuccess ? cudaStreamCaptureStatusActive
                                                 : cudaStreamCaptureStatusInvalidated;
    if (id) *id = s->capture->id;
  }
  if (graph) *graph = nullptr;
  if (dependencies) *dependencies = nullptr;
  if (edges) *edges = nullptr;
  if (count) *count = 0;
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                                   cudaStreamCaptureStatus* status) {
  return cudaStreamGetCaptureInfo(stream, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}

KILN_EMU_RUNTIME cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                                  unsigned long long) {
  *exec = new CUgraphExec_st{graph->work, graph->memory};
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (s->capture)
      return fail(cudaErrorNotSupported,
                  "cudaGraphLaunch into a captured stream (the emulator has no child graphs)");
  }
  std::lock_guard<std::recursive_mutex> lock(device_work());
  // The graph's work, in the order it was recorded, as work of the stream
  // that launches it (its branches were joined when it was captured).
  for (Work& w : exec->work) {
    std::string message;
    Accesses touched;
    if (cudaError_t e = w(message, touched); e != cudaSuccess)
      return fail(e, "in a launch of a CUDA Graph: " + message);
    if (!check_order(s, "a launch of a CUDA Graph", touched, message))
      return fail(cudaErrorLaunchFailure, message);
  }
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

// ---- programs of the emulated NVRTC: shared objects for the host ----
namespace {

// The size of an ELF file from its header (the section headers come last in
// what the linker writes), or 0 where it is not a host shared object.
size_t shared_object_size(const void* code) {
  Elf64_Ehdr h;
  std::memcpy(&h, code, sizeof h);
  if (std::memcmp(h.e_ident, ELFMAG, SELFMAG) != 0 || h.e_ident[EI_CLASS] != ELFCLASS64 ||
      h.e_machine != EM_X86_64 || h.e_type != ET_DYN)
    return 0;
  return std::max<size_t>(h.e_shoff + size_t{h.e_shnum} * h.e_shentsize,
                          h.e_phoff + size_t{h.e_phnum} * h.e_phentsize);
}

}  // namespace

KILN_EMU_RUNTIME cudaError_t cudaLibraryLoadData(cudaLibrary_t* library, const void* code,
                                                 cudaJitOption*, void**, unsigned int,
                                                 cudaLibraryOption*, void**, unsigned int) {
  const size_t n = shared_object_size(code);
  if (n == 0)
    return fail(cudaErrorInvalidKernelImage,
                "cudaLibraryLoadData: not a program of the emulated NVRTC (a host shared object); "
                "a cubin compiled for a GPU?");
  const int fd = memfd_create("kiln-emulated-nvrtc", MFD_CLOEXEC);
  if (fd < 0 || write(fd, code, n) != static_cast<ssize_t>(n)) {
    if (fd >= 0) close(fd);
    return fail(cudaErrorInvalidKernelImage, "cudaLibraryLoadData: cannot write the program");
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const std::string e = dlerror();
    close(fd);
    return fail(cudaErrorInvalidKernelImage, "cudaLibraryLoadData: " + e);
  }
  *library = new CUlib_st{h, fd};
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaLibraryGetKernel(cudaKernel_t* kernel, cudaLibrary_t library,
                                                  const char* name) {
  void* f = dlsym(library->handle, (std::string("kiln_emu_launch_") + name).c_str());
  if (!f)
    return fail(cudaErrorSymbolNotFound,
                std::string("cudaLibraryGetKernel: the program has no kernel ") + name);
  *kernel = new CUkern_st{reinterpret_cast<KernelThunk>(f)};
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaLibraryUnload(cudaLibrary_t library) {
  dlclose(library->handle);
  close(library->fd);
  delete library;
  return cudaSuccess;
}

KILN_EMU_RUNTIME cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args,
                                              size_t shared, cudaStream_t stream) {
  const auto* k = static_cast<const CUkern_st*>(func);
  tls_error = cudaSuccess;
  k->thunk(grid, block, shared, stream, args);
  return tls_error;
}
