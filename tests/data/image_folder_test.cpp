// JPEG/PNG decoding errors and the image-folder data set.
#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "../test_util.h"
#include "kiln/data.h"
#include "kiln/kiln.h"
#include "kiln/train.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// A w x h RGB image filled with one colour.
std::vector<uint8_t> solid(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < px.size(); i += 3) px[i] = r, px[i + 1] = g, px[i + 2] = b;
  return px;
}

std::vector<uint8_t> encode_png(const std::vector<uint8_t>& rgb, int w, int h) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = w, img.height = h, img.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_to_memory(&img, nullptr, &size, 0, rgb.data(), 0, nullptr));
  std::vector<uint8_t> out(size);
  EXPECT_TRUE(png_image_write_to_memory(&img, out.data(), &size, 0, rgb.data(), 0, nullptr));
  out.resize(size);
  return out;
}

std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& rgb, int w, int h) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, rgb.data(), w, 0, h, TJPF_RGB, &buf, &size, TJSAMP_444, 95, 0), 0);
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

void write(const fs::path& p, const std::vector<uint8_t>& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

TEST(Decode, PngAndJpegGiveThePixels) {
  auto rgb = solid(5, 3, 200, 100, 50);
  data::Image p = data::decode_image(encode_png(rgb, 5, 3), 3, "a.png");
  EXPECT_EQ(p.width, 5);
  EXPECT_EQ(p.height, 3);
  EXPECT_EQ(p.pixels, rgb);
  data::Image j = data::decode_image(encode_jpeg(rgb, 5, 3), 3, "a.jpg");
  EXPECT_EQ(j.width, 5);
  for (size_t i = 0; i < rgb.size(); ++i) EXPECT_NEAR(j.pixels[i], rgb[i], 3);  // lossy
  data::Image g = data::decode_image(encode_png(rgb, 5, 3), 1, "a.png");
  EXPECT_EQ(g.pixels.size(), 15u);
}

TEST(Decode, DamagedFilesNameTheFile) {
  std::vector<uint8_t> rgb(64 * 64 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7919 % 251);  // busy
  auto jpg = encode_jpeg(rgb, 64, 64), png = encode_png(rgb, 64, 64);
  EXPECT_NE(test_util::error_of([&] {
              data::decode_image({'h', 'e', 'l', 'l', 'o'}, 3, "x.jpg");
            }).find("[x.jpg] is neither a JPEG nor a PNG"),
            std::string::npos);
  std::vector<uint8_t> cut_jpg(jpg.begin(), jpg.begin() + jpg.size() / 2);
  EXPECT_NE(test_util::error_of([&] {
              data::decode_image(cut_jpg, 3, "cut.jpg");
            }).find("[cut.jpg] is a damaged JPEG"),
            std::string::npos);
  std::vector<uint8_t> cut_png(png.begin(), png.begin() + png.size() - 20);
  EXPECT_NE(
      test_util::error_of([&] { data::decode_image(cut_png, 3, "cut.png"); }).find("[cut.png]"),
      std::string::npos);
  std::vector<uint8_t> header_only(jpg.begin(), jpg.begin() + 4);
  EXPECT_NE(test_util::error_of([&] {
              data::probe_image(header_only, "h.jpg");
            }).find("[h.jpg] is not a readable JPEG"),
            std::string::npos);
}

// `bytes` with the size in its header replaced: a JPEG's SOF0 frame or a PNG's IHDR chunk.
std::vector<uint8_t> claim_size(std::vector<uint8_t> bytes, uint32_t w, uint32_t h) {
  auto put = [&](size_t at, uint32_t v, int n) {
    for (int i = 0; i < n; ++i) bytes[at + i] = static_cast<uint8_t>(v >> (8 * (n - 1 - i)));
  };
  if (bytes[0] == 0xFF) {
    for (size_t i = 2; i + 9 < bytes.size(); ++i)
      if (bytes[i] == 0xFF && bytes[i + 1] == 0xC0) {
        put(i + 5, h, 2);
        put(i + 7, w, 2);
        break;
      }
  } else {
    put(16, w, 4);  // IHDR: length, "IHDR", width, height, ..., CRC over type and data
    put(20, h, 4);
    put(29, static_cast<uint32_t>(crc32(0, bytes.data() + 12, 17)), 4);
  }
  return bytes;
}

TEST(Decode, ImagesLargerThanPilTakesFailBeforeAnythingIsAllocated) {
  // A few hundred bytes whose header claims 65500 x 65500 pixels: decoding
  // would allocate 12 GB.
  auto rgb = solid(8, 8, 1, 2, 3);
  auto jpg = claim_size(encode_jpeg(rgb, 8, 8), 65500, 65500);
  EXPECT_NE(test_util::error_of([&] { data::decode_image(jpg, 3, "bomb.jpg"); })
                .find("[bomb.jpg] is 65500x65500 = 4290250000 pixels, expected at most "
                      "178956970 (PIL's limit for decompression bombs)"),
            std::string::npos);
  auto png = claim_size(encode_png(rgb, 8, 8), 30000, 30000);
  EXPECT_NE(test_util::error_of([&] {
              data::probe_image(png, "bomb.png");
            }).find("[bomb.png] is 30000x30000 = 900000000 pixels"),
            std::string::npos);
  // An image just below the limit is still taken.
  EXPECT_EQ(data::probe_image(claim_size(encode_png(rgb, 8, 8), 13377, 13377), "big.png").width,
            13377);
}

struct Folder {
  fs::path root = fs::temp_directory_path() / ("kiln-imagefolder-" + std::to_string(::getpid()));
  Folder() {
    fs::remove_all(root);
    // class "cat": 4 red PNGs; class "dog": 3 blue JPEGs of another size.
    for (int i = 0; i < 4; ++i)
      write(root / "cat" / ("c" + std::to_string(i) + ".png"),
            encode_png(solid(40, 30, 255, 0, 0), 40, 30));
    for (int i = 0; i < 3; ++i)
      write(root / "dog" / ("d" + std::to_string(i) + ".JPG"),
            encode_jpeg(solid(20, 50, 0, 0, 255), 20, 50));
    write(root / "dog" / "notes.txt", {'x'});  // not an image: ignored
  }
  ~Folder() { fs::remove_all(root); }
};

TEST(ImageFolder, ClassesLabelsResizeCropAndNormalize) {
  Folder f;
  data::ImageFolder ds({.root = f.root.string(), .image_size = 8});
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(ds.size(), 7);
  EXPECT_EQ(ds.image_shape(), (Shape{3, 8, 8}));
  std::vector<float> img(3 * 8 * 8);
  int32_t label;
  ds.get(0, img.data(), &label);
  EXPECT_EQ(label, 0);
  EXPECT_NEAR(img[0], 1.0f, 1e-5);        // red: (1 - 0.5) / 0.5
  EXPECT_NEAR(img[64 + 5], -1.0f, 1e-5);  // green channel
  ds.get(6, img.data(), &label);
  EXPECT_EQ(label, 1);
  EXPECT_NEAR(img[2 * 64 + 9], 1.0f, 0.05);  // blue (JPEG: nearly)
  // Held-out split: every 3rd file of each class.
  data::ImageFolder train(
      {.root = f.root.string(), .split = "train", .holdout_every = 3, .image_size = 8});
  data::ImageFolder held(
      {.root = f.root.string(), .split = "holdout", .holdout_every = 3, .image_size = 8});
  EXPECT_EQ(train.size() + held.size(), 7);
  EXPECT_EQ(held.size(), 2);  // cat c2, dog d2
}

TEST(ImageFolder, AugmentationIsAFunctionOfSeedEpochAndIndex) {
  Folder f;
  // A left-right gradient image shows flips and crops.
  std::vector<uint8_t> grad(64 * 48 * 3);
  for (int y = 0; y < 48; ++y)
    for (int x = 0; x < 64; ++x)
      for (int c = 0; c < 3; ++c) grad[(y * 64 + x) * 3 + c] = static_cast<uint8_t>(x * 4);
  write(f.root / "cat" / "c0.png", encode_png(grad, 64, 48));
  data::ImageFolder ds({.root = f.root.string(), .image_size = 16, .augment = true, .seed = 3});
  std::vector<float> a(3 * 16 * 16), b(3 * 16 * 16), centre(3 * 16 * 16);
  int32_t label;
  ds.get(0, 5, a.data(), &label);
  ds.get(0, 5, b.data(), &label);
  EXPECT_EQ(a, b);
  ds.get(0, centre.data(), &label);  // no epoch: the centre crop, unflipped
  EXPECT_LT(centre[0], centre[15]);  // increasing left to right
  int flipped = 0, differs = 0;
  for (int64_t e = 0; e < 20; ++e) {
    ds.get(0, e, a.data(), &label);
    flipped += a[0] > a[15];
    differs += a != centre;
  }
  EXPECT_GT(flipped, 3);
  EXPECT_LT(flipped, 17);
  EXPECT_GT(differs, 10);
}

// One 40x40 RGB image of many colours in a class folder, and the options
// that augment it into 16x16 pixel values through a processor.
data::ImageFolderOptions augmented_colours(const Folder& f) {
  std::vector<uint8_t> colours(40 * 40 * 3);
  for (size_t i = 0; i < colours.size(); ++i)
    colours[i] = static_cast<uint8_t>((i * 37 + i / 7) % 256);
  write(f.root / "cat" / "c0.png", encode_png(colours, 40, 40));
  data::ImageProcessor proc;
  proc.size = nn::Size2d(16);
  return {.root = f.root.string(), .image_size = 16, .augment = true, .seed = 3, .processor = proc};
}

// --color-jitter: torchvision's ColorJitter on the augmented (processed)
// images, after their crop and flip, drawn from the same key; the held-out
// images are left alone.
TEST(ImageFolder, ColorJitterAdjustsTheAugmentedImagesAlone) {
  Folder f;
  data::ImageFolderOptions o = augmented_colours(f);
  data::ImageFolder plain(o);
  o.color_jitter = {.brightness = 0.4, .contrast = 0.4, .saturation = 0.4, .hue = 0.1};
  data::ImageFolder jittered(o);
  std::vector<float> a(3 * 16 * 16), b(3 * 16 * 16), c(3 * 16 * 16);
  int32_t label;
  int differs = 0;
  for (int64_t e = 0; e < 5; ++e) {
    plain.get(0, e, a.data(), &label);
    jittered.get(0, e, b.data(), &label);
    jittered.get(0, e, c.data(), &label);
    EXPECT_EQ(b, c);
    differs += a != b;
  }
  EXPECT_EQ(differs, 5);
  plain.get(0, a.data(), &label);  // held out: no augmentation
  jittered.get(0, b.data(), &label);
  EXPECT_EQ(a, b);
}

// --rand-augment: timm's RandAugment on the augmented images after their
// crop and flip, drawn from the same key (the same image each time for an
// epoch, other images across epochs); the held-out images are left alone.
// The flip comes first (the image is flipped before the operations): with
// no operations drawn, the image equals the plain flipped one.
TEST(ImageFolder, RandAugmentChangesTheAugmentedImagesAlone) {
  Folder f;
  data::ImageFolderOptions o = augmented_colours(f);
  data::ImageFolder plain(o);
  o.rand_augment = data::RandAugmentOptions::parse("rand-m9-mstd0.5-p1", "--rand-augment");
  data::ImageFolder augmented(o);
  std::vector<float> a(3 * 16 * 16), b(3 * 16 * 16), c(3 * 16 * 16);
  int32_t label;
  int differs = 0;
  std::vector<std::vector<float>> seen;
  for (int64_t e = 0; e < 6; ++e) {
    plain.get(0, e, a.data(), &label);
    augmented.get(0, e, b.data(), &label);
    augmented.get(0, e, c.data(), &label);
    EXPECT_EQ(b, c);
    differs += a != b;
    for (const auto& s : seen) EXPECT_NE(s, b) << e;
    seen.push_back(b);
  }
  EXPECT_GE(differs, 5);
  plain.get(0, a.data(), &label);  // held out: no augmentation
  augmented.get(0, b.data(), &label);
  EXPECT_EQ(a, b);
  // No crop, a certain flip, n = 0.
  o.random_crop = false;
  o.flip_prob = 1;
  o.rand_augment.num_layers = 0;
  o.rand_augment.enabled = false;
  data::ImageFolder flipped(o);
  o.rand_augment.enabled = true;
  data::ImageFolder none(o);
  flipped.get(0, 1, a.data(), &label);
  none.get(0, 1, b.data(), &label);
  EXPECT_EQ(a, b);
}

// A non-square crop (height x width) for models whose image_size is a pair:
// the image is scaled to cover 8/7 of the crop both ways, then cropped.
TEST(ImageFolder, CropsNonSquareImages) {
  Folder f;
  std::vector<uint8_t> grad(64 * 48 * 3);  // brighter to the right
  for (int y = 0; y < 48; ++y)
    for (int x = 0; x < 64; ++x)
      for (int c = 0; c < 3; ++c) grad[(y * 64 + x) * 3 + c] = static_cast<uint8_t>(x * 4);
  write(f.root / "cat" / "c0.png", encode_png(grad, 64, 48));
  data::ImageFolder ds({.root = f.root.string(), .image_size = {8, 16}});
  EXPECT_EQ(ds.image_shape(), (Shape{3, 8, 16}));
  std::vector<float> img(3 * 8 * 16);
  int32_t label;
  ds.get(0, img.data(), &label);
  for (int x = 1; x < 16; ++x) EXPECT_LT(img[x - 1], img[x]) << x;  // row 0, left to right
  for (int x = 0; x < 16; ++x) EXPECT_FLOAT_EQ(img[7 * 16 + x], img[x]) << x;  // rows alike
  data::ImageFolder nhwc(
      {.root = f.root.string(), .image_size = {8, 16}, .layout = nn::Layout::NHWC});
  EXPECT_EQ(nhwc.image_shape(), (Shape{8, 16, 3}));
}

TEST(ImageFolder, CorruptFilesAreAnErrorOrSkippedAndCounted) {
  Folder f;
  write(f.root / "cat" / "broken.png", {0x89, 'P', 'N', 'G', 1, 2, 3});
  std::string e = test_util::error_of([&] { data::ImageFolder({.root = f.root.string()}); });
  EXPECT_NE(e.find("broken.png"), std::string::npos) << e;
  data::ImageFolder ds({.root = f.root.string(), .skip_bad = true});
  EXPECT_EQ(ds.skipped(), 1);
  EXPECT_EQ(ds.size(), 7);
  EXPECT_NE(test_util::error_of([&] {
              data::ImageFolder({.root = (f.root / "nope").string()});
            }).find("not a directory"),
            std::string::npos);
}

TEST(ImageFolder, TrainsAndEvaluatesOnTheHeldOutFiles) {
  Folder f;
  for (int i = 4; i < 12; ++i)
    write(f.root / "cat" / ("c" + std::to_string(i) + ".png"),
          encode_png(solid(20, 20, 250, 10, 10), 20, 20));
  for (int i = 3; i < 11; ++i)
    write(f.root / "dog" / ("d" + std::to_string(i) + ".JPG"),
          encode_jpeg(solid(20, 20, 10, 10, 250), 20, 20));
  train::TrainConfig t;
  nn::ViTConfig m = nn::ViTConfig::preset("vit-tiny");
  m.image_size = 16, m.patch_size = 8, m.hidden_size = 16;
  m.num_attention_heads = 2, m.intermediate_size = 32, m.num_hidden_layers = 1;
  m.num_labels = 2;
  t.model = nn::vit_model(m);
  t.data = "imagefolder:" + f.root.string();
  t.augment = true;
  t.batch_size = 4, t.steps = 3, t.warmup = 0, t.workers = 1, t.mode = train::Mode::jit;
  std::string ckpt = (f.root.parent_path() / (f.root.filename().string() + "-ckpt")).string();
  t.save_dir = ckpt;
  auto r = train::run(t);
  ASSERT_EQ(r.evals.size(), 1u);
  EXPECT_EQ(r.evals[0].samples, 2);  // the 10th file of each class
  // kiln eval on the same held-out files gives the same numbers.
  std::string cmd = test_util::kiln_cli_path() + " eval --checkpoint " + ckpt +
                    " --data imagefolder:" + f.root.string() + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  EXPECT_EQ(pclose(p), 0) << out;
  char want[64];
  std::snprintf(want, sizeof want, "accuracy %.2f%% (2 images", 100 * r.evals[0].accuracy);
  EXPECT_NE(out.find("held-out: loss"), std::string::npos) << out;
  EXPECT_NE(out.find(want), std::string::npos) << out;
  fs::remove_all(ckpt);
  m.num_labels = 3;
  t.model = nn::vit_model(m);
  std::string e = test_util::error_of([&] { train::run(t); });
  EXPECT_NE(e.find("has 2 classes (sub-folders), the model has num_labels 3"), std::string::npos)
      << e;
}

}  // namespace
}  // namespace kiln
