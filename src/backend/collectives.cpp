// kiln backends: the process group (kiln/distributed.h) on Open MPI, and the
// host kernels of AllReduceStart / AllReduceWait.
//
// One communication thread per process makes every MPI call (MPI is
// initialized on it, MPI_THREAD_FUNNELED): callers queue collectives and go
// on computing; the thread runs them one at a time in queue order (every
// rank queues the same collectives in the same order). Each starts with the
// ranks' arrival, a non-blocking barrier polled against the timeout, then
// runs as a blocking collective. Each rank tells the others the serial
// number of every collective it starts: one that not every rank reaches
// within the timeout names the ranks that never did.
#include "backend/collectives.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "kiln/distributed.h"
#include "kiln/dtype.h"

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

namespace kiln::dist {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A queued collective.
struct Pending {
  std::string what;  // "the all-reduce of gradient bucket 3 (24.9 MB)"
  bool gradients = false;  // a bucket: its time counts in Stats::busy_seconds
  uint64_t serial = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Clock::time_point started, finished;
#ifdef KILN_HAVE_MPI
  std::function<void()> exchange;  // on the communication thread, once every rank is there
#endif
};

// A gradient bucket: its packed values, and its exchange while in flight.
struct Bucket {
  std::vector<char> data;
  DType dtype = DType::f32;
  int64_t count = 0;
  std::shared_ptr<Pending> pending;
};

class Group {
 public:
  static Group& get() {
    static Group* g = new Group();  // never destroyed: finalize() runs at exit
    return *g;
  }

  void init();
  void finalize();
#ifdef KILN_HAVE_MPI
  MPI_Comm world() const { return world_; }
#endif
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string library() const { return library_; }

  // Queues a collective and returns it; `start` runs on the communication
  // thread. In a group of one nothing is exchanged: it is done at once.
#ifdef KILN_HAVE_MPI
  std::shared_ptr<Pending> submit(std::string what, std::function<void()> exchange,
                                  bool gradients = false);
#endif
  std::shared_ptr<Pending> done_at_once(std::string what);
  // Blocks until `p` is done; the time spent waiting counts as exposed.
  void wait(Pending& p);

  std::mutex buckets_mu;
  std::map<int, Bucket> buckets;
  std::mutex stats_mu;
  Stats stats;
  double timeout = 300;

 private:
  Group() = default;
#ifdef KILN_HAVE_MPI
  void loop(std::promise<void>* ready);
  void run(Pending& p);
  void tell_others(uint64_t serial);
  void hear_others();
  [[noreturn]] void timed_out(const Pending& p);
  MPI_Comm world_ = MPI_COMM_NULL, news_ = MPI_COMM_NULL;  // collectives; who reached what
  std::vector<uint64_t> reached_;                          // per rank: the last serial it started
  std::deque<std::pair<MPI_Request, std::unique_ptr<uint64_t>>> sends_;
  std::thread thread_;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Pending>> queue_;
  bool stopping_ = false, finalized_ = false;
#endif
  bool initialized_ = false;
  uint64_t serial_ = 0;
  int rank_ = 0, size_ = 1;
  std::string library_ = "none (kiln was built without MPI)";
};

const char* const kLaunchVariables[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};

std::shared_ptr<Pending> Group::done_at_once(std::string what) {
  auto p = std::make_shared<Pending>();
  p->what = std::move(what);
  p->serial = ++serial_;
  p->started = p->finished = Clock::now();
  p->done = true;
  return p;
}

void Group::wait(Pending& p) {
  std::unique_lock lock(p.mu);
  if (p.done) return;
  auto t0 = Clock::now();
  p.cv.wait(lock, [&] { return p.done; });
  if (!p.gradients) return;
  std::lock_guard s(stats_mu);
  stats.exposed_seconds += seconds_since(t0);
}

#ifdef KILN_HAVE_MPI

void Group::init() {
  if (initialized_) return;
  initialized_ = true;
  if (!launched_by_mpirun()) return;  // a group of one: no MPI at all
  std::promise<void> ready;
  auto started = ready.get_future();
  thread_ = std::thread([this, &ready] { loop(&ready); });
  started.get();  // rethrows the thread's error
  std::atexit([] { Group::get().finalize(); });
}

void Group::loop(std::promise<void>* ready) {
  try {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      fail("dist", "MPI_Init_thread failed");
    if (provided < MPI_THREAD_FUNNELED)
      fail("dist", "this MPI cannot be called from a thread of kiln's (MPI_THREAD_FUNNELED)");
    MPI_Comm_dup(MPI_COMM_WORLD, &world_);
    MPI_Comm_dup(MPI_COMM_WORLD, &news_);
    MPI_Comm_rank(world_, &rank_);
    MPI_Comm_size(world_, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    library_ = std::string(version, len);
    if (size_t nl = library_.find_first_of("\r\n"); nl != std::string::npos) library_.resize(nl);
    reached_.assign(size_, 0);
    ready->set_value();
  } catch (...) {
    ready->set_exception(std::current_exception());
    return;
  }
  for (;;) {
    std::shared_ptr<Pending> p;
    {
      std::unique_lock lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stopping, and everything queued has run
      p = queue_.front();
      queue_.pop_front();
    }
    run(*p);
  }
  for (auto& [req, buf] : sends_) MPI_Wait(&req, MPI_STATUS_IGNORE);
  sends_.clear();
  MPI_Comm_free(&news_);
  MPI_Comm_free(&world_);
  MPI_Finalize();
}

constexpr int kNewsTag = 77;

void Group::tell_others(uint64_t serial) {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto value = std::make_unique<uint64_t>(serial);
    MPI_Request req;
    MPI_Isend(value.get(), 1, MPI_UINT64_T, r, kNewsTag, news_, &req);
    sends_.emplace_back(req, std::move(value));
  }
  while (!sends_.empty()) {  // free the buffers of sends that completed
    int flag = 0;
    MPI_Test(&sends_.front().first, &flag, MPI_STATUS_IGNORE);
    if (!flag) break;
    sends_.pop_front();
  }
}

void Group::hear_others() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kNewsTag, news_, &flag, &st);
    if (!flag) return;
    uint64_t serial = 0;
    MPI_Recv(&serial, 1, MPI_UINT64_T, st.MPI_SOURCE, kNewsTag, news_, MPI_STATUS_IGNORE);
    reached_[st.MPI_SOURCE] = std::max(reached_[st.MPI_SOURCE], serial);
  }
}

void Group::timed_out(const Pending& p) {
  hear_others();
  std::string laggards;
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && reached_[r] < p.serial)
      laggards += (laggards.empty() ? "" : "; ") + ("rank " + std::to_string(r)) +
                  " never reached it (the last collective it started was #" +
                  std::to_string(reached_[r]) + ")";
  if (laggards.empty()) laggards = "every rank started it, but not every rank arrived";
  std::cerr << "kiln: error: [dist] rank " << rank_ << ": collective #" << p.serial << ", "
            << p.what << ", was not reached by every rank within " << timeout << " s: " << laggards
            << "; stopping every rank (--dist-timeout sets the limit)" << std::endl;
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();  // MPI_Abort does not return
}

void Group::run(Pending& p) {
  tell_others(p.serial);
  p.started = Clock::now();
  // First every rank arrives (a non-blocking barrier, polled: the timeout
  // can name a rank that never comes), then the exchange itself runs as a
  // blocking collective: Open MPI's blocking all-reduce (its tuned
  // algorithms) moves twice the bytes per second of its non-blocking one
  // (libnbc) here, between two processes on one host and over TCP alike.
  MPI_Request arrived;
  MPI_Ibarrier(world_, &arrived);
  // Each poll moves the barrier on, but a spinning thread takes a core from
  // the ranks' compute threads: after a few polls in a row, sleep between
  // them (KILN_DIST_POLL_US, default 50 µs).
  static const int sleep_us = [] {
    const char* v = std::getenv("KILN_DIST_POLL_US");
    return v ? std::max(0, std::atoi(v)) : 50;
  }();
  for (int polls = 1;; ++polls) {
    int flag = 0;
    MPI_Test(&arrived, &flag, MPI_STATUS_IGNORE);
    if (flag) break;
    if (polls % 16 == 0) {
      hear_others();
      if (timeout > 0 && seconds_since(p.started) > timeout) timed_out(p);
    }
    if (polls > 8) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
  }
  hear_others();  // receive the others' news, so that it never piles up
  if (p.exchange) p.exchange();
  std::lock_guard lock(p.mu);
  p.finished = Clock::now();
  p.done = true;
  p.cv.notify_all();
  if (p.gradients) {
    std::lock_guard s(stats_mu);
    stats.busy_seconds += std::chrono::duration<double>(p.finished - p.started).count();
  }
}

std::shared_ptr<Pending> Group::submit(std::string what, std::function<void()> exchange,
                                       bool gradients) {
  if (size_ == 1) return done_at_once(std::move(what));
  auto p = std::make_shared<Pending>();
  p->what = std::move(what);
  p->gradients = gradients;
  p->exchange = std::move(exchange);
  std::lock_guard lock(queue_mu_);
  if (stopping_) fail("dist", "a collective was queued after the process group was finalized");
  p->serial = ++serial_;
  queue_.push_back(p);
  queue_cv_.notify_one();
  return p;
}

void Group::finalize() {
  if (!thread_.joinable() || finalized_) return;
  finalized_ = true;
  {
    std::lock_guard lock(queue_mu_);
    stopping_ = true;
    queue_cv_.notify_one();
  }
  thread_.join();
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    default: fail("all_reduce", std::string("no MPI type for ") + name_of(t));
  }
}

#else  // no MPI: a group of one

void Group::init() {
  if (initialized_) return;
  initialized_ = true;
  if (launched_by_mpirun()) {
    const char* n = nullptr;
    for (const char* v : kLaunchVariables)
      if ((n = std::getenv(v))) break;
    if (std::atoi(n ? n : "1") > 1 || !std::getenv("OMPI_COMM_WORLD_SIZE"))
      fail("dist",
           "this process was started by mpirun (or another MPI launcher), but this kiln was "
           "built without MPI: install Open MPI (Debian: libopenmpi-dev) and rebuild "
           "(scripts/build.sh), or run kiln without mpirun");
  }
}

void Group::finalize() {}

#endif

}  // namespace

int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"})
    if (const char* r = std::getenv(v)) return std::atoi(r);
  return 0;
}

bool launched_by_mpirun() {
  for (const char* v : kLaunchVariables)
    if (std::getenv(v)) return true;
  return false;
}

void init() { Group::get().init(); }
int rank() { return Group::get().rank(); }
int size() { return Group::get().size(); }
std::string library() { return Group::get().library(); }
void finalize() { Group::get().finalize(); }

void abort(int code) {
  // Only the communication thread may call MPI (MPI_THREAD_FUNNELED), and it
  // may be inside a collective: exit without finalizing instead, which makes
  // mpirun stop every other rank.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

void set_timeout(double seconds) {
  if (!(seconds >= 0)) fail("dist", "the timeout must be 0 or more seconds");
  Group::get().timeout = seconds;
}
double timeout() { return Group::get().timeout; }

void all_reduce_sum(std::vector<double>& values) {
  Group& g = Group::get();
#ifdef KILN_HAVE_MPI
  auto p = g.submit("an all-reduce of " + std::to_string(values.size()) + " host values",
                    [&] {
                      MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()),
                                    MPI_DOUBLE, MPI_SUM, g.world());
                    });
  g.wait(*p);
#else
  (void)g;
  (void)values;
#endif
}

std::vector<uint64_t> all_gather(uint64_t value) {
  Group& g = Group::get();
  std::vector<uint64_t> out(g.size(), value);
#ifdef KILN_HAVE_MPI
  auto p = g.submit("an all-gather", [&] {
    MPI_Allgather(&value, 1, MPI_UINT64_T, out.data(), 1, MPI_UINT64_T, g.world());
  });
  g.wait(*p);
#endif
  return out;
}

void barrier() {
#ifdef KILN_HAVE_MPI
  Group& g = Group::get();
  auto p = g.submit("a barrier", nullptr);  // the arrival is the barrier
  g.wait(*p);
#endif
}

void broadcast(void* data, size_t bytes, int root) {
  Group& g = Group::get();
  if (root < 0 || root >= g.size())
    fail("dist", "broadcast from rank " + std::to_string(root) + " in a group of " +
                     std::to_string(g.size()));
#ifdef KILN_HAVE_MPI
  if (bytes > INT32_MAX) fail("dist", "a broadcast takes at most 2^31 - 1 bytes");
  auto p = g.submit("a broadcast of " + std::to_string(bytes) + " bytes",
                    [&] {
                      MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, g.world());
                    });
  g.wait(*p);
#else
  (void)data;
  (void)bytes;
#endif
}

Stats stats() {
  Group& g = Group::get();
  std::lock_guard lock(g.stats_mu);
  return g.stats;
}

void reset_stats() {
  Group& g = Group::get();
  std::lock_guard lock(g.stats_mu);
  g.stats = {};
}

// ---- the host kernels ----
namespace {

void start_kernel(const KernelContext&, const Primitive& prim, const std::vector<Array>& in,
                  ArrayNode& out) {
  Group& g = Group::get();
  const int id = prim.attrs<CollectiveAttrs>().bucket;
  std::unique_lock lock(g.buckets_mu);
  Bucket& b = g.buckets[id];
  std::shared_ptr<Pending> previous = std::move(b.pending);
  lock.unlock();
  if (previous) g.wait(*previous);  // the bucket's last exchange must be over
  int64_t count = 0;
  for (const Array& x : in) count += x.size();
  if (count > INT32_MAX)
    fail("all_reduce_start", "bucket " + std::to_string(id) + " holds " + std::to_string(count) +
                                 " values; an exchange takes at most 2^31 - 1");
  b.dtype = in[0].dtype();
  b.count = count;
  b.data.resize(count * size_of(b.dtype));
  char* dst = b.data.data();
  for (const Array& x : in) {
    std::memcpy(dst, x.raw(), x.nbytes());
    dst += x.nbytes();
  }
  const double bytes = static_cast<double>(b.data.size());
  char mb[32];
  std::snprintf(mb, sizeof mb, "%.1f MB", bytes / 1e6);
  std::string what = "the all-reduce of gradient bucket " + std::to_string(id) + " (" + mb + ")";
#ifdef KILN_HAVE_MPI
  void* data = b.data.data();
  const MPI_Datatype type = g.size() > 1 ? mpi_type(b.dtype) : MPI_DATATYPE_NULL;
  b.pending = g.submit(
      std::move(what),
      [&g, data, count, type] {
        MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), type, MPI_SUM, g.world());
      },
      /*gradients=*/true);
#else
  b.pending = g.done_at_once(std::move(what));
#endif
  {
    std::lock_guard s(g.stats_mu);
    g.stats.all_reduces += 1;
    g.stats.bytes += bytes;
  }
  *static_cast<int64_t*>(alloc_output(out)) = static_cast<int64_t>(b.pending->serial);
}

void wait_kernel(const KernelContext&, const Primitive& prim, const std::vector<Array>& in,
                 ArrayNode& out) {
  Group& g = Group::get();
  const auto& a = prim.attrs<CollectiveAttrs>();
  std::unique_lock lock(g.buckets_mu);
  auto it = g.buckets.find(a.bucket);
  if (it == g.buckets.end() || !it->second.pending)
    fail("all_reduce_wait", "bucket " + std::to_string(a.bucket) + " was never started");
  Bucket& b = it->second;
  std::shared_ptr<Pending> p = b.pending;
  lock.unlock();
  // The token names the exchange its start queued: the bucket's latest.
  if (*in[0].data<int64_t>() != static_cast<int64_t>(p->serial))
    fail("all_reduce_wait", "bucket " + std::to_string(a.bucket) + " was started again (exchange #" +
                                std::to_string(p->serial) + ") before this wait for exchange #" +
                                std::to_string(*in[0].data<int64_t>()) + " read it");
  g.wait(*p);
  const int64_t n = numel(out.shape);
  if (out.dtype != b.dtype || a.offset < 0 || a.offset + n > b.count)
    fail("all_reduce_wait", "bucket " + std::to_string(a.bucket) + " holds " +
                                std::to_string(b.count) + " " + name_of(b.dtype) +
                                " values, the wait asks for " + std::to_string(n) + " " +
                                name_of(out.dtype) + " at " + std::to_string(a.offset));
  const double scale = a.mean ? 1.0 / g.size() : 1.0;
  void* y = alloc_output(out);
  if (b.dtype == DType::f32) {
    const float* s = reinterpret_cast<const float*>(b.data.data()) + a.offset;
    float* d = static_cast<float*>(y);
    const float f = static_cast<float>(scale);
    for (int64_t i = 0; i < n; ++i) d[i] = s[i] * f;
  } else {
    const double* s = reinterpret_cast<const double*>(b.data.data()) + a.offset;
    double* d = static_cast<double*>(y);
    for (int64_t i = 0; i < n; ++i) d[i] = s[i] * scale;
  }
}

}  // namespace

void register_host_collectives(KernelTable& table) {
  table.kernels[static_cast<int>(Op::AllReduceStart)] = start_kernel;
  table.kernels[static_cast<int>(Op::AllReduceWait)] = wait_kernel;
}

}  // namespace kiln::dist
