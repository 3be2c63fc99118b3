// kiln — the process group of a data-parallel run: the ranks that
// `mpirun -np N kiln train ...` starts (Open MPI), each training the same
// model on its shard of every batch and averaging gradients with the others.
//
// Collectives run on a thread of their own (the only thread that calls
// MPI), so that an exchange progresses while the caller computes; the
// AllReduceStart / AllReduceWait primitives (kiln/ops.h: all_reduce_start)
// queue gradient buckets on it. A collective that does not finish within the
// timeout stops every rank with a message naming the ranks that never
// reached it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::dist {

// Joins the group that launched this process: the ranks of mpirun (Open
// MPI's OMPI_COMM_WORLD_SIZE, or the PMI/PMIx variables of another
// launcher), or a group of one when no launcher started it. Safe to call
// more than once. A process started by mpirun in a kiln built without MPI
// gets an error saying so.
void init();
// Whether the environment says a launcher (mpirun) started this process.
bool launched_by_mpirun();
int rank();  // 0 before init()
int size();  // 1 before init()
// This rank's number among the ranks on its host (the launcher's
// OMPI_COMM_WORLD_LOCAL_RANK; 0 without one): which GPU it takes.
int local_rank();
// "Open MPI v4.1.4, ...", or "none (built without MPI)".
std::string library();

// Ends the group once the collectives queued so far have finished
// (MPI_Finalize). Also run at exit.
void finalize();
// Exits now with `code` (stdout and stderr flushed, MPI not finalized), so
// that mpirun stops every other rank.
[[noreturn]] void abort(int code);

// A collective that has not finished `seconds` after it started stops every
// rank (default 300; 0 waits forever).
void set_timeout(double seconds);
double timeout();

// Host collectives, blocking (within the timeout): the sums of `values`
// over the ranks, in place; every rank's `value` in rank order; a barrier.
void all_reduce_sum(std::vector<double>& values);
std::vector<uint64_t> all_gather(uint64_t value);
void barrier();
// Rank `root`'s `bytes` bytes at `data` on every rank.
void broadcast(void* data, size_t bytes, int root = 0);

// What the gradient all-reduces cost so far (since reset_stats).
struct Stats {
  uint64_t all_reduces = 0;    // buckets exchanged
  double bytes = 0;            // their payload
  double busy_seconds = 0;     // from each exchange's start to its end, summed
  double exposed_seconds = 0;  // of which callers waited for (not hidden by compute)
};
Stats stats();
void reset_stats();

}  // namespace kiln::dist
