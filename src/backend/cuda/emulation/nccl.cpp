// kiln's CUDA emulator: the NCCL functions kiln calls (collectives.cu), on
// the host. A communicator's ranks — emulated devices in one process, or in
// the processes `mpirun` starts — meet in one POSIX shared-memory segment
// named by the unique id: a barrier and a slot per rank. An all-reduce
// passes its values through the slots in chunks; every rank sums the ranks'
// values in rank order, so that all of them get the same bits, as NCCL's
// ranks do. An all-reduce is work on its stream like a kernel (recorded into
// a capture); while it waits for the other ranks, it lets other device work
// of its process run (the other ranks may be threads of it).
#include <fcntl.h>
#include <nccl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "backend/cuda/dynlib.h"
#include "backend/cuda/emulation/internal.h"
#include "backend/cuda/emulation/libraries.h"
#include "backend/cuda/emulation/memory.h"

namespace {

constexpr size_t kChunk = size_t{1} << 20;  // bytes per rank and step
constexpr int kMaxRanks = 64;
constexpr double kTimeoutSeconds = 600;

struct Header {
  std::atomic<int> nranks;
  std::atomic<int> arrived;
  std::atomic<int> generation;
};

}  // namespace

struct ncclComm {
  int nranks = 0, rank = 0;
  Header* header = nullptr;
  unsigned char* slots = nullptr;  // nranks slots of kChunk bytes
  size_t bytes = 0;
};

namespace kiln::emu::nccl {
namespace {

thread_local std::string tls_message;

ncclResult_t fail(ncclResult_t r, std::string message) {
  tls_message = std::move(message);
  return r;
}

// Waits until every rank has arrived (false after the timeout).
bool barrier(ncclComm& c) {
  Header& h = *c.header;
  const int generation = h.generation.load();
  if (h.arrived.fetch_add(1) + 1 == c.nranks) {
    h.arrived.store(0);
    h.generation.fetch_add(1);
    return true;
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (h.generation.load() == generation) {
    sched_yield();
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >
        kTimeoutSeconds)
      return false;
  }
  return true;
}

// Lets other device work of this process run while the ranks meet: only
// within device work (submit holds device_work() once).
struct DeviceWorkReleased {
  DeviceWorkReleased() { device_work().unlock(); }
  ~DeviceWorkReleased() { device_work().lock(); }
};

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return 4;
    case ncclFloat64: return 8;
    default: return 0;
  }
}

template <typename T>
void sum_chunk(const ncclComm& c, T* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T s = reinterpret_cast<const T*>(c.slots)[i];
    for (int r = 1; r < c.nranks; ++r) s += reinterpret_cast<const T*>(c.slots + r * kChunk)[i];
    out[i] = s;
  }
}

cudaError_t all_reduce(ncclComm& c, const void* send, void* recv, size_t count, ncclDataType_t type,
                       int device, std::string& message, Accesses& touched) {
  const size_t elem = type_size(type), bytes = count * elem;
  if (std::string e = check_range(send, bytes, device, true, "ncclAllReduce's send buffer");
      !e.empty()) {
    message = e;
    return cudaErrorIllegalAddress;
  }
  if (std::string e = check_range(recv, bytes, device, false, "ncclAllReduce's receive buffer");
      !e.empty()) {
    message = e;
    return cudaErrorIllegalAddress;
  }
  allocation_ids(send, bytes, touched.reads);
  allocation_ids(recv, bytes, touched.writes);
  DeviceWorkReleased released;
  for (size_t off = 0; off < bytes; off += kChunk) {
    const size_t n = std::min(kChunk, bytes - off);
    std::memcpy(c.slots + c.rank * kChunk, static_cast<const char*>(send) + off, n);
    bool met = barrier(c);
    if (met) {
      char* out = static_cast<char*>(recv) + off;
      if (type == ncclFloat32)
        sum_chunk(c, reinterpret_cast<float*>(out), n / elem);
      else
        sum_chunk(c, reinterpret_cast<double*>(out), n / elem);
      met = barrier(c);  // every rank has read the slots before they are refilled
    }
    if (!met) {
      message = "ncclAllReduce: rank " + std::to_string(c.rank) + " waited " +
                std::to_string(static_cast<int>(kTimeoutSeconds)) + " s for the other ranks";
      return cudaErrorLaunchFailure;
    }
  }
  mark_written(recv, bytes);
  return cudaSuccess;
}

}  // namespace

const char* ncclGetErrorString(ncclResult_t r) {
  if (r != ncclSuccess && !tls_message.empty()) return tls_message.c_str();
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclSystemError: return "system error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    default: return "internal error";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "/kiln-emulated-nccl-%d-%08x%08x",
                static_cast<int>(getpid()), rd(), rd());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument,
                "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  char name[sizeof id.internal + 1] = {};
  std::memcpy(name, id.internal, sizeof id.internal);
  if (std::strncmp(name, "/kiln-emulated-nccl-", 20) != 0)
    return fail(ncclInvalidArgument,
                "ncclCommInitRank: an id not made by the emulator's ncclGetUniqueId");
  const size_t bytes = sizeof(Header) + 64 + static_cast<size_t>(nranks) * kChunk;
  const int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) close(fd);
    return fail(ncclSystemError,
                std::string("ncclCommInitRank: cannot make shared memory ") + name);
  }
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return fail(ncclSystemError, "ncclCommInitRank: cannot map shared memory");
  auto* c = new ncclComm();
  c->nranks = nranks;
  c->rank = rank;
  c->header = static_cast<Header*>(m);
  c->slots = static_cast<unsigned char*>(m) + sizeof(Header) + 64;
  c->bytes = bytes;
  int expected = 0;
  if (!c->header->nranks.compare_exchange_strong(expected, nranks) && expected != nranks) {
    munmap(m, bytes);
    delete c;
    return fail(ncclInvalidArgument, "ncclCommInitRank: ranks disagree on the communicator's size");
  }
  // The host waits here, holding no device work (ranks in threads of one
  // process go on running theirs).
  if (!barrier(*c)) return fail(ncclSystemError, "ncclCommInitRank: the other ranks never joined");
  // Every rank has it mapped: the name may go.
  if (rank == 0) shm_unlink(name);
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (op != ncclSum || !type_size(type))
    return fail(ncclInvalidArgument, "ncclAllReduce: the emulator sums f32 and f64 only");
  const int device = stream_device(stream);
  ncclComm* c = comm;
  const cudaError_t e =
      submit(stream, "ncclAllReduce", [=](std::string& message, Accesses& touched) {
        return all_reduce(*c, send, recv, count, type, device, message, touched);
      });
  if (e != cudaSuccess) return fail(ncclUnhandledCudaError, cudaGetErrorString(cudaGetLastError()));
  return ncclSuccess;
}

}  // namespace kiln::emu::nccl

namespace kiln::emu {

void* nccl_symbol(const char* name) {
  using namespace nccl;
#define KILN_EMU_SYMBOL(fn)        \
  if (std::strcmp(name, #fn) == 0) \
    return reinterpret_cast<void*>(static_cast<decltype(&::fn)>(&fn));
  KILN_NCCL_FUNCTIONS(KILN_EMU_SYMBOL)
#undef KILN_EMU_SYMBOL
  return nullptr;
}

}  // namespace kiln::emu
