// dynamic_slice and dynamic_update_slice beyond the op table's cases (which
// check them against host loops, on every backend, with their VJPs): a KV
// cache's decode step under jit, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../gpu_device.h"
#include "../test_util.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

using test_util::error_of;

void expect_near_all(const Array& got, const Array& want, double tol, const std::string& what) {
  ASSERT_EQ(str(got.shape()), str(want.shape())) << what;
  const auto g = got.to(Device::cpu()).to_vector<float>();
  const auto w = want.to(Device::cpu()).to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], w[i], tol) << what << " at " << i;
}

// One decode step: the token's keys written into the cache at `starts` =
// {0, t, 0, 0} (an argument, so one compile serves every position), then the
// token's query attends to the cache's first t + 1 keys (a key-padding mask
// from the position; the keys double as values here).
std::vector<Array> decode_step(const std::vector<Array>& x) {
  const Array &cache = x[0], &k = x[1], &q = x[2], &starts = x[3];
  const int64_t B = cache.shape()[0], S = cache.shape()[1];
  const Array next = dynamic_update_slice(cache, k, starts);
  const Array t = slice(starts, {1}, {2});
  const Array keep =
      broadcast_to(reshape(less_equal(arange(S, DType::i32, starts.device()), t), {1, S}), {B, S});
  return {next, attention(q, next, next, {.key_padding_mask = keep})};
}

void expect_decode_compiles_once_in_place(Device d) {
  const int64_t B = 2, S = 6, H = 2, D = 4;
  int traces = 0;
  Jitted step = jit(
      [&traces](const std::vector<Array>& x) {
        ++traces;
        return decode_step(x);
      },
      {.donate = {0}});
  Array cache = zeros({B, S, H, D}, DType::f32, d);
  const void* address = cache.raw();
  std::vector<Array> keys;
  for (int t = 0; t < S; ++t) {
    SCOPED_TRACE("token " + std::to_string(t) + " on " + d.str());
    const Array k = random::normal(random::Key(t), {B, 1, H, D}).to(d);
    const Array q = random::normal(random::Key(100 + t), {B, 1, H, D}).to(d);
    const Array starts = Array::from_vector(std::vector<int32_t>{0, t, 0, 0}, {4}).to(d);
    std::vector<Array> out = step({cache, k, q, starts});
    cache = out[0];
    EXPECT_EQ(cache.raw(), address) << "the cache moved: not updated in place";
    keys.push_back(k);
    const Array seen = concatenate(keys, 1);
    expect_near_all(out[1], attention(q, seen, seen), 1e-6, "attention over the cache");
    expect_near_all(slice(cache, {0, 0, 0, 0}, {B, t + 1, H, D}), seen, 0, "the cache");
  }
  EXPECT_EQ(traces, 1);
  EXPECT_EQ(step.cache_stats().compiles, 1u);
}

TEST(DynamicSlices, AKvCacheDecodeStepCompilesOnceAndUpdatesInPlace) {
  expect_decode_compiles_once_in_place(Device::cpu());
  expect_decode_compiles_once_in_place(Device::ref());
}

TEST(DynamicSlices, GpuAKvCacheDecodeStepCompilesOnceAndUpdatesInPlace) {
  KILN_REQUIRE_GPU();
  expect_decode_compiles_once_in_place(test_gpu());
}

// Eagerly too: the window's start is clamped so that it fits (JAX's rule),
// with i64 starts as well as i32.
TEST(DynamicSlices, StartsAreClampedSoThatTheWindowFits) {
  const Array x = reshape(arange(20, DType::f32), {4, 5});
  const Array starts = Array::from_vector(std::vector<int64_t>{3, -2}, {2});
  EXPECT_EQ(dynamic_slice(x, starts, {2, 2}).to_vector<float>(),
            (std::vector<float>{10, 11, 15, 16}));
  const Array y = dynamic_update_slice(x, full({2, 2}, -1.0), starts);
  EXPECT_EQ(dynamic_slice(y, starts, {3, 3}).to_vector<float>(),
            (std::vector<float>{5, 6, 7, -1, -1, 12, -1, -1, 17}));
  EXPECT_EQ(x.to_vector<float>()[10], 10.0f) << "x itself is unchanged";
}

TEST(DynamicSlices, BadOperandsNameWhatWasExpected) {
  const Array x = zeros({4, 5});
  const Array starts = Array::from_vector(std::vector<int32_t>{0, 1}, {2});
  EXPECT_NE(error_of([&] {
              dynamic_slice(x, zeros({2}), {2, 2});
            }).find("starts are f32 (2), expected i32 or i64"),
            std::string::npos)
      << error_of([&] {
           dynamic_slice(x, zeros({2}), {2, 2});
         });
  EXPECT_NE(error_of([&] {
              dynamic_slice(x, Array::from_vector(std::vector<int32_t>{0, 1, 2}, {3}), {2, 2});
            }).find("expected one per axis of x"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              dynamic_slice(x, starts, {5, 2});
            }).find("sizes (5,2) does not fit in x"),
            std::string::npos)
      << error_of([&] {
           dynamic_slice(x, starts, {5, 2});
         });
  EXPECT_NE(error_of([&] {
              dynamic_update_slice(x, zeros({2, 6}), starts);
            }).find("update (2,6) does not fit in x"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              dynamic_update_slice(x, zeros({2, 2}, DType::f64), starts);
            }).find("must have x's dtype"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
