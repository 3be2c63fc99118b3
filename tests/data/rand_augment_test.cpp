// RandAugment: kiln's operations equal timm's op functions on Pillow images
// byte for byte, its level mappings and config reading equal timm's
// (tests/fixtures/rand_augment.json, written by
// tools/golden/make_rand_augment_golden.py from timm 1.0.31 and Pillow 13);
// kiln's draws; bad config strings.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "../test_util.h"
#include "kiln/data.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

data::AugmentOp op_named(const std::string& name) {
  for (int i = 0; i < data::kAugmentOps; ++i)
    if (name == data::augment_op_name(static_cast<data::AugmentOp>(i)))
      return static_cast<data::AugmentOp>(i);
  ADD_FAILURE() << "no operation " << name;
  return data::AugmentOp::Invert;
}

TEST(RandAugment, OperationsEqualTimmOnPillowByteForByte) {
  const nlohmann::json f = test_util::json_fixture("rand_augment.json");
  ASSERT_GE(f["ops"].size(), 180u);
  std::map<std::string, int> cases, changed;
  for (const auto& c : f["ops"]) {
    const std::string name = c["op"];
    data::Image img{c["width"], c["height"], 3, c["pixels"].get<std::vector<uint8_t>>()};
    const std::vector<uint8_t> before = img.pixels;
    const auto fill = c["fill"].get<std::array<uint8_t, 3>>();
    const data::Resample r =
        c["resample"] == "bilinear" ? data::Resample::bilinear : data::Resample::bicubic;
    const double arg = c["arg"].is_null() ? 0.0 : c["arg"].get<double>();
    data::augment_op(img, op_named(name), arg, fill, r);
    const auto expected = c["expected"].get<std::vector<uint8_t>>();
    ASSERT_EQ(img.pixels.size(), expected.size());
    int wrong = 0;
    for (size_t i = 0; i < expected.size(); ++i) wrong += img.pixels[i] != expected[i];
    EXPECT_EQ(wrong, 0) << name << " arg " << arg << " " << c["resample"] << " " << c["width"]
                        << "x" << c["height"];
    ++cases[name];
    changed[name] += img.pixels != before;
  }
  EXPECT_EQ(cases.size(), 15u);
  for (auto& [name, n] : changed) EXPECT_GE(n, 4) << name << ": the cases must change images";
}

TEST(RandAugment, LevelsEqualTimms) {
  const nlohmann::json f = test_util::json_fixture("rand_augment.json");
  ASSERT_GE(f["levels"].size(), 200u);
  for (const auto& c : f["levels"]) {
    const double got =
        data::augment_level_to_arg(op_named(c["op"]), c["magnitude"], c["increasing"], c["negate"]);
    EXPECT_EQ(got, c["arg"].get<double>()) << c.dump();
  }
}

TEST(RandAugment, ConfigStringsReadAsTimmReadsThem) {
  const nlohmann::json f = test_util::json_fixture("rand_augment.json");
  ASSERT_GE(f["configs"].size(), 7u);
  for (const auto& c : f["configs"]) {
    const auto o = data::RandAugmentOptions::parse(c["config"], "--rand-augment");
    EXPECT_TRUE(o.enabled);
    EXPECT_EQ(o.magnitude, c["magnitude"].get<double>()) << c["config"];
    EXPECT_EQ(o.num_layers, c["num_layers"].get<int64_t>()) << c["config"];
    EXPECT_EQ(o.prob, c["prob"].get<double>()) << c["config"];
    const double std = c["magnitude_std"];
    if (std < 0)
      EXPECT_TRUE(std::isinf(o.magnitude_std)) << c["config"];
    else
      EXPECT_EQ(o.magnitude_std, std) << c["config"];
    EXPECT_EQ(o.magnitude_max, c["magnitude_max"].get<double>()) << c["config"];
    EXPECT_EQ(o.increasing, c["increasing"].get<bool>()) << c["config"];
  }
}

// kiln's draws: over many images with rand-m9-mstd0.5, n = 2 and p = 0.5,
// every operation is drawn about equally often, about half the drawn
// operations run (an image is left alone about a quarter of the time), and
// the same draws give the same image.
TEST(RandAugment, DrawsEveryOperationAtItsRate) {
  const auto o = data::RandAugmentOptions::parse("rand-m9-mstd0.5", "--rand-augment");
  std::mt19937_64 gen(3);
  std::uniform_int_distribution<int> byte(0, 255);
  data::Image base{16, 12, 3, std::vector<uint8_t>(16 * 12 * 3)};
  for (auto& v : base.pixels) v = static_cast<uint8_t>(byte(gen));
  std::vector<double> draws;
  const int kImages = 3000;
  int untouched = 0;
  std::vector<int> chosen(data::kAugmentOps, 0);
  for (int i = 0; i < kImages; ++i) {
    std::uniform_real_distribution<double> u(0, 1);
    draws.clear();
    const std::function<double()> uniform = [&] { return draws.emplace_back(u(gen)); };
    data::Image img = base;
    data::rand_augment(img, o, uniform);
    ASSERT_GE(draws.size(), 4u);  // two choices, two probabilities
    for (int k = 0; k < 2; ++k) ++chosen[static_cast<int>(draws[k] * data::kAugmentOps)];
    untouched += img.pixels == base.pixels;
    size_t next = 0;
    data::Image again = base;
    data::rand_augment(again, o, [&] { return draws.at(next++); });
    EXPECT_EQ(again.pixels, img.pixels);
    EXPECT_EQ(next, draws.size());
  }
  for (int c : chosen) EXPECT_NEAR(c, 2.0 * kImages / data::kAugmentOps, 100);
  EXPECT_NEAR(untouched, kImages / 4, 120);
}

// The magnitude: N(9, 0.5) clipped to [0, 10]; uniform in [0, m] for mstd
// above 100; a rotation by it (the one operation, probability 1) turns by
// 3 x the magnitude degrees either way.
TEST(RandAugment, MagnitudeNoiseAndNegation) {
  data::RandAugmentOptions o = data::RandAugmentOptions::parse("rand-n1-p1-m9-mstd0.5", "-");
  // Draws: the choice (Rotate), the two normal draws, the negation.
  const double rotate = (3 + 0.5) / data::kAugmentOps;
  data::Image img{9, 9, 3, std::vector<uint8_t>(9 * 9 * 3)};
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>(i * 7);
  auto run = [&](const data::RandAugmentOptions& opt, std::vector<double> draws) {
    data::Image out = img;
    size_t next = 0;
    data::rand_augment(out, opt, [&] { return draws.at(next++); });
    EXPECT_EQ(next, draws.size());
    return out.pixels;
  };
  auto rotated = [&](double degrees) {
    data::Image out = img;
    data::augment_op(out, data::AugmentOp::Rotate, degrees, o.fill, o.resample);
    return out.pixels;
  };
  // u1 = 1 - e^-2 and u2 = 0: a normal draw of exactly 2: 9 + 2 x 0.5 = 10.
  const double u1 = 1 - std::exp(-2.0);
  EXPECT_EQ(run(o, {rotate, u1, 0.0, 0.9}), rotated(-30));
  EXPECT_EQ(run(o, {rotate, u1, 0.0, 0.1}), rotated(30));
  // 9 - 2 x 0.5 x 5 (mstd 2.5) = 4: 12 degrees; clipped at 0 below.
  o.magnitude_std = 2.5;
  EXPECT_EQ(run(o, {rotate, u1, 0.5, 0.1}), rotated(12));
  o.magnitude_std = 100;
  EXPECT_EQ(run(o, {rotate, u1, 0.5, 0.1}), img.pixels);
  o.magnitude_std = INFINITY;
  EXPECT_EQ(run(o, {rotate, 0.5, 0.1}), rotated(13.5));
}

// Image.rotate's fast paths (Transpose): 90 degrees turns a square counter-
// clockwise (the top-right pixel to the top-left), 180 reverses it, and four
// quarter turns or two half turns give it back.
TEST(RandAugment, QuarterAndHalfTurnsTransposeAsPillowDoes) {
  data::Image img{2, 2, 3, {1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4}};  // [[1, 2], [3, 4]]
  auto turned = [&](data::Image im, double degrees, int times) {
    for (int i = 0; i < times; ++i)
      data::augment_op(im, data::AugmentOp::Rotate, degrees, {0, 0, 0}, data::Resample::bicubic);
    return im.pixels;
  };
  EXPECT_EQ(turned(img, 90, 1), (std::vector<uint8_t>{2, 2, 2, 4, 4, 4, 1, 1, 1, 3, 3, 3}));
  EXPECT_EQ(turned(img, -90, 1), (std::vector<uint8_t>{3, 3, 3, 1, 1, 1, 4, 4, 4, 2, 2, 2}));
  EXPECT_EQ(turned(img, 180, 1), (std::vector<uint8_t>{4, 4, 4, 3, 3, 3, 2, 2, 2, 1, 1, 1}));
  EXPECT_EQ(turned(img, 90, 4), img.pixels);
  EXPECT_EQ(turned(img, 180, 2), img.pixels);
}

TEST(RandAugment, BadConfigsNameTheFlagAndSection) {
  auto err = [](const std::string& config) {
    return test_util::error_of([&] { data::RandAugmentOptions::parse(config, "--rand-augment"); });
  };
  EXPECT_NE(err("rand-m9-x4").find("--rand-augment"), std::string::npos);
  EXPECT_NE(err("rand-m9-x4").find("section 'x4'"), std::string::npos);
  EXPECT_NE(err("augmix-m5").find("\"rand\""), std::string::npos);
  EXPECT_NE(err("rand-m9.5").find("not an integer"), std::string::npos);
  EXPECT_NE(err("rand-n99999999999999999999").find("not an integer in range"), std::string::npos);
  EXPECT_NE(err("rand-n9999999").find("n 1000000: expected 0 to 100"), std::string::npos);
  EXPECT_NE(err("rand-mstd1e999").find("not a number in range"), std::string::npos);
  EXPECT_NE(err("rand-tweights").find("not supported"), std::string::npos);
  EXPECT_NE(err("rand-p2").find("p 2"), std::string::npos);
  EXPECT_NE(err("rand-inc2").find("inc0 or inc1"), std::string::npos);
  EXPECT_NE(err("rand-m").find("section 'm'"), std::string::npos);
  EXPECT_NE(err("rand-m9-").find("section ''"), std::string::npos);
  data::Image grey{2, 2, 1, std::vector<uint8_t>(4)};
  EXPECT_NE(
      test_util::error_of([&] {
        data::augment_op(grey, data::AugmentOp::Invert, 0, {0, 0, 0}, data::Resample::bicubic);
      }).find("RGB"),
      std::string::npos);
}

}  // namespace
}  // namespace kiln
