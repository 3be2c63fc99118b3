// Counter-based random numbers: pure functions of (key, index).
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/kiln.h"

namespace kiln {
namespace {

struct Moments {
  double mean = 0, var = 0, min = INFINITY, max = -INFINITY;
};
Moments moments(const Array& a) {
  auto v = a.to_vector<double>();
  Moments m;
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= v.size();
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= v.size();
  return m;
}

TEST(Random, ValuesDoNotDependOnThreadCount) {
  random::Key key(42);
  int saved = num_threads();
  set_num_threads(1);
  auto one = random::normal(key, {300001}).to_vector<float>();
  auto tn1 = random::truncated_normal(key, {70001}).to_vector<float>();
  set_num_threads(2);
  auto two = random::normal(key, {300001}).to_vector<float>();
  auto tn2 = random::truncated_normal(key, {70001}).to_vector<float>();
  set_num_threads(saved);
  EXPECT_EQ(one, two);
  EXPECT_EQ(tn1, tn2);
}

TEST(Random, PrefixOfALargerDrawIsTheSmallerDraw) {
  random::Key key(3);
  auto small = random::uniform(key, {10}).to_vector<float>();
  auto big = random::uniform(key, {1000}).to_vector<float>();
  EXPECT_EQ(small, std::vector<float>(big.begin(), big.begin() + 10));
}

TEST(Random, SplitAndFoldInGiveDistinctStreams) {
  random::Key key(0);
  auto keys = random::split(key, 3);
  EXPECT_NE(keys[0], keys[1]);
  EXPECT_NE(keys[1], keys[2]);
  EXPECT_NE(random::fold_in(key, 1), random::fold_in(key, 2));
  EXPECT_NE(random::fold_in(key, 0), keys[0]);
  EXPECT_EQ(random::split(key, 3)[2], keys[2]);  // deterministic
  auto a = random::normal(keys[0], {8}).to_vector<float>();
  auto b = random::normal(keys[1], {8}).to_vector<float>();
  EXPECT_NE(a, b);
}

TEST(Random, NormalHasUnitMoments) {
  auto m = moments(random::normal(random::Key(1), {200000}, DType::f64));
  EXPECT_NEAR(m.mean, 0.0, 0.01);
  EXPECT_NEAR(m.var, 1.0, 0.01);
}

TEST(Random, UniformRespectsBounds) {
  auto m = moments(random::uniform(random::Key(2), {100000}, -3, 5));
  EXPECT_GE(m.min, -3.0);
  EXPECT_LT(m.max, 5.0);
  EXPECT_NEAR(m.mean, 1.0, 0.05);
  EXPECT_NEAR(m.var, 64.0 / 12.0, 0.1);
}

TEST(Random, TruncatedNormalStaysInBoundsWithTheRightVariance) {
  auto m = moments(random::truncated_normal(random::Key(5), {200000}, -2, 2, DType::f64));
  EXPECT_GE(m.min, -2.0);
  EXPECT_LE(m.max, 2.0);
  EXPECT_NEAR(m.mean, 0.0, 0.01);
  EXPECT_NEAR(m.var, 0.7737413, 0.01);  // variance of N(0,1) truncated to [-2, 2]
  auto one_sided = moments(random::truncated_normal(random::Key(6), {100000}, 0, 1));
  EXPECT_GE(one_sided.min, 0.0);
  EXPECT_LE(one_sided.max, 1.0);
  EXPECT_NEAR(one_sided.mean, 0.4598, 0.01);
}

TEST(Random, BernoulliRate) {
  Array b = random::bernoulli(random::Key(9), {100000}, 0.3);
  EXPECT_EQ(b.dtype(), DType::bool_);
  EXPECT_NEAR(sum(b).item<double>() / 100000.0, 0.3, 0.01);
}

TEST(Random, BadArgumentsAreNamed) {
  EXPECT_THROW(random::bernoulli(random::Key(0), {3}, 1.5), Error);
  EXPECT_THROW(random::uniform(random::Key(0), {3}, 2, 1), Error);
  EXPECT_THROW(random::normal(random::Key(0), {3}, DType::i32), Error);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(Random, KeyArraysDrawAsTheirKeysAndStayArgumentsUnderJit) {
  random::Key key(11);
  auto host = random::bernoulli(random::fold_in(key, 3), {1000}, 0.4).to_vector<bool>();
  auto from_array = random::bernoulli(random::key_array(key), 3, {1000}, 0.4).to_vector<bool>();
  EXPECT_EQ(host, from_array);
  Jitted draw = jit([](const std::vector<Array>& k) {
    return std::vector<Array>{random::bernoulli(k[0], 3, {1000}, 0.4)};
  });
  EXPECT_EQ(draw({random::key_array(key)})[0].to_vector<bool>(), host);
  EXPECT_NE(draw({random::key_array(random::Key(12))})[0].to_vector<bool>(), host);
  EXPECT_EQ(draw.cache_stats().compiles, 1u);
  EXPECT_THROW(random::bernoulli(zeros({2}), 0, {3}), Error);
}

}  // namespace
}  // namespace kiln
