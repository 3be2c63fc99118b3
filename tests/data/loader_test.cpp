// The random-image data set and the threaded loader.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "kiln/data.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

// Sample i holds the value i everywhere: easy to trace through batches.
class Counting final : public data::Dataset {
 public:
  explicit Counting(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Shape image_shape() const override { return {2}; }
  void get(int64_t i, float* image, int32_t* label) const override {
    image[0] = image[1] = static_cast<float>(i);
    *label = static_cast<int32_t>(i);
  }

 private:
  int64_t n_;
};

std::vector<int32_t> take_epoch(data::Loader& loader) {
  std::vector<int32_t> seen;
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    auto batch = loader.next();
    auto labels = batch.labels.to_vector<int32_t>();
    auto images = batch.images.to_vector<float>();
    for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(images[2 * i], labels[i]);
    seen.insert(seen.end(), labels.begin(), labels.end());
  }
  return seen;
}

TEST(RandomImages, SamplesArePureFunctionsOfSeedAndIndex) {
  data::RandomImages a(
      {.num_samples = 100, .num_labels = 7, .image_size = 8, .channels = 3, .seed = 5});
  data::RandomImages b(
      {.num_samples = 100, .num_labels = 7, .image_size = 8, .channels = 3, .seed = 5});
  data::RandomImages c(
      {.num_samples = 100, .num_labels = 7, .image_size = 8, .channels = 3, .seed = 6});
  std::vector<float> x(192), y(192), z(192);
  int32_t lx, ly, lz;
  a.get(42, x.data(), &lx);
  b.get(42, y.data(), &ly);
  c.get(42, z.data(), &lz);
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  EXPECT_EQ(lx, 42 % 7);
  // kiln's own normal draw of the same key, computed in f32 (normal_fill.cpp).
  auto ref = random::normal(random::fold_in(random::Key(5), 42), {192}).to_vector<float>();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], ref[i], 1e-6) << i;
  EXPECT_EQ(a.image_shape(), (Shape{3, 8, 8}));
  data::RandomImages nhwc({.num_samples = 1, .image_size = 8, .layout = nn::Layout::NHWC});
  EXPECT_EQ(nhwc.image_shape(), (Shape{8, 8, 3}));
}

// random::fill_normal (the data sets' normals): normal(key, {n})'s Threefry
// blocks and Box–Muller transform with f32 math, within 1e-6 of its f64
// values over 2^20 of them (the largest |x| there is above 4.5); each value
// the same whatever n and wherever it falls in a vector.
TEST(FillNormal, IsTheNormalDrawInF32) {
  const random::Key key(17);
  const int64_t n = int64_t{1} << 20;
  std::vector<float> x(n);
  random::fill_normal(key, x.data(), n);
  const auto ref = random::normal(key, {n}, DType::f64).to_vector<double>();
  double worst = 0, largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(x[i] - ref[i]));
    largest = std::max(largest, std::fabs(ref[i]));
  }
  EXPECT_LT(worst, 1e-6);
  EXPECT_GT(largest, 4.5);
  for (int64_t m : {1, 2, 31, 33, 100}) {
    std::vector<float> y(m);
    random::fill_normal(key, y.data(), m);
    EXPECT_EQ(y, std::vector<float>(x.begin(), x.begin() + m)) << m;
  }
}

TEST(Loader, InOrderWithoutShuffling) {
  for (int workers : {0, 1, 3}) {
    data::Loader loader(std::make_shared<Counting>(10),
                        {.batch_size = 3, .workers = workers, .prefetch = 2});
    EXPECT_EQ(loader.batches_per_epoch(), 3);  // drop_last
    EXPECT_EQ(take_epoch(loader), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8})) << workers;
    auto next = loader.next();  // the second epoch starts over
    EXPECT_EQ(next.epoch, 1);
    EXPECT_EQ(next.labels.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2}));
  }
}

TEST(Loader, KeepsTheLastPartialBatchWhenAsked) {
  data::Loader loader(std::make_shared<Counting>(10), {.batch_size = 4, .drop_last = false});
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  loader.next();
  loader.next();
  EXPECT_EQ(loader.next().labels.to_vector<int32_t>(), (std::vector<int32_t>{8, 9}));
}

TEST(Loader, ShufflesEachEpochWithoutLosingOrRepeatingSamples) {
  data::Loader loader(std::make_shared<Counting>(64),
                      {.batch_size = 8, .shuffle = true, .seed = 3, .workers = 2});
  auto e0 = take_epoch(loader), e1 = take_epoch(loader);
  EXPECT_EQ(std::set<int32_t>(e0.begin(), e0.end()).size(), 64u);
  EXPECT_EQ(std::set<int32_t>(e1.begin(), e1.end()).size(), 64u);
  EXPECT_NE(e0, e1);
  std::vector<int32_t> sorted(64);
  for (int i = 0; i < 64; ++i) sorted[i] = i;
  EXPECT_NE(e0, sorted);
  // Same seed, same order, whatever the number of workers.
  data::Loader again(std::make_shared<Counting>(64),
                     {.batch_size = 8, .shuffle = true, .seed = 3, .workers = 0});
  EXPECT_EQ(take_epoch(again), e0);
}

TEST(Loader, StopsCleanlyMidEpoch) {
  for (int i = 0; i < 20; ++i) {
    data::Loader loader(std::make_shared<Counting>(1000),
                        {.batch_size = 10, .workers = 3, .prefetch = 4});
    loader.next();
  }  // destructors join workers blocked on a full queue
  SUCCEED();
}

TEST(Loader, CountsTimeSpentWaiting) {
  data::Loader loader(std::make_shared<Counting>(100), {.batch_size = 10, .workers = 1});
  for (int i = 0; i < 5; ++i) loader.next();
  EXPECT_GE(loader.wait_seconds(), 0.0);
  EXPECT_LT(loader.wait_seconds(), 5.0);
}

class Failing final : public data::Dataset {
 public:
  int64_t size() const override { return 10; }
  Shape image_shape() const override { return {1}; }
  void get(int64_t i, float*, int32_t*) const override {
    if (i == 5) fail("data", "sample 5 is unreadable");
  }
};

TEST(Loader, AWorkersErrorReachesTheCaller) {
  data::Loader loader(std::make_shared<Failing>(), {.batch_size = 5, .workers = 2});
  loader.next();
  EXPECT_THROW(loader.next(), Error);
}

TEST(Loader, BadOptionsAreRefused) {
  EXPECT_THROW(data::Loader(std::make_shared<Counting>(3), {.batch_size = 4}), Error);
  EXPECT_THROW(data::Loader(std::make_shared<Counting>(3), {.batch_size = 0}), Error);
}

}  // namespace
}  // namespace kiln
