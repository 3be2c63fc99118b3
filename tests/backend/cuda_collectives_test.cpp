// The CUDA kernels of AllReduceStart / AllReduceWait (src/backend/cuda/
// collectives.cu) in a group of one, where nothing is exchanged: the mean
// and the sum over the ranks are the arrays themselves, eagerly, lazily and
// compiled (the compiled call recorded and replayed as a CUDA Graph). GPU
// tests: their names contain "Gpu" and they skip without a GPU
// (KILN_GPU_TESTS_ON=ref runs them on the ref backend). The exchange itself
// needs several ranks: tests/dist/.
#include <gtest/gtest.h>

#include "../gpu_device.h"
#include "kiln/distributed.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

// Arrays of several shapes, a scalar among them, on the GPU; their values
// are multiples of `k`.
std::vector<Array> some_arrays(DType dt, double k, int64_t large = 12) {
  auto values = [&](Shape shape, int64_t first) {
    Array v = multiply(arange(first, first + numel(shape)), full({}, k));
    return astype(reshape(v, shape), dt).to(test_gpu());
  };
  return {values({large}, 0), values({2, 3}, -3), values({}, 7), values({3, 1, 4}, 100)};
}

void expect_same_values(const std::vector<Array>& got, const std::vector<Array>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].device(), want[i].device()) << "array " << i;
    EXPECT_EQ(got[i].shape(), want[i].shape()) << "array " << i;
    EXPECT_EQ(got[i].dtype(), want[i].dtype()) << "array " << i;
    EXPECT_EQ(got[i].to_vector<double>(), want[i].to_vector<double>()) << "array " << i;
  }
}

std::vector<Array> round_trip(const std::vector<Array>& xs, int bucket, bool mean = true) {
  return all_reduce_wait(all_reduce_start(xs, bucket), xs, bucket, mean);
}

TEST(CudaCollectives, GpuAGroupOfOneGetsItsOwnValuesInEveryMode) {
  KILN_REQUIRE_GPU();
  ASSERT_EQ(dist::size(), 1);
  for (DType dt : {DType::f32, DType::f64}) {
    SCOPED_TRACE(name_of(dt));
    for (bool mean : {true, false}) {
      const std::vector<Array> xs = some_arrays(dt, 0.5);
      expect_same_values(round_trip(xs, 0, mean), xs);
      std::vector<Array> lazy;
      {
        LazyScope scope;
        lazy = round_trip(xs, 0, mean);
      }
      eval(lazy);
      expect_same_values(lazy, xs);
    }
    // The first call runs op by op, the second records a CUDA Graph and
    // launches it, the third replays it; each call on other values.
    Jitted f = jit([](const std::vector<Array>& args) { return round_trip(args, 0); });
    for (int call = 0; call < 3; ++call) {
      SCOPED_TRACE("call " + std::to_string(call));
      const std::vector<Array> xs = some_arrays(dt, call + 1);
      expect_same_values(f(xs), xs);
    }
    EXPECT_EQ(f.cache_stats().replays, 1u) << "the compiled call was not recorded";
  }
}

// Two buckets in flight at once, waited for in the other order. A bucket
// that grows (a larger exchange after a recorded one) leaves the recorded
// graph the buffer it packs into.
TEST(CudaCollectives, GpuBucketsAreIndependentAndMayGrow) {
  KILN_REQUIRE_GPU();
  const std::vector<Array> a = some_arrays(DType::f32, 1);
  const std::vector<Array> b{full({5}, -2.0, DType::f32, test_gpu())};
  Array ta = all_reduce_start(a, 1), tb = all_reduce_start(b, 2);
  expect_same_values(all_reduce_wait(tb, b, 2, /*mean=*/false), b);
  expect_same_values(all_reduce_wait(ta, a, 1), a);

  Jitted small = jit([](const std::vector<Array>& args) { return round_trip(args, 3); });
  Jitted large = jit([](const std::vector<Array>& args) { return round_trip(args, 3); });
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    const std::vector<Array> xs = some_arrays(DType::f32, call + 1);
    expect_same_values(small(xs), xs);
  }
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("large, call " + std::to_string(call));
    const std::vector<Array> xs = some_arrays(DType::f32, call - 1, 1 << 16);
    expect_same_values(large(xs), xs);
  }
  const std::vector<Array> xs = some_arrays(DType::f32, -3);
  expect_same_values(small(xs), xs);
  EXPECT_EQ(small.cache_stats().replays, 2u);
  EXPECT_EQ(large.cache_stats().replays, 1u);
}

}  // namespace
}  // namespace kiln
