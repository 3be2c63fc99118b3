// Resizing as Pillow does, byte for byte (fixture written by
// tools/golden/make_pillow_golden.py with Pillow 13.0.0): every resample
// filter, grey and RGB, noise and gradients, up and down, each axis either
// way, to odd sizes.
#include <gtest/gtest.h>

#include "kiln/data.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

data::Image image_of(const Array& a) {  // I32 [height, width, channels]
  data::Image img{a.shape()[1], a.shape()[0], a.shape()[2], {}};
  for (int32_t v : a.to_vector<int32_t>()) img.pixels.push_back(static_cast<uint8_t>(v));
  return img;
}

TEST(Resize, EqualsPillowByteForByte) {
  io::SafetensorsFile f = io::load_safetensors(std::string(KILN_FIXTURES_DIR) + "/pillow_resize.safetensors");
  EXPECT_EQ(f.metadata.at("pillow"), "13.0.0");
  const char* names[] = {"NEAREST", "LANCZOS", "BILINEAR", "BICUBIC", "BOX", "HAMMING"};
  int cases = 0, filters_seen = 0;
  for (int i = 0; f.tensors.count("case." + std::to_string(i)); ++i, ++cases) {
    std::vector<int32_t> c = f.tensors.at("case." + std::to_string(i)).to_vector<int32_t>();
    const data::Image src = image_of(f.tensors.at("source." + std::to_string(c[0])));
    const data::Image want = image_of(f.tensors.at("out." + std::to_string(i)));
    const data::Image got = data::resize_like_pillow(src, c[2], c[3], static_cast<data::Resample>(c[1]));
    SCOPED_TRACE(std::string(names[c[1]]) + " " + std::to_string(src.width) + "x" + std::to_string(src.height) +
                 "x" + std::to_string(src.channels) + " -> " + std::to_string(c[2]) + "x" + std::to_string(c[3]));
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    ASSERT_EQ(got.channels, want.channels);
    size_t differ = 0;
    for (size_t k = 0; k < want.pixels.size(); ++k) differ += got.pixels[k] != want.pixels[k];
    EXPECT_EQ(differ, 0u);
    filters_seen |= 1 << c[1];
  }
  EXPECT_EQ(cases, 144);
  EXPECT_EQ(filters_seen, 0x3f);
}

TEST(Resize, BadSizesAndChannelsAreErrors) {
  data::Image grey{4, 3, 1, std::vector<uint8_t>(12, 7)};
  EXPECT_EQ(data::resize_like_pillow(grey, 4, 3, data::Resample::bicubic).pixels, grey.pixels);
  EXPECT_EQ(data::resize_like_pillow(grey, 9, 5, data::Resample::bilinear).pixels,
            std::vector<uint8_t>(45, 7));  // a flat image stays flat
  data::Image two{2, 2, 2, std::vector<uint8_t>(8)};
  EXPECT_THROW(data::resize_like_pillow(two, 1, 1, data::Resample::box), Error);
  EXPECT_THROW(data::resize_like_pillow(grey, 0, 3, data::Resample::box), Error);
  EXPECT_THROW(data::resize_like_pillow(grey, 3, int64_t{1} << 30, data::Resample::box), Error);
}

}  // namespace
}  // namespace kiln
