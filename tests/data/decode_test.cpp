// Decoding and preprocessing as transformers does with Pillow, byte for byte
// and float for float (fixtures written by tools/golden/make_decode_golden.py
// with Pillow 13.0.0 and transformers 5.17.0): JPEG (subsamplings, progressive,
// grey, CMYK, RGB, EXIF and XMP orientations), PNG (every colour type and bit
// depth, palettes, interlacing, tRNS, gAMA, eXIf, XMP), and
// ViTImageProcessor's pixel_values for several preprocessor_config.json files.
#include <gtest/gtest.h>

#include "kiln/data.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

const std::string kDir = std::string(KILN_FIXTURES_DIR) + "/decode";

std::string text_of(const Array& a) {
  std::string s;
  for (int32_t v : a.to_vector<int32_t>()) s.push_back(static_cast<char>(v));
  return s;
}

io::SafetensorsFile& expected() {
  static io::SafetensorsFile f = io::load_safetensors(kDir + "/expected.safetensors");
  return f;
}

TEST(Decode, EqualsPillowByteForByte) {
  const auto& f = expected();
  EXPECT_EQ(f.metadata.at("pillow"), "13.0.0");
  int files = 0;
  for (int i = 0; f.tensors.count("file." + std::to_string(i)); ++i, ++files) {
    const std::string name = text_of(f.tensors.at("file." + std::to_string(i)));
    SCOPED_TRACE(name);
    const std::vector<uint8_t> bytes = data::read_file_bytes(kDir + "/images/" + name);
    for (int64_t channels : {3, 1}) {
      const Array& want = f.tensors.at((channels == 3 ? "rgb." : "l.") + std::to_string(i));
      data::Image got = data::decode_image(bytes, channels, name);
      ASSERT_EQ(got.height, want.shape()[0]) << channels;
      ASSERT_EQ(got.width, want.shape()[1]) << channels;
      ASSERT_EQ(got.channels, channels);
      std::vector<int32_t> w = want.to_vector<int32_t>();
      size_t differ = 0, first = w.size();
      for (size_t k = 0; k < w.size(); ++k)
        if (got.pixels[k] != w[k]) ++differ, first = std::min(first, k);
      EXPECT_EQ(differ, 0u) << channels << " channels; first at " << first << ": "
                            << (first < w.size() ? int(got.pixels[first]) : -1) << " vs "
                            << (first < w.size() ? w[first] : -1);
      data::Image probe = data::probe_image(bytes, name);
      if (name.find("after") == std::string::npos) {  // an eXIf after the pixels: not probed
        EXPECT_EQ(probe.width, got.width);
        EXPECT_EQ(probe.height, got.height);
      }
    }
  }
  EXPECT_EQ(files, 40);
}

TEST(Decode, PixelValuesEqualTransformers) {
  const auto& f = expected();
  EXPECT_EQ(f.metadata.at("transformers"), "5.17.0");
  int checked = 0;
  for (int p = 0; f.tensors.count("processor." + std::to_string(p)); ++p) {
    const std::string name = text_of(f.tensors.at("processor." + std::to_string(p)));
    SCOPED_TRACE(name);
    std::vector<std::string> notes;
    data::ImageProcessor proc = io::load_image_processor(kDir + "/processors/" + name, &notes);
    for (int i = 0; f.tensors.count("file." + std::to_string(i)); ++i) {
      auto it = f.tensors.find("pixel_values." + std::to_string(p) + "." + std::to_string(i));
      if (it == f.tensors.end()) continue;
      const std::string file = text_of(f.tensors.at("file." + std::to_string(i)));
      SCOPED_TRACE(file);
      data::Image img =
          data::decode_image(data::read_file_bytes(kDir + "/images/" + file), 3, file);
      nn::Size2d size = proc.output_size(img.width, img.height);
      ASSERT_EQ(size.height, it->second.shape()[1]);
      ASSERT_EQ(size.width, it->second.shape()[2]);
      std::vector<float> got(3 * size.height * size.width);
      proc.pixel_values(img, got.data());
      std::vector<float> want = it->second.to_vector<float>();
      size_t differ = 0;
      for (size_t k = 0; k < want.size(); ++k) differ += std::memcmp(&got[k], &want[k], 4) != 0;
      EXPECT_EQ(differ, 0u);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 26);
}

}  // namespace
}  // namespace kiln
