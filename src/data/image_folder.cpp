// kiln data: the image-folder data set.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/pillow.h"
#include "kiln/data.h"

namespace kiln::data {
namespace {

namespace fs = std::filesystem;

// The w x h pixels of `img` whose top-left pixel is (left, top), all inside it.
Image crop_image(const Image& img, int64_t left, int64_t top, int64_t w, int64_t h) {
  Image out{w, h, img.channels, std::vector<uint8_t>(static_cast<size_t>(w * h * img.channels))};
  for (int64_t y = 0; y < h; ++y)
    std::memcpy(&out.pixels[y * w * img.channels],
                &img.pixels[((top + y) * img.width + left) * img.channels], w * img.channels);
  return out;
}

}  // namespace

std::array<int64_t, 4> random_resized_crop(int64_t width, int64_t height, const double scale[2],
                                           const double ratio[2],
                                           const std::function<double()>& uniform) {
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double lo = std::log(ratio[0]), hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (scale[0] + (scale[1] - scale[0]) * uniform());
    const double aspect = std::exp(lo + (hi - lo) * uniform());
    const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));
    const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int64_t top = std::min(
          height - h, static_cast<int64_t>(uniform() * static_cast<double>(height - h + 1)));
      const int64_t left =
          std::min(width - w, static_cast<int64_t>(uniform() * static_cast<double>(width - w + 1)));
      return {top, left, h, w};
    }
  }
  // The centre crop, at the allowed ratio nearest the image's.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  const double rmin = std::min(ratio[0], ratio[1]), rmax = std::max(ratio[0], ratio[1]);
  int64_t w = width, h = height;
  if (in_ratio < rmin)
    h = static_cast<int64_t>(std::nearbyint(static_cast<double>(w) / rmin));
  else if (in_ratio > rmax)
    w = static_cast<int64_t>(std::nearbyint(static_cast<double>(h) * rmax));
  return {(height - h) / 2, (width - w) / 2, h, w};
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
  if (opt_.processor) {
    if (opt_.channels != 3)
      fail(origin, "an image processor makes RGB pixel values: channels must be 3, got " +
                       std::to_string(opt_.channels));
    opt_.processor->validate("image processor");
    const double* s = opt_.crop_scale;
    const double* r = opt_.crop_ratio;
    if (!(s[0] > 0 && s[0] <= s[1]))
      fail(origin, "crop scale " + std::to_string(s[0]) + "," + std::to_string(s[1]) +
                       ": expected 0 < min <= max (fractions of the image's area)");
    if (!(r[0] > 0 && r[0] <= r[1] && std::isfinite(r[1])))
      fail(origin, "crop ratio " + std::to_string(r[0]) + "," + std::to_string(r[1]) +
                       ": expected 0 < min <= max (width / height)");
    if (!(opt_.flip_prob >= 0 && opt_.flip_prob <= 1))
      fail(origin, "flip probability " + std::to_string(opt_.flip_prob) + ": expected 0 to 1");
  }
  classes_ = list_classes(opt_.root);
  for (size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::string> names;
    for (auto& e : fs::directory_iterator(fs::path(opt_.root) / classes_[c]))
      if (e.is_regular_file() && is_image_file_name(e.path().string()))
        names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    for (size_t i = 0; i < names.size(); ++i) {
      bool held = static_cast<int64_t>(i) % opt_.holdout_every == opt_.holdout_every - 1;
      if ((opt_.split == "train" && held) || (opt_.split == "holdout" && !held)) continue;
      try {
        probe_image(read_file_bytes(names[i]), names[i]);
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
  if (opt_.processor) {
    get_processed(index, epoch, out);
    *label = cls;
    return;
  }
  Image img = decode_image(read_file_bytes(path), opt_.channels, path);
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
    random::uniform_block(k, 0, v);
    oy = std::min<int64_t>(rh - H, static_cast<int64_t>(v[0] * (rh - H + 1)));
    ox = std::min<int64_t>(rw - W, static_cast<int64_t>(v[1] * (rw - W + 1)));
    random::uniform_block(k, 1, v);
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

void ImageFolder::get_processed(int64_t index, int64_t epoch, float* out) const {
  const std::string& path = files_[index].first;
  const ImageProcessor& proc = *opt_.processor;
  const int64_t H = opt_.image_size.height, W = opt_.image_size.width;
  Image img = decode_image(read_file_bytes(path), 3, path);
  std::vector<float> chw(static_cast<size_t>(3 * H * W));
  bool flip = false;
  if (opt_.augment && epoch >= 0) {
    random::Key k = random::fold_in(random::fold_in(random::Key(opt_.seed), uint32_t(epoch)),
                                    static_cast<uint32_t>(index));
    double pair[2];
    uint64_t block = 0;
    int used = 2;
    const std::function<double()> uniform = [&] {
      if (used == 2) random::uniform_block(k, block++, pair), used = 0;
      return pair[used++];
    };
    if (opt_.random_crop) {
      auto [top, left, h, w] =
          random_resized_crop(img.width, img.height, opt_.crop_scale, opt_.crop_ratio, uniform);
      img = resize_like_pillow(crop_image(img, left, top, w, h), W, H, Resample::bilinear);
    }
    flip = uniform() < opt_.flip_prob;
    // (Per pixel, but for contrast's mean over the image: a flip commutes with it.)
    if (opt_.color_jitter.enabled())
      color_jitter(img, draw_color_jitter(opt_.color_jitter, uniform));
    if (opt_.rand_augment.enabled) {
      // Rotations, shears and translations do not commute with the flip: it
      // comes first, as in timm's transforms.
      if (flip) img = pillow::transpose(std::move(img), pillow::kFlipLeftRight), flip = false;
      rand_augment(img, opt_.rand_augment, uniform);
    }
    if (opt_.random_crop) {
      ImageProcessor values_only = proc;  // the processor's rescaling and normalization
      values_only.do_resize = values_only.do_center_crop = false;
      values_only.pixel_values(img, chw.data());
    }
  }
  if (!opt_.augment || epoch < 0 || !opt_.random_crop) {
    const nn::Size2d made = proc.output_size(img.width, img.height);
    if (made != opt_.image_size)
      fail(path, "processes to " + nn::to_string(made) +
                     " pixel values (preprocessor_config.json), but the model takes " +
                     nn::to_string(opt_.image_size));
    proc.pixel_values(img, chw.data());
  }
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) {
        const float v = chw[(c * H + y) * W + (flip ? W - 1 - x : x)];
        if (opt_.layout == nn::Layout::NCHW)
          out[(c * H + y) * W + x] = v;
        else
          out[(y * W + x) * 3 + c] = v;
      }
}

}  // namespace kiln::data
