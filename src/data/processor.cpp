// kiln data: transformers' ViTImageProcessor (Pillow backend), float for float.
#include <cmath>

#include "kiln/data.h"

namespace kiln::data {

nn::Size2d ImageProcessor::output_size(int64_t width, int64_t height) const {
  nn::Size2d s{height, width};
  if (do_resize) {
    if (shortest_edge > 0 && longest_edge > 0) {
      // transformers' get_size_with_aspect_ratio((h, w), shortest_edge, longest_edge)
      int64_t size = shortest_edge;
      const double lo = static_cast<double>(std::min(height, width)),
                   hi = static_cast<double>(std::max(height, width));
      double raw = 0;
      bool capped = false;
      if (hi / lo * static_cast<double>(size) > static_cast<double>(longest_edge)) {
        raw = static_cast<double>(longest_edge) * lo / hi;
        size = static_cast<int64_t>(std::nearbyint(raw));  // Python's round: half to even
        capped = true;
      }
      const double base = capped ? raw : static_cast<double>(size);
      if ((height <= width && height == size) || (width <= height && width == size))
        s = {height, width};
      else if (width < height)
        s = {static_cast<int64_t>(base * static_cast<double>(height) / static_cast<double>(width)),
             size};
      else
        s = {size,
             static_cast<int64_t>(base * static_cast<double>(width) / static_cast<double>(height))};
    } else if (shortest_edge > 0) {
      // get_resize_output_image_size(size=shortest_edge, default_to_square=False)
      const int64_t lo = std::min(width, height), hi = std::max(width, height);
      const auto longer =
          static_cast<int64_t>(static_cast<double>(shortest_edge * hi) / static_cast<double>(lo));
      s = width <= height ? nn::Size2d{longer, shortest_edge} : nn::Size2d{shortest_edge, longer};
    } else {
      s = size;
    }
  }
  if (do_center_crop) s = crop_size;
  // Pillow's limit for decompression bombs, for what the resize would make.
  if (s.height <= 0 || s.width <= 0 || s.height > 178956970 / s.width)
    fail("image processor", "would make a " + std::to_string(s.width) + "x" +
                                std::to_string(s.height) + " image from one of " +
                                std::to_string(width) + "x" + std::to_string(height) +
                                ", expected at most 178956970 pixels");
  return s;
}

void ImageProcessor::validate(const std::string& origin) const {
  auto bad = [&](const std::string& field, const std::string& what) {
    fail(origin, "field '" + field + "' " + what);
  };
  if (size.height <= 0 || size.width <= 0)
    bad("size", "is " + nn::to_string(size) + ", expected positive");
  if (shortest_edge < 0)
    bad("size.shortest_edge", "is " + std::to_string(shortest_edge) + ", expected positive");
  if (longest_edge < 0 || (longest_edge > 0 && shortest_edge == 0))
    bad("size.longest_edge",
        "is " + std::to_string(longest_edge) + ", expected a positive value beside shortest_edge");
  if (crop_size.height <= 0 || crop_size.width <= 0)
    bad("crop_size", "is " + nn::to_string(crop_size) + ", expected positive");
  if (static_cast<int>(resample) < 0 || static_cast<int>(resample) > 5)
    bad("resample",
        "is " + std::to_string(static_cast<int>(resample)) + ", expected 0-5 (PIL's filters)");
  if (!std::isfinite(rescale_factor)) bad("rescale_factor", "is not a finite number");
  if (image_mean.size() != 3)
    bad("image_mean", "has " + std::to_string(image_mean.size()) + " values, expected 3 (RGB)");
  if (image_std.size() != 3)
    bad("image_std", "has " + std::to_string(image_std.size()) + " values, expected 3 (RGB)");
  for (double v : image_std)
    if (v == 0 || !std::isfinite(v))
      bad("image_std", "holds " + std::to_string(v) + ", expected nonzero finite values");
  for (double v : image_mean)
    if (!std::isfinite(v)) bad("image_mean", "holds a value that is not finite");
}

void ImageProcessor::pixel_values(const Image& rgb, float* out) const {
  if (rgb.channels != 3 && rgb.channels != 1)
    fail("image processor",
         "expects an RGB or a greyscale image, got " + std::to_string(rgb.channels) + " channels");
  const int C = static_cast<int>(rgb.channels);
  Image resized;
  const Image* img = &rgb;
  nn::Size2d r{rgb.height, rgb.width};
  if (do_resize) {
    ImageProcessor plain = *this;
    plain.do_center_crop = false;
    r = plain.output_size(rgb.width, rgb.height);
    resized = resize_like_pillow(rgb, r.width, r.height, resample);
    img = &resized;
  }
  const nn::Size2d o = do_center_crop ? crop_size : r;
  // numpy's center_crop: top = (h - crop_h) // 2 (floor), zeros outside the image.
  auto floor_half = [](int64_t v) { return v >= 0 ? v / 2 : -((1 - v) / 2); };
  const int64_t top = do_center_crop ? floor_half(r.height - o.height) : 0;
  const int64_t left = do_center_crop ? floor_half(r.width - o.width) : 0;
  float mean[3], std_[3];
  for (int c = 0; c < 3; ++c)
    mean[c] = static_cast<float>(image_mean[c]), std_[c] = static_cast<float>(image_std[c]);
  const size_t plane = static_cast<size_t>(o.height * o.width);
  for (int64_t y = 0; y < o.height; ++y)
    for (int64_t x = 0; x < o.width; ++x) {
      const int64_t sy = y + top, sx = x + left;
      const bool inside = sy >= 0 && sy < img->height && sx >= 0 && sx < img->width;
      for (int c = 0; c < C; ++c) {
        const uint8_t u = inside ? img->pixels[(sy * img->width + sx) * C + c] : 0;
        float v = do_rescale ? static_cast<float>(static_cast<double>(u) * rescale_factor)
                             : static_cast<float>(u);
        if (do_normalize) v = (v - mean[c]) / std_[c];
        out[c * plane + y * o.width + x] = v;
      }
    }
}

}  // namespace kiln::data
