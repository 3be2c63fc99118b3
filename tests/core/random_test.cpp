// Counter-based random numbers: pure functions of (key, index).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <functional>

#include "../test_util.h"
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

// The host's per-sample draws (data sets) are the device's draw of the key.
TEST(Random, UniformBlockIsTheDrawOfTheSameKey) {
  const random::Key key = random::fold_in(random::Key(7), 3);
  const std::vector<double> device =
      random::uniform(key, {10}, 0.0, 1.0, DType::f64).to_vector<double>();
  for (uint64_t j = 0; j < 5; ++j) {
    double v[2];
    random::uniform_block(key, j, v);
    EXPECT_EQ(v[0], device[2 * j]) << j;
    EXPECT_EQ(v[1], device[2 * j + 1]) << j;
    EXPECT_GE(v[0], 0.0);
    EXPECT_LT(v[0], 1.0);
  }
}

// drop_graph: a computed array keeps its value and lets its inputs go; a
// pending one is left as it is.
TEST(Random, DropGraphKeepsTheValueAndLetsTheInputsGo) {
  // A value computed inside an eager differentiation keeps the traced
  // graph (as a training step's new BatchNorm statistics do).
  Array x = random::normal(random::Key(1), {4});
  Array y;
  grad([&](const Array& a) {
    y = a * 2.0;
    return sum(y);
  })(x);
  ASSERT_TRUE(y.is_materialized());
  ASSERT_FALSE(y.inputs().empty());
  const std::vector<float> before = y.to_vector<float>();
  EXPECT_TRUE(drop_graph(y));
  EXPECT_TRUE(y.inputs().empty());
  EXPECT_EQ(y.to_vector<float>(), before);
  LazyScope lazy;
  Array z = x + 1.0;
  EXPECT_FALSE(drop_graph(z));
  EXPECT_FALSE(z.inputs().empty());
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

// Gamma(a) has mean and variance a (shapes below 1 through the boost);
// element i depends on (key, i) alone, however many tries each took.
TEST(Random, GammaHasItsMomentsAndIsAPureFunctionOfTheIndex) {
  for (double a : {0.3, 1.0, 2.5, 9.0}) {
    SCOPED_TRACE(a);
    const Array g = random::gamma(random::Key(21), {200000}, a, DType::f64);
    auto m = moments(g);
    EXPECT_GT(m.min, 0.0);
    EXPECT_NEAR(m.mean, a, 4 * std::sqrt(a / 200000));
    EXPECT_NEAR(m.var, a, 0.03 * a);
  }
  random::Key key(22);
  int saved = num_threads();
  set_num_threads(1);
  auto one = random::gamma(key, {100001}, 0.7).to_vector<float>();
  set_num_threads(2);
  auto two = random::gamma(key, {100001}, 0.7).to_vector<float>();
  set_num_threads(saved);
  EXPECT_EQ(one, two);
  auto prefix = random::gamma(key, {9}, 0.7).to_vector<float>();
  EXPECT_EQ(prefix, std::vector<float>(one.begin(), one.begin() + 9));
  EXPECT_NE(random::gamma(random::Key(23), {9}, 0.7).to_vector<float>(), prefix);
}

TEST(Random, BetaHasItsMoments) {
  for (auto [a, b] : {std::pair{0.8, 0.8}, std::pair{2.0, 5.0}, std::pair{0.2, 1.0}}) {
    SCOPED_TRACE(std::to_string(a) + ", " + std::to_string(b));
    auto m = moments(random::beta(random::Key(31), {200000}, a, b, DType::f64));
    EXPECT_GE(m.min, 0.0);
    EXPECT_LE(m.max, 1.0);
    const double mean = a / (a + b), var = a * b / ((a + b) * (a + b) * (a + b + 1));
    EXPECT_NEAR(m.mean, mean, 4 * std::sqrt(var / 200000));
    EXPECT_NEAR(m.var, var, 0.03 * var);
  }
}

// Every integer of [low, high) about equally often, none outside.
TEST(Random, RandintIsUniformOverItsRange) {
  const Array r = random::randint(random::Key(41), {160000}, -3, 5);
  EXPECT_EQ(r.dtype(), DType::i32);
  std::vector<int> counts(8);
  for (int32_t v : r.to_vector<int32_t>()) {
    ASSERT_GE(v, -3);
    ASSERT_LT(v, 5);
    ++counts[v + 3];
  }
  for (int c : counts) EXPECT_NEAR(c, 20000, 600);  // 4.5 standard deviations
  const auto wide = random::randint(random::Key(42), {1000}, INT32_MIN, int64_t{INT32_MAX} + 1);
  int negative = 0;
  for (int32_t v : wide.to_vector<int32_t>()) negative += v < 0;
  EXPECT_NEAR(negative, 500, 80);
}

// Indices drawn with probabilities softmax(logits) along the axis.
TEST(Random, CategoricalDrawsBySoftmax) {
  const std::vector<double> row{0.0, 1.0, 2.0, -1.0};
  std::vector<float> many;
  for (int i = 0; i < 50000; ++i) many.insert(many.end(), row.begin(), row.end());
  const Array logits = Array::from_vector<float>(many, {50000, 4});
  const Array c = random::categorical(random::Key(51), logits);
  EXPECT_EQ(c.shape(), (Shape{50000}));
  EXPECT_EQ(c.dtype(), DType::i32);
  std::vector<int> counts(4);
  for (int32_t v : c.to_vector<int32_t>()) ++counts.at(v);
  double z = 0;
  for (double l : row) z += std::exp(l);
  for (int k = 0; k < 4; ++k) {
    const double p = std::exp(row[k]) / z;
    EXPECT_NEAR(counts[k] / 50000.0, p, 4.5 * std::sqrt(p * (1 - p) / 50000)) << k;
  }
  // Along axis 0 of the transpose: the same draw per column.
  const Array t = random::categorical(random::Key(52), transpose(logits, {1, 0}), 0);
  EXPECT_EQ(t.shape(), (Shape{50000}));
}

TEST(Random, BadArgumentsAreNamed) {
  using test_util::error_of;
  EXPECT_NE(error_of([] { random::gamma(random::Key(0), {3}, 0); }).find("random.gamma"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { random::beta(random::Key(0), {3}, 1, -1); }).find("a and b must be positive"),
      std::string::npos);
  EXPECT_NE(
      error_of([] { random::randint(random::Key(0), {3}, 5, 5); }).find("high must be above low"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              random::randint(random::Key(0), {3}, 0, int64_t{1} << 40);
            }).find("does not fit the i32"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              random::categorical(random::Key(0), zeros({3}, DType::i32));
            }).find("logits must be floating-point"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { random::gamma(random::Key(0), {3}, 2, DType::i32); }).find("dtype must be"),
      std::string::npos);
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
