// Mixup and cutmix: kiln's mix of a batch equals timm's Mixup (mode "batch")
// given timm's own draws (tests/fixtures/mixup.json, written by
// tools/golden/make_mixup_golden.py), in either layout; kiln's draws follow
// timm's distributions (λ ~ Beta(α, α), the box's corrected λ, the
// probabilities), and bad batches and options are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../test_util.h"
#include "kiln/data.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

using test_util::error_of;

TEST(Mixup, EqualsTimmsOnItsDraws) {
  const nlohmann::json f = test_util::json_fixture("mixup.json");
  const int64_t classes = f["num_classes"];
  const double smoothing = f["label_smoothing"];
  int cutmixes = 0;
  for (const auto& c : f["cases"]) {
    SCOPED_TRACE("seed " + std::to_string(c["seed"].get<int>()));
    const auto images = c["images"].get<std::vector<float>>();
    const auto labels = c["labels"].get<std::vector<int64_t>>();
    const Array x = Array::from_data(images.data(), {4, 3, 6, 7}, DType::f32);
    const Array y = Array::from_data(labels.data(), {4}, DType::i64);
    data::MixParams m{.lam = c["lam"], .cutmix = c["cutmix"]};
    const auto box = c["box"].get<std::vector<int64_t>>();
    m.y0 = box[0], m.y1 = box[1], m.x0 = box[2], m.x1 = box[3];
    cutmixes += m.cutmix;
    auto [mixed, targets] = data::mix_batch(x, y, m, classes, smoothing, false);
    const auto want_x = c["mixed"].get<std::vector<float>>();
    const auto want_t = c["targets"].get<std::vector<float>>();
    const auto got_x = mixed.to_vector<float>(), got_t = targets.to_vector<float>();
    ASSERT_EQ(got_x.size(), want_x.size());
    for (size_t i = 0; i < got_x.size(); ++i) EXPECT_NEAR(got_x[i], want_x[i], 1e-6) << i;
    ASSERT_EQ(targets.shape(), (Shape{4, classes}));
    for (size_t i = 0; i < got_t.size(); ++i) EXPECT_NEAR(got_t[i], want_t[i], 1e-6) << i;
    // Channels last: the same pixels.
    auto [mixed_nhwc, targets_nhwc] =
        data::mix_batch(transpose(x, {0, 2, 3, 1}), y, m, classes, smoothing, true);
    const auto back = transpose(mixed_nhwc, {0, 3, 1, 2}).to_vector<float>();
    for (size_t i = 0; i < back.size(); ++i) EXPECT_NEAR(back[i], want_x[i], 1e-6) << i;
  }
  EXPECT_GE(cutmixes, 2);
}

TEST(Mixup, DrawsFollowTimmsDistributions) {
  const int n = 4000;
  auto draws = [&](const data::MixupOptions& o, uint64_t seed) {
    std::vector<data::MixParams> out;
    for (int i = 0; i < n; ++i)
      out.push_back(data::draw_mix(o, random::fold_in(random::Key(seed), i), 20, 30));
    return out;
  };
  // Mixup alone: λ ~ Beta(0.8, 0.8): mean 1/2, variance 1 / (4 (2α + 1)).
  double mean = 0, sq = 0;
  for (const auto& m : draws({.mixup_alpha = 0.8}, 1)) {
    EXPECT_FALSE(m.cutmix);
    mean += m.lam, sq += m.lam * m.lam;
  }
  mean /= n, sq = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.02);
  EXPECT_NEAR(sq, 1.0 / (4 * 2.6), 0.006);
  // Cutmix alone: the box inside the image, λ its complement's share.
  int boxes = 0;
  for (const auto& m : draws({.cutmix_alpha = 1.0}, 2)) {
    ASSERT_TRUE(m.cutmix);
    EXPECT_TRUE(0 <= m.y0 && m.y0 <= m.y1 && m.y1 <= 20 && 0 <= m.x0 && m.x0 <= m.x1 && m.x1 <= 30);
    EXPECT_DOUBLE_EQ(m.lam, 1.0 - double((m.y1 - m.y0) * (m.x1 - m.x0)) / 600.0);
    boxes += m.y1 > m.y0 && m.x1 > m.x0;
  }
  EXPECT_GT(boxes, n * 0.8);
  // Both, half of the batches mixed: about a quarter cutmix, a quarter mixup.
  int unmixed = 0, cut = 0;
  for (const auto& m : draws({.mixup_alpha = 0.8, .cutmix_alpha = 1.0, .prob = 0.5}, 3)) {
    unmixed += m.lam == 1.0;
    cut += m.cutmix;
  }
  EXPECT_NEAR(unmixed / double(n), 0.5, 0.03);
  EXPECT_NEAR(cut / double(n), 0.25, 0.03);
  // The same key gives the same draw.
  const data::MixupOptions o{.mixup_alpha = 0.8, .cutmix_alpha = 1.0};
  EXPECT_EQ(data::draw_mix(o, random::Key(9), 20, 30).lam,
            data::draw_mix(o, random::Key(9), 20, 30).lam);
}

// Beta below 1 (Gamma's boosted path) and above, and uniform integers.
TEST(Mixup, BetaAndRandintDraws) {
  for (auto [a, b] : {std::pair{0.3, 2.0}, std::pair{2.5, 1.5}}) {
    const int n = 6000;
    double mean = 0, sq = 0;
    for (int i = 0; i < n; ++i) {
      const double v = data::beta_draw(random::fold_in(random::Key(4), i), a, b);
      ASSERT_TRUE(v >= 0 && v <= 1);
      mean += v, sq += v * v;
    }
    mean /= n, sq = sq / n - mean * mean;
    EXPECT_NEAR(mean, a / (a + b), 0.01) << a << " " << b;
    EXPECT_NEAR(sq, a * b / ((a + b) * (a + b) * (a + b + 1)), 0.004) << a << " " << b;
  }
  std::vector<int> counts(7);
  for (int i = 0; i < 7000; ++i) {
    const int64_t v = data::randint_draw(random::fold_in(random::Key(5), i), -2, 5);
    ASSERT_TRUE(v >= -2 && v < 5);
    ++counts[v + 2];
  }
  for (int c : counts) EXPECT_NEAR(c, 1000, 120);
}

TEST(Mixup, BadBatchesAndOptionsAreClearErrors) {
  const Array x = zeros({3, 1, 4, 4});
  const int64_t labels[] = {0, 1, 2, 0};
  const Array y3 = Array::from_data(labels, {3}, DType::i64);
  EXPECT_NE(
      error_of([&] { data::mix_batch(x, y3, {.lam = 0.5}, 3, 0, false); }).find("even number"),
      std::string::npos);
  const Array x4 = zeros({4, 1, 4, 4}), y4 = Array::from_data(labels, {4}, DType::i64);
  EXPECT_NE(error_of([&] {
              data::mix_batch(x4, y4, {.lam = 0.5}, 2, 0, false);
            }).find("label 2 outside [0, 2)"),
            std::string::npos);
  EXPECT_NE(error_of([] { data::MixupOptions{.mixup_alpha = -1}.validate(); }).find("--mixup"),
            std::string::npos);
  EXPECT_NE(error_of([] { data::MixupOptions{.prob = 2}.validate(); }).find("--mixup-prob"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
