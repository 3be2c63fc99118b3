// IDX parsing (Fashion-MNIST's format), gzip through zlib, and the data set.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "kiln/data.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> idx_bytes(const Shape& shape, uint8_t fill_from = 0) {
  std::vector<uint8_t> b{0, 0, 0x08, static_cast<uint8_t>(shape.size())};
  int64_t n = 1;
  for (int64_t d : shape) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
    n *= d;
  }
  for (int64_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(fill_from + i));
  return b;
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()), static_cast<int>(bytes.size()));
  gzclose(f);
}

TEST(Idx, ParsesShapeAndData) {
  auto a = data::parse_idx(idx_bytes({2, 3}), "x.idx");
  EXPECT_EQ(a.shape, (Shape{2, 3}));
  EXPECT_EQ(a.data, (std::vector<uint8_t>{0, 1, 2, 3, 4, 5}));
}

TEST(Idx, MalformedFilesNameTheFileAndTheProblem) {
  auto bytes = idx_bytes({2, 3});
  auto wrong_magic = bytes;
  wrong_magic[0] = 0x1f;
  EXPECT_NE(test_util::error_of([&] {
              data::parse_idx(wrong_magic, "f.idx");
            }).find("[f.idx] is not an IDX"),
            std::string::npos);
  auto wrong_type = bytes;
  wrong_type[2] = 0x0d;  // float data
  EXPECT_NE(
      test_util::error_of([&] { data::parse_idx(wrong_type, "f.idx"); }).find("expected 0x08"),
      std::string::npos);
  auto truncated = bytes;
  truncated.pop_back();
  EXPECT_NE(test_util::error_of([&] { data::parse_idx(truncated, "f.idx"); }).find("(truncated)"),
            std::string::npos);
  std::vector<uint8_t> header_cut(bytes.begin(), bytes.begin() + 6);
  EXPECT_NE(
      test_util::error_of([&] { data::parse_idx(header_cut, "f.idx"); }).find("inside its header"),
      std::string::npos);
  EXPECT_NE(test_util::error_of([&] {
              data::parse_idx({0, 0}, "f.idx");
            }).find("too short"),
            std::string::npos);
}

TEST(Idx, ShapesWhoseSizeOverflowsAreRejected) {
  // 65536^4 = 2^64 elements: the product wrapped around to 0 and matched a
  // file with no data at all.
  std::vector<uint8_t> wraps{0, 0, 8, 4};
  for (int d = 0; d < 4; ++d) wraps.insert(wraps.end(), {0, 1, 0, 0});
  EXPECT_NE(test_util::error_of([&] { data::parse_idx(wraps, "f.idx"); })
                .find("[f.idx] has shape (65536,65536,65536,65536), expected dimensions whose "
                      "products (from the first) stay below 2^63"),
            std::string::npos);
}

TEST(Idx, ReadingStopsPastTheSizeOfTheHeadersShape) {
  // A gzip file of a few kilobytes that inflates to 64 MB behind a header
  // that asks for 2 x 3 bytes: an error after the first 64 KB, not after 64 MB.
  fs::path dir = fs::temp_directory_path() / ("kiln-idx-long-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto bytes = idx_bytes({2, 3});
  bytes.resize(64 << 20);
  write_gz((dir / "long.gz").string(), bytes);
  EXPECT_NE(test_util::error_of([&] {
              data::read_idx((dir / "long.gz").string());
            }).find("long.gz] has more than the 6 data bytes of its shape (2,3)"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(Idx, ReadsGzipAndPlainFilesAndRejectsDamagedGzip) {
  fs::path dir = fs::temp_directory_path() / "kiln-idx-test";
  fs::create_directories(dir);
  auto bytes = idx_bytes({4, 5});
  write_gz((dir / "a.gz").string(), bytes);
  EXPECT_EQ(data::read_idx((dir / "a.gz").string()).data.size(), 20u);
  {
    std::ofstream f(dir / "plain", std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  EXPECT_EQ(data::read_idx((dir / "plain").string()).shape, (Shape{4, 5}));
  // A gzip file cut in half: an error naming the file, not a short read.
  std::ifstream in(dir / "a.gz", std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), {});
  {
    std::ofstream f(dir / "cut.gz", std::ios::binary);
    f.write(gz.data(), gz.size() / 2);
  }
  std::string e = test_util::error_of([&] { data::read_idx((dir / "cut.gz").string()); });
  EXPECT_NE(e.find("cut.gz"), std::string::npos) << e;
  EXPECT_NE(test_util::error_of([&] {
              data::read_idx((dir / "missing.gz").string());
            }).find("cannot open"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(FashionMnist, LoadsNormalizesAndFlipsDeterministically) {
  fs::path dir = fs::temp_directory_path() / "kiln-fmnist-test";
  fs::create_directories(dir);
  write_gz((dir / "t10k-images-idx3-ubyte.gz").string(), idx_bytes({3, 28, 28}));
  write_gz((dir / "t10k-labels-idx1-ubyte.gz").string(), {0, 0, 8, 1, 0, 0, 0, 3, 7, 0, 9});
  data::FashionMnist ds({.dir = dir.string(), .split = "test", .mean = 0.5f, .std = 0.25f});
  EXPECT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.image_shape(), (Shape{1, 28, 28}));
  std::vector<float> img(28 * 28);
  int32_t label = -1;
  ds.get(2, img.data(), &label);
  EXPECT_EQ(label, 9);
  uint8_t first = static_cast<uint8_t>(2 * 28 * 28);  // the pixel byte pattern of sample 2
  EXPECT_NEAR(img[0], (first / 255.0f - 0.5f) / 0.25f, 1e-5);
  // Flips: a function of (seed, epoch, index); about half of the samples flip.
  data::FashionMnist aug({.dir = dir.string(), .split = "test", .hflip = true, .seed = 7});
  int flipped = 0;
  for (int64_t epoch = 0; epoch < 40; ++epoch) {
    std::vector<float> a(28 * 28), b(28 * 28), plain(28 * 28);
    aug.get(0, epoch, a.data(), &label);
    aug.get(0, epoch, b.data(), &label);
    EXPECT_EQ(a, b);
    aug.get(0, plain.data(), &label);  // no epoch: never flipped
    if (a != plain) {
      ++flipped;
      EXPECT_EQ(a[0], plain[27]);
    }
  }
  EXPECT_GT(flipped, 8);
  EXPECT_LT(flipped, 32);
  // Labels that disagree with the images, and out-of-range labels.
  write_gz((dir / "t10k-labels-idx1-ubyte.gz").string(), {0, 0, 8, 1, 0, 0, 0, 2, 7, 0});
  EXPECT_NE(test_util::error_of([&] {
              data::FashionMnist({.dir = dir.string(), .split = "test"});
            }).find("labels for 3 images"),
            std::string::npos);
  write_gz((dir / "t10k-labels-idx1-ubyte.gz").string(), {0, 0, 8, 1, 0, 0, 0, 3, 7, 0, 12});
  EXPECT_NE(test_util::error_of([&] {
              data::FashionMnist({.dir = dir.string(), .split = "test"});
            }).find("outside [0, 10)"),
            std::string::npos);
  EXPECT_NE(test_util::error_of([&] {
              data::FashionMnist({.dir = dir.string(), .split = "valid"});
            }).find("expected train or test"),
            std::string::npos);
  EXPECT_NE(test_util::error_of([&] {
              data::FashionMnist({.dir = dir.string(), .split = "train"});
            }).find("no train-images-idx3-ubyte"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(FashionMnist, DebianPackageData) {
  if (!fs::exists(std::string(data::kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  data::FashionMnist test({.split = "test"});
  EXPECT_EQ(test.size(), 10000);
  std::vector<int> counts(10);
  std::vector<float> img(28 * 28);
  for (int64_t i = 0; i < test.size(); ++i) {
    int32_t label;
    test.get(i, img.data(), &label);
    ++counts[label];
  }
  for (int c : counts) EXPECT_EQ(c, 1000);  // the test split is balanced
}

}  // namespace
}  // namespace kiln
