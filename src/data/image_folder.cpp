// kiln data: JPEG/PNG decoding and the image-folder data set.
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/data.h"

namespace kiln::data {
namespace {

namespace fs = std::filesystem;

bool is_jpeg(const std::vector<uint8_t>& b) {
  return b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}
bool is_png(const std::vector<uint8_t>& b) {
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return b.size() >= 8 && std::memcmp(b.data(), sig, 8) == 0;
}

// PIL refuses images above this many pixels as decompression bombs (twice its
// MAX_IMAGE_PIXELS); so does kiln, before it allocates: a header of a few bytes
// can claim 65535 x 65535 pixels, 12 GB decoded.
constexpr int64_t kMaxPixels = 178956970;

void check_size(int64_t width, int64_t height, const char* format, const std::string& origin) {
  if (width <= 0 || height <= 0)
    fail(origin, std::string("is not a readable ") + format + ": its header gives no image size");
  if (width * height > kMaxPixels)
    fail(origin, "is " + std::to_string(width) + "x" + std::to_string(height) + " = " +
                     std::to_string(width * height) + " pixels, expected at most " +
                     std::to_string(kMaxPixels) + " (PIL's limit for decompression bombs)");
}

struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h) tjDestroy(h);
  }
};

Image decode_jpeg(const std::vector<uint8_t>& b, int64_t channels, const std::string& origin,
                  bool header_only) {
  TjHandle tj;
  if (!tj.h) fail(origin, "cannot start the JPEG decoder");
  int w = 0, h = 0, sub = 0, space = 0;
  if (tjDecompressHeader3(tj.h, b.data(), b.size(), &w, &h, &sub, &space) != 0)
    fail(origin, std::string("is not a readable JPEG: ") + tjGetErrorStr2(tj.h));
  check_size(w, h, "JPEG", origin);
  Image img{w, h, channels, {}};
  if (header_only) return img;
  img.pixels.resize(static_cast<size_t>(w) * h * channels);
  int fmt = channels == 1 ? TJPF_GRAY : TJPF_RGB;
  if (tjDecompress2(tj.h, b.data(), b.size(), img.pixels.data(), w, 0, h, fmt,
                    TJFLAG_STOPONWARNING) != 0)
    fail(origin, std::string("is a damaged JPEG: ") + tjGetErrorStr2(tj.h));
  return img;
}

// libpng's simplified API; png_image_free may run twice (finish_read frees too).
struct PngImage {
  png_image png{};
  PngImage() { png.version = PNG_IMAGE_VERSION; }
  ~PngImage() { png_image_free(&png); }
};

Image decode_png(const std::vector<uint8_t>& b, int64_t channels, const std::string& origin,
                 bool header_only) {
  PngImage p;
  png_image& png = p.png;
  if (!png_image_begin_read_from_memory(&png, b.data(), b.size()))
    fail(origin, std::string("is not a readable PNG: ") + png.message);
  Image img{png.width, png.height, channels, {}};
  check_size(img.width, img.height, "PNG", origin);
  if (header_only) return img;
  png.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  img.pixels.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, img.pixels.data(), 0, nullptr))
    fail(origin, std::string("is a damaged PNG: ") + png.message);
  return img;
}

Image decode(const std::vector<uint8_t>& b, int64_t channels, const std::string& origin,
             bool header_only) {
  if (channels != 1 && channels != 3)
    fail(origin, "images are decoded to 1 or 3 channels, not " + std::to_string(channels));
  if (is_jpeg(b)) return decode_jpeg(b, channels, origin, header_only);
  if (is_png(b)) return decode_png(b, channels, origin, header_only);
  fail(origin, "is neither a JPEG nor a PNG file (" + std::to_string(b.size()) + " bytes)");
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), {});
}

bool image_extension(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e == ".jpg" || e == ".jpeg" || e == ".png";
}

}  // namespace

Image decode_image(const std::vector<uint8_t>& bytes, int64_t channels, const std::string& origin) {
  return decode(bytes, channels, origin, false);
}

Image probe_image(const std::vector<uint8_t>& bytes, const std::string& origin) {
  return decode(bytes, 3, origin, true);
}

std::vector<std::string> ImageFolder::list_classes(const std::string& root) {
  const std::string origin = "imagefolder";
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    fail(origin, root + ": not a directory (expected one sub-folder per class)");
  std::vector<std::string> classes;
  for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator();
       it.increment(ec))
    if (it->is_directory(ec)) classes.push_back(it->path().filename().string());
  if (ec) fail(origin, root + ": cannot list its sub-folders (" + ec.message() + ")");
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) fail(origin, root + ": no class sub-folders");
  return classes;
}

ImageFolder::ImageFolder(ImageFolderOptions opt) : opt_(std::move(opt)) {
  const std::string origin = "imagefolder";
  if (opt_.split != "all" && opt_.split != "train" && opt_.split != "holdout")
    fail(origin, "split '" + opt_.split + "', expected all, train or holdout");
  if (opt_.image_size.height <= 0 || opt_.image_size.width <= 0)
    fail(origin, "image_size must be positive, got " + nn::to_string(opt_.image_size));
  if (opt_.resize == nn::Size2d(0))
    opt_.resize = {opt_.image_size.height * 8 / 7, opt_.image_size.width * 8 / 7};
  if (opt_.resize.height < opt_.image_size.height || opt_.resize.width < opt_.image_size.width)
    fail(origin, "resize " + nn::to_string(opt_.resize) + " is below the crop size " +
                     nn::to_string(opt_.image_size));
  if (opt_.channels != 1 && opt_.channels != 3)
    fail(origin, "channels must be 1 or 3, got " + std::to_string(opt_.channels));
  if (static_cast<int64_t>(opt_.mean.size()) < opt_.channels ||
      static_cast<int64_t>(opt_.std.size()) < opt_.channels)
    fail(origin, "mean and std need one value per channel");
  if (opt_.holdout_every < 2) fail(origin, "holdout_every must be >= 2");
  classes_ = list_classes(opt_.root);
  for (size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::string> names;
    for (auto& e : fs::directory_iterator(fs::path(opt_.root) / classes_[c]))
      if (e.is_regular_file() && image_extension(e.path())) names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    for (size_t i = 0; i < names.size(); ++i) {
      bool held = static_cast<int64_t>(i) % opt_.holdout_every == opt_.holdout_every - 1;
      if ((opt_.split == "train" && held) || (opt_.split == "holdout" && !held)) continue;
      try {
        probe_image(read_bytes(names[i]), names[i]);
      } catch (const Error&) {
        if (!opt_.skip_bad) throw;
        ++skipped_;
        continue;
      }
      files_.push_back({names[i], static_cast<int32_t>(c)});
    }
  }
  // An empty held-out split (fewer than holdout_every files per class) is
  // allowed: the caller then has nothing to evaluate on.
  if (files_.empty() && opt_.split != "holdout")
    fail(origin,
         opt_.root + ": no readable .jpg, .jpeg or .png files in the " + opt_.split + " split");
}

Shape ImageFolder::image_shape() const {
  int64_t h = opt_.image_size.height, w = opt_.image_size.width, c = opt_.channels;
  return opt_.layout == nn::Layout::NCHW ? Shape{c, h, w} : Shape{h, w, c};
}

void ImageFolder::get(int64_t index, float* image, int32_t* label) const {
  get(index, -1, image, label);
}

void ImageFolder::get(int64_t index, int64_t epoch, float* out, int32_t* label) const {
  if (index < 0 || index >= size())
    fail("imagefolder",
         "sample " + std::to_string(index) + " is outside [0, " + std::to_string(size()) + ")");
  const auto& [path, cls] = files_[index];
  Image img = decode_image(read_bytes(path), opt_.channels, path);
  const int64_t H = opt_.image_size.height, W = opt_.image_size.width, C = opt_.channels;
  // Scale so that the image covers `resize` (a square: its shorter side
  // becomes `resize`), then crop H x W.
  double scale = std::max(static_cast<double>(opt_.resize.width) / img.width,
                          static_cast<double>(opt_.resize.height) / img.height);
  int64_t rw = std::max<int64_t>(W, std::llround(img.width * scale));
  int64_t rh = std::max<int64_t>(H, std::llround(img.height * scale));
  int64_t oy = (rh - H) / 2, ox = (rw - W) / 2;
  bool flip = false;
  if (opt_.augment && epoch >= 0) {
    random::Key k = random::fold_in(random::fold_in(random::Key(opt_.seed), uint32_t(epoch)),
                                    static_cast<uint32_t>(index));
    double v[2];
    random::DrawSpec spec = random::draw_spec(k, RandomKind::Uniform, 0, 1);
    random::draw_block(spec, 0, v);
    oy = std::min<int64_t>(rh - H, static_cast<int64_t>(v[0] * (rh - H + 1)));
    ox = std::min<int64_t>(rw - W, static_cast<int64_t>(v[1] * (rw - W + 1)));
    random::draw_block(spec, 1, v);
    flip = v[0] < 0.5;
  }
  const double sy = static_cast<double>(img.height) / rh, sx = static_cast<double>(img.width) / rw;
  for (int64_t y = 0; y < H; ++y) {
    // Bilinear, pixel centres aligned (align_corners = false).
    double fy = std::clamp((y + oy + 0.5) * sy - 0.5, 0.0, static_cast<double>(img.height - 1));
    int64_t y0 = static_cast<int64_t>(fy), y1 = std::min(y0 + 1, img.height - 1);
    double wy = fy - y0;
    for (int64_t x = 0; x < W; ++x) {
      int64_t xs = flip ? W - 1 - x : x;
      double fx = std::clamp((xs + ox + 0.5) * sx - 0.5, 0.0, static_cast<double>(img.width - 1));
      int64_t x0 = static_cast<int64_t>(fx), x1 = std::min(x0 + 1, img.width - 1);
      double wx = fx - x0;
      for (int64_t c = 0; c < C; ++c) {
        auto px = [&](int64_t yy, int64_t xx) {
          return static_cast<double>(img.pixels[(yy * img.width + xx) * C + c]);
        };
        double v = (1 - wy) * ((1 - wx) * px(y0, x0) + wx * px(y0, x1)) +
                   wy * ((1 - wx) * px(y1, x0) + wx * px(y1, x1));
        float n = static_cast<float>((v / 255.0 - opt_.mean[c]) / opt_.std[c]);
        if (opt_.layout == nn::Layout::NCHW)
          out[(c * H + y) * W + x] = n;
        else
          out[(y * W + x) * C + c] = n;
      }
    }
  }
  *label = cls;
}

}  // namespace kiln::data
