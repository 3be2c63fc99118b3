// Decoding and preprocessing as transformers does with Pillow, byte for byte
// and float for float (fixtures written by tools/golden/make_decode_golden.py
// with Pillow 13.0.0 and transformers 5.17.0): JPEG (subsamplings, progressive,
// grey, CMYK, RGB, EXIF and XMP orientations), PNG (every colour type and bit
// depth, palettes, interlacing, tRNS, gAMA, eXIf, XMP), and
// ViTImageProcessor's pixel_values for several preprocessor_config.json files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

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

// A warning of libjpeg's is no error (Pillow decodes such files); a file cut
// short is.
TEST(Decode, JpegWarningsAreNotErrorsButTruncationIs) {
  std::vector<uint8_t> jpeg = data::read_file_bytes(kDir + "/images/jpeg_sub2.jpg");
  const data::Image want = data::decode_image(jpeg, 3, "original");
  ASSERT_EQ(jpeg[jpeg.size() - 2], 0xFF);
  ASSERT_EQ(jpeg[jpeg.size() - 1], 0xD9);
  std::vector<uint8_t> extra = jpeg;  // "2 extraneous bytes before marker 0xd9"
  extra.insert(extra.end() - 2, {0x12, 0x34});
  EXPECT_EQ(data::decode_image(extra, 3, "extra").pixels, want.pixels);
  std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() * 2 / 3));
  try {
    data::decode_image(cut, 3, "cut.jpg");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut.jpg] is a damaged JPEG: Premature end"),
              std::string::npos)
        << e.what();
  }
}

// torchvision's RandomResizedCrop.get_params, on scripted random numbers.
TEST(RandomResizedCrop, TriesThenFallsBackToTheCentre) {
  auto script = [](std::vector<double> u) {
    return [u, i = size_t{0}]() mutable { return u.at(i++); };
  };
  const double scale[2] = {0.08, 1.0}, ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
  // First try: 2700 pixels at ratio 1, 52x52, taller than 50: rejected. The
  // second: 1550 pixels at ratio 1.1547, 42 wide and 37 high, placed by the
  // next two numbers.
  EXPECT_EQ(
      data::random_resized_crop(100, 50, scale, ratio, script({0.5, 0.5, 0.25, 0.75, 0.6, 0.3})),
      (std::array<int64_t, 4>{8, 17, 37, 42}));
  // Ten failures: the centre crop at the nearest allowed ratio (4/3 of 10 high).
  const double big[2] = {0.9, 1.0};
  EXPECT_EQ(data::random_resized_crop(100, 10, big, ratio, [] { return 0.999; }),
            (std::array<int64_t, 4>{0, 43, 10, 13}));
  // A tall image: its full width, 4/3 of it high.
  EXPECT_EQ(data::random_resized_crop(9, 100, big, ratio, [] { return 0.999; }),
            (std::array<int64_t, 4>{44, 0, 12, 9}));
}

// An image folder with a checkpoint's processor: evaluation gives
// transformers' pixel values exactly; augmentation is RandomResizedCrop and
// flips, a function of (seed, epoch, index).
TEST(ImageFolderProcessed, EvaluationIsTheProcessorAndAugmentationIsRepeatable) {
  const auto& f = expected();
  const std::string root =
      (std::filesystem::temp_directory_path() / ("kiln-processed-" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(root);
  std::vector<std::string> files;
  for (int i = 0; f.tensors.count("file." + std::to_string(i)); ++i)
    files.push_back(text_of(f.tensors.at("file." + std::to_string(i))));
  // bicubic_odd: 29x17 pixel values for each image.
  int p = 0;
  while (text_of(f.tensors.at("processor." + std::to_string(p))) != "bicubic_odd") ++p;
  std::vector<int> used;
  for (int i = 0; i < static_cast<int>(files.size()); ++i)
    if (f.tensors.count("pixel_values." + std::to_string(p) + "." + std::to_string(i))) {
      std::filesystem::create_directories(root + "/c" + std::to_string(used.size()));
      std::filesystem::copy_file(kDir + "/images/" + files[i],
                                 root + "/c" + std::to_string(used.size()) + "/" + files[i]);
      used.push_back(i);
    }
  data::ImageFolderOptions o{.root = root, .image_size = {29, 17}};
  o.processor = io::load_image_processor(kDir + "/processors/bicubic_odd");
  data::ImageFolder eval(o);
  ASSERT_EQ(eval.size(), static_cast<int64_t>(used.size()));
  std::vector<float> px(3 * 29 * 17);
  for (size_t k = 0; k < used.size(); ++k) {
    int32_t label = -1;
    eval.get(static_cast<int64_t>(k), 3, px.data(), &label);  // not augmenting: the epoch is unused
    EXPECT_EQ(label, static_cast<int32_t>(k));
    EXPECT_EQ(px, f.tensors.at("pixel_values." + std::to_string(p) + "." + std::to_string(used[k]))
                      .to_vector<float>())
        << files[used[k]];
  }
  // NHWC: the same values, channels last.
  o.layout = nn::Layout::NHWC;
  std::vector<float> nhwc(px.size());
  int32_t label;
  data::ImageFolder(o).get(0, nhwc.data(), &label);
  eval.get(0, px.data(), &label);
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < 29; ++y)
      for (int64_t x = 0; x < 17; ++x)
        ASSERT_EQ(nhwc[(y * 17 + x) * 3 + c], px[(c * 29 + y) * 17 + x]);
  o.layout = nn::Layout::NCHW;

  // Flips only (no crop, always flipped): the processor's values, mirrored.
  o.augment = true;
  o.random_crop = false;
  o.flip_prob = 1;
  std::vector<float> flipped(px.size());
  data::ImageFolder(o).get(0, 5, flipped.data(), &label);
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < 29; ++y)
      for (int64_t x = 0; x < 17; ++x)
        ASSERT_EQ(flipped[(c * 29 + y) * 17 + x], px[(c * 29 + y) * 17 + 16 - x]);

  // RandomResizedCrop: repeatable for (seed, epoch, index), new each epoch,
  // normalized as the processor says (ImageNet mean and std: within [-2.2, 2.7]).
  o.random_crop = true;
  o.flip_prob = 0.5;
  data::ImageFolder train(o);
  std::vector<float> a(px.size()), b(px.size()), c(px.size());
  train.get(1, 7, a.data(), &label);
  train.get(1, 7, b.data(), &label);
  train.get(1, 8, c.data(), &label);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (float v : a) ASSERT_TRUE(v >= -2.2f && v <= 2.7f) << v;
  train.get(1, -1, c.data(), &label);  // no epoch: evaluation
  eval.get(1, b.data(), &label);
  EXPECT_EQ(c, b);

  // A processor that does not make the model's size names the file.
  o.augment = false;
  o.image_size = 24;
  try {
    data::ImageFolder(o).get(0, px.data(), &label);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("processes to 29x17 pixel values"), std::string::npos)
        << e.what();
  }
  o.channels = 1;
  EXPECT_THROW(data::ImageFolder{o}, Error);  // a processor makes RGB
  o.channels = 3;
  o.crop_scale[0] = 0;
  EXPECT_THROW(data::ImageFolder{o}, Error);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace kiln
