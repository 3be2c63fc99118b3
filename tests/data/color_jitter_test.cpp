// Color jitter: kiln's adjustments equal torchvision's ColorJitter on Pillow
// images byte for byte on the same order and factors
// (tests/fixtures/color_jitter.json, written by
// tools/golden/make_color_jitter_golden.py with Pillow 13); kiln's draws;
// bad options.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "../test_util.h"
#include "kiln/data.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

TEST(ColorJitter, EqualsTorchvisionOnPillowByteForByte) {
  const nlohmann::json f = test_util::json_fixture("color_jitter.json");
  ASSERT_GE(f["cases"].size(), 40u);
  int changed = 0;
  for (const auto& c : f["cases"]) {
    data::Image img{c["width"], c["height"], 3, c["pixels"].get<std::vector<uint8_t>>()};
    const std::vector<uint8_t> before = img.pixels;
    data::ColorJitterParams p;
    const auto order = c["order"].get<std::vector<int>>();
    std::copy(order.begin(), order.end(), p.order);
    p.brightness = c["brightness"], p.contrast = c["contrast"], p.saturation = c["saturation"];
    p.hue = c["hue"];
    data::color_jitter(img, p);
    const auto expected = c["expected"].get<std::vector<uint8_t>>();
    ASSERT_EQ(img.pixels.size(), expected.size());
    int wrong = 0;
    for (size_t i = 0; i < expected.size(); ++i) wrong += img.pixels[i] != expected[i];
    EXPECT_EQ(wrong, 0) << c.dump().substr(0, 300);
    changed += img.pixels != before;
  }
  EXPECT_GE(changed, 35);
}

// kiln's draws: every order of the four adjustments, factors inside their
// ranges, an adjustment left at 0 untouched.
TEST(ColorJitter, DrawsEveryOrderAndFactorsInRange) {
  const data::ColorJitterOptions opt{
      .brightness = 0.4, .contrast = 1.5, .saturation = 0, .hue = 0.1};
  std::mt19937_64 gen(5);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  const std::function<double()> uniform = [&] { return u01(gen); };
  std::set<std::vector<int>> orders;
  for (int i = 0; i < 2000; ++i) {
    const data::ColorJitterParams p = data::draw_color_jitter(opt, uniform);
    orders.insert(std::vector<int>(p.order, p.order + 4));
    EXPECT_GE(p.brightness, 0.6);
    EXPECT_LE(p.brightness, 1.4);
    EXPECT_GE(p.contrast, 0.0);
    EXPECT_LE(p.contrast, 2.5);
    EXPECT_EQ(p.saturation, 1.0);
    EXPECT_GE(p.hue, -0.1);
    EXPECT_LE(p.hue, 0.1);
  }
  EXPECT_EQ(orders.size(), 24u);
}

TEST(ColorJitter, BadOptionsNameTheFlag) {
  const std::string bad =
      test_util::error_of([] { data::ColorJitterOptions{.brightness = -1}.validate(); });
  EXPECT_NE(bad.find("--color-jitter"), std::string::npos) << bad;
  const std::string hue =
      test_util::error_of([] { data::ColorJitterOptions{.hue = 0.7}.validate(); });
  EXPECT_NE(hue.find("expected 0 to 0.5"), std::string::npos) << hue;
  data::Image grey{2, 2, 1, std::vector<uint8_t>(4, 9)};
  const std::string channels = test_util::error_of([&] { data::color_jitter(grey, {}); });
  EXPECT_NE(channels.find("takes RGB images"), std::string::npos) << channels;
}

}  // namespace
}  // namespace kiln
