// kiln data: torchvision's ColorJitter on Pillow images, byte for byte, and
// the ImageEnhance adjustments it shares with RandAugment (data/pillow.h).
// Pillow's arithmetic is reproduced with its own types: Image.blend in
// float32 with truncation, the HSV conversions in float and double as its
// Convert.c writes them. This file is compiled with -ffp-contract=off
// (CMakeLists.txt): a fused multiply-add, which Pillow's baseline x86-64
// build never uses, would round differently.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "data/pillow.h"

namespace kiln::data {
namespace {

uint8_t clip8(int v) {
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
}

}  // namespace

namespace pillow {

// ITU-R 601-2 luma as Pillow's "L" conversion computes it (16-bit fixed point).
uint8_t luma(const uint8_t* rgb) {
  return static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

// Image.blend(degenerate, img, alpha): alpha is a C float; 0 and 1 copy.
void blend(const std::vector<uint8_t>& degenerate, std::vector<uint8_t>& img, double factor) {
  const float alpha = static_cast<float>(factor);
  if (alpha == 1.0f) return;
  if (alpha == 0.0f) {
    img = degenerate;
    return;
  }
  const bool inside = alpha >= 0 && alpha <= 1.0f;
  for (size_t i = 0; i < img.size(); ++i) {
    const int a = degenerate[i], b = img[i];
    // int + float * int, in float: the product rounded, then the sum.
    const float product = alpha * static_cast<float>(b - a);
    const float v = static_cast<float>(a) + product;
    if (inside) {
      img[i] = static_cast<uint8_t>(v);
    } else {
      img[i] = v <= 0.0f ? 0 : v >= 255.0f ? 255 : static_cast<uint8_t>(v);
    }
  }
}

void brightness(Image& img, double factor) {
  blend(std::vector<uint8_t>(img.pixels.size(), 0), img.pixels, factor);
}

void contrast(Image& img, double factor) {
  // ImageStat's mean of the "L" image, rounded: int(mean + 0.5).
  const int64_t n = img.width * img.height;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += luma(&img.pixels[3 * i]);
  const auto mean = static_cast<uint8_t>(static_cast<int>(sum / static_cast<double>(n) + 0.5));
  blend(std::vector<uint8_t>(img.pixels.size(), mean), img.pixels, factor);
}

void color(Image& img, double factor) {
  std::vector<uint8_t> grey(img.pixels.size());
  for (size_t i = 0; i < grey.size(); i += 3)
    grey[i] = grey[i + 1] = grey[i + 2] = luma(&img.pixels[i]);
  blend(grey, img.pixels, factor);
}

}  // namespace pillow

namespace {

void to_hsv(const uint8_t* in, uint8_t* out) {
  const uint8_t r = in[0], g = in[1], b = in[2];
  const uint8_t maxc = std::max(r, std::max(g, b)), minc = std::min(r, std::min(g, b));
  out[2] = maxc;
  if (minc == maxc) {
    out[0] = out[1] = 0;
    return;
  }
  const float cr = static_cast<float>(maxc - minc);
  const float s = cr / static_cast<float>(maxc);
  const float rc = static_cast<float>(maxc - r) / cr, gc = static_cast<float>(maxc - g) / cr,
              bc = static_cast<float>(maxc - b) / cr;
  float h;
  if (r == maxc) {
    h = bc - gc;
  } else if (g == maxc) {
    h = static_cast<float>(2.0 + rc - bc);
  } else {
    h = static_cast<float>(4.0 + gc - rc);
  }
  h = static_cast<float>(std::fmod(h / 6.0 + 1.0, 1.0));
  out[0] = clip8(static_cast<int>(h * 255.0));
  out[1] = clip8(static_cast<int>(s * 255.0));
}

void from_hsv(const uint8_t* in, uint8_t* out) {
  const uint8_t h = in[0], s = in[1], v = in[2];
  if (s == 0) {
    out[0] = out[1] = out[2] = v;
    return;
  }
  const int i = static_cast<int>(std::floor(static_cast<float>(h) * 6.0 / 255.0));
  const float f = static_cast<float>(static_cast<float>(h) * 6.0 / 255.0 - static_cast<float>(i));
  const float fs = static_cast<float>(static_cast<float>(s) / 255.0);
  const uint8_t p = clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs))));
  const uint8_t q = clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs * f))));
  const double fs1f = fs * (1.0 - f);
  const uint8_t t = clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs1f))));
  const uint8_t rgb[6][3] = {{v, t, p}, {q, v, p}, {p, v, t}, {p, q, v}, {t, p, v}, {v, p, q}};
  for (int c = 0; c < 3; ++c) out[c] = rgb[i % 6][c];
}

void hue(Image& img, double factor) {
  // numpy: uint8(int8(factor * 255)), the int8 truncating toward zero.
  const auto shift = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(factor * 255)));
  for (size_t i = 0; i < img.pixels.size(); i += 3) {
    uint8_t hsv[3];
    to_hsv(&img.pixels[i], hsv);
    hsv[0] = static_cast<uint8_t>(hsv[0] + shift);
    from_hsv(hsv, &img.pixels[i]);
  }
}

}  // namespace

void ColorJitterOptions::validate() const {
  for (double v : {brightness, contrast, saturation})
    if (!(v >= 0 && std::isfinite(v)))
      fail("train", "--color-jitter " + std::to_string(v) + ": expected >= 0");
  if (!(hue >= 0 && hue <= 0.5))
    fail("train", "--color-jitter's hue " + std::to_string(hue) + ": expected 0 to 0.5");
}

ColorJitterParams draw_color_jitter(const ColorJitterOptions& opt,
                                    const std::function<double()>& uniform) {
  ColorJitterParams p;
  for (int i = 3; i > 0; --i) {  // Fisher-Yates: each order equally likely
    const int j = std::min(i, static_cast<int>(uniform() * (i + 1)));
    std::swap(p.order[i], p.order[j]);
  }
  auto factor = [&](double x) {
    const double lo = std::max(0.0, 1.0 - x), hi = 1.0 + x;
    return lo + (hi - lo) * uniform();
  };
  if (opt.brightness > 0) p.brightness = factor(opt.brightness);
  if (opt.contrast > 0) p.contrast = factor(opt.contrast);
  if (opt.saturation > 0) p.saturation = factor(opt.saturation);
  if (opt.hue > 0) p.hue = -opt.hue + 2 * opt.hue * uniform();
  return p;
}

void color_jitter(Image& img, const ColorJitterParams& p) {
  if (img.channels != 3)
    fail("color jitter", "takes RGB images, got " + std::to_string(img.channels) + " channels");
  for (int which : p.order) {
    switch (which) {
      case 0: pillow::brightness(img, p.brightness); break;
      case 1: pillow::contrast(img, p.contrast); break;
      case 2: pillow::color(img, p.saturation); break;
      default: hue(img, p.hue); break;
    }
  }
}

}  // namespace kiln::data
