// The all-reduce of kiln's data-parallel training on its own: the gradient
// bucket primitives (all_reduce_start / all_reduce_wait on host arrays, the
// path a training step takes) timed for sizes from 4 KB to 64 MB between the
// ranks mpirun starts. Rank 0 prints one JSON line per size: the median time
// of `reps` exchanges after a warm-up, its spread, and the bandwidths (the
// algorithm's, bytes / time, and the bus's, 2 (n-1)/n bytes / time, which
// the link carries in a ring).
//
//   mpirun -np 2 build/kiln-bench-allreduce [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kiln/distributed.h"
#include "kiln/kiln.h"

int main(int argc, char** argv) {
  using namespace kiln;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  try {
    dist::init();
    const int n = dist::size();
    for (double mb : {0.004, 0.064, 1.0, 4.0, 16.0, 25.0, 64.0}) {
      const int64_t count = static_cast<int64_t>(mb * 1e6 / 4);
      Array x = full({count}, 1.0 + dist::rank());
      std::vector<double> times;
      for (int r = 0; r < reps + 3; ++r) {
        dist::barrier();
        auto t0 = std::chrono::steady_clock::now();
        Array y = all_reduce_wait(all_reduce_start({x}, 0), {x}, 0, /*mean=*/false)[0];
        y.eval();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r >= 3) times.push_back(s);
        // Every element is the sum of 1 + rank over the ranks.
        const float want = n * (n + 1) / 2.0f;
        if (y.data<float>()[count - 1] != want) {
          std::fprintf(stderr, "wrong sum: %g, expected %g\n", y.data<float>()[count - 1], want);
          return 1;
        }
      }
      std::sort(times.begin(), times.end());
      const double med = times[times.size() / 2], bytes = count * 4.0;
      if (dist::rank() == 0)
        std::printf(
            "{\"ranks\": %d, \"bytes\": %.0f, \"median_s\": %.6g, \"min_s\": %.6g, \"max_s\": "
            "%.6g, \"algbw_GBps\": %.4g, \"busbw_GBps\": %.4g}\n",
            n, bytes, med, times.front(), times.back(), bytes / med / 1e9,
            2.0 * (n - 1) / n * bytes / med / 1e9);
      std::fflush(stdout);
    }
    dist::finalize();
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln-bench-allreduce: %s\n", e.what());
    dist::abort(1);
  }
  return 0;
}
