// Random erasing: kiln's boxes and erased images equal timm's RandomErasing
// on the same uniform draws (tests/fixtures/erasing.json, written by
// tools/golden/make_erasing_golden.py; retries of boxes too large
// included); the fill modes; kiln's own draws; bad options.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "kiln/data.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

TEST(RandomErasing, EqualsTimmsOnTheSameDraws) {
  const nlohmann::json f = test_util::json_fixture("erasing.json");
  const auto shape = f["shape"].get<std::vector<int64_t>>();
  int erased = 0, retried = 0;
  for (const auto& c : f["cases"]) {
    data::ErasingOptions opt{.prob = c["probability"], .mode = "const"};
    if (c.contains("max_area")) opt.max_area = c["max_area"], opt.min_aspect = c["min_aspect"];
    const auto draws = c["draws"].get<std::vector<double>>();
    size_t used = 0;
    const data::EraseBox box =
        data::erase_box(opt, shape[1], shape[2], [&] { return draws.at(used++); });
    EXPECT_EQ(used, c["used"].get<size_t>());
    erased += box.erase;
    retried += used > 5;
    const auto image = c["image"].get<std::vector<float>>();
    const Array x = Array::from_data(image.data(), {1, shape[0], shape[1], shape[2]}, DType::f32);
    const auto got = data::erase_batch(x, {box}, opt, random::Key(0), false).to_vector<float>();
    const auto want = c["erased"].get<std::vector<float>>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
    // Channels last: the same box.
    const auto nhwc =
        transpose(data::erase_batch(transpose(x, {0, 2, 3, 1}), {box}, opt, random::Key(0), true),
                  {0, 3, 1, 2})
            .to_vector<float>();
    for (size_t i = 0; i < nhwc.size(); ++i) ASSERT_EQ(nhwc[i], want[i]) << i;
  }
  EXPECT_GE(erased, 10);
  EXPECT_GE(retried, 3);
}

TEST(RandomErasing, FillModesAndKilnsDraws) {
  const Array x = ones({2, 3, 16, 16});
  const data::EraseBox box{.erase = true, .top = 2, .left = 3, .height = 8, .width = 10};
  auto region = [&](const Array& y, int64_t img, int64_t c) {
    std::vector<float> v, all = y.to_vector<float>();
    for (int64_t r = 2; r < 10; ++r)
      for (int64_t q = 3; q < 13; ++q) v.push_back(all[((img * 3 + c) * 16 + r) * 16 + q]);
    return v;
  };
  // pixel: normal draws everywhere in the box; outside it, the image.
  const Array p =
      data::erase_batch(x, {box, {}}, {.prob = 1, .mode = "pixel"}, random::Key(1), false);
  const auto v = region(p, 0, 1);
  double m = 0, sq = 0;
  for (float a : v) m += a, sq += a * a;
  m /= v.size(), sq = sq / v.size() - m * m;
  EXPECT_NEAR(m, 0.0, 0.35);
  EXPECT_NEAR(sq, 1.0, 0.5);
  EXPECT_EQ(region(p, 1, 1), std::vector<float>(80, 1.0f));  // image 1 kept
  EXPECT_EQ(p.to_vector<float>()[0], 1.0f);
  // rand: one value per channel.
  const Array r =
      data::erase_batch(x, {box, box}, {.prob = 1, .mode = "rand"}, random::Key(1), false);
  const auto c0 = region(r, 0, 0), c1 = region(r, 0, 1);
  EXPECT_EQ(c0, std::vector<float>(80, c0[0]));
  EXPECT_NE(c0[0], c1[0]);
  EXPECT_NE(region(r, 1, 0)[0], c0[0]);  // each image its own draws
  // kiln's draws: about prob of the images get a box inside the image.
  int boxes = 0;
  for (uint32_t i = 0; i < 2000; ++i) {
    const data::EraseBox b =
        data::draw_erase({.prob = 0.25}, random::fold_in(random::Key(3), i), 20, 24);
    if (!b.erase) continue;
    ++boxes;
    EXPECT_TRUE(b.top >= 0 && b.left >= 0 && b.top + b.height <= 20 && b.left + b.width <= 24);
    const double area = double(b.height * b.width) / 480;
    EXPECT_TRUE(area > 0.005 && area < 0.45) << area;
  }
  EXPECT_NEAR(boxes / 2000.0, 0.25, 0.03);
}

TEST(RandomErasing, BadOptionsAreClearErrors) {
  auto error_of = [](const data::ErasingOptions& o) {
    try {
      o.validate();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of({.prob = 1.5}).find("--reprob"), std::string::npos);
  EXPECT_NE(error_of({.prob = 0.5, .mode = "noise"}).find("--remode 'noise'"), std::string::npos);
  EXPECT_EQ(error_of({.prob = 0.25}), "");
}

}  // namespace
}  // namespace kiln
