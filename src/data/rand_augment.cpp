// kiln data: timm's RandAugment (timm/data/auto_augment.py) on Pillow images,
// byte for byte: the lookup-table operations of ImageOps, ImageEnhance's
// blends (data/pillow.h), Pillow's 3x3 SMOOTH filter for Sharpness, and
// Image.transform's affine sampling (Geometry.c's bilinear and bicubic
// filters) for the rotations, shears and translations. Like
// color_jitter.cpp, compiled with -ffp-contract=off (CMakeLists.txt): Pillow's
// baseline x86-64 build rounds every product.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "data/pillow.h"

namespace kiln::data {
namespace {

using Lut = std::array<uint8_t, 256>;

void apply_lut(Image& img, const std::array<Lut, 3>& lut) {
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = lut[i % 3][img.pixels[i]];
}
void apply_lut(Image& img, const Lut& lut) {
  apply_lut(img, {lut, lut, lut});
}

// Image.histogram() of one band.
std::array<int64_t, 256> histogram(const Image& img, int band) {
  std::array<int64_t, 256> h{};
  for (size_t i = band; i < img.pixels.size(); i += 3) ++h[img.pixels[i]];
  return h;
}

Lut identity() {
  Lut l;
  for (int i = 0; i < 256; ++i) l[i] = static_cast<uint8_t>(i);
  return l;
}

// Image.point's lookup table takes ints and clips them to 8 bits.
uint8_t clip8(int64_t v) {
  return static_cast<uint8_t>(std::clamp<int64_t>(v, 0, 255));
}

void autocontrast(Image& img) {
  std::array<Lut, 3> lut;
  for (int b = 0; b < 3; ++b) {
    const auto h = histogram(img, b);
    int lo = 0, hi = 255;
    while (lo < 255 && !h[lo]) ++lo;
    while (hi > 0 && !h[hi]) --hi;
    if (hi <= lo) {
      lut[b] = identity();
      continue;
    }
    const double scale = 255.0 / (hi - lo), offset = -lo * scale;
    for (int i = 0; i < 256; ++i) lut[b][i] = clip8(static_cast<int64_t>(i * scale + offset));
  }
  apply_lut(img, lut);
}

void equalize(Image& img) {
  std::array<Lut, 3> lut;
  for (int b = 0; b < 3; ++b) {
    const auto h = histogram(img, b);
    int64_t total = 0, last = 0, nonzero = 0;
    for (int64_t v : h)
      if (v) total += v, last = v, ++nonzero;
    const int64_t step = nonzero <= 1 ? 0 : (total - last) / 255;
    if (!step) {
      lut[b] = identity();
      continue;
    }
    int64_t n = step / 2;
    for (int i = 0; i < 256; ++i) {
      lut[b][i] = clip8(n / step);
      n += h[i];
    }
  }
  apply_lut(img, lut);
}

// ImageFilter.SMOOTH ((1, 1, 1, 1, 5, 1, 1, 1, 1) / 13) as ImagingFilter3x3
// computes it for RGB: float kernel weights, each row's three products summed
// in order from 0.5 (rounding), clipped and truncated; the border pixels (and
// images under 3x3) kept.
std::vector<uint8_t> smooth(const Image& img) {
  std::vector<uint8_t> out = img.pixels;
  const int64_t w = img.width, h = img.height;
  if (w < 3 || h < 3) return out;
  const float one = 1.0f / 13.0f, five = 5.0f / 13.0f;
  const float k[9] = {one, one, one, one, five, one, one, one, one};
  auto at = [&](int64_t y, int64_t x, int c) {
    return static_cast<float>(img.pixels[(y * w + x) * 3 + c]);
  };
  auto row = [&](int64_t y, int64_t x, int c, const float* kk) {
    return at(y, x - 1, c) * kk[0] + at(y, x, c) * kk[1] + at(y, x + 1, c) * kk[2];
  };
  for (int64_t y = 1; y < h - 1; ++y)
    for (int64_t x = 1; x < w - 1; ++x)
      for (int c = 0; c < 3; ++c) {
        float ss = 0.5f;
        ss += row(y + 1, x, c, k);
        ss += row(y, x, c, k + 3);
        ss += row(y - 1, x, c, k + 6);
        ss = ss < 0.0f ? 0.0f : ss;
        ss = ss > 255.0f ? 255.0f : ss;
        out[(y * w + x) * 3 + c] = static_cast<uint8_t>(ss);
      }
  return out;
}

int floor_int(double v) {
  return v < 0.0 ? static_cast<int>(std::floor(v)) : static_cast<int>(v);
}

// Image.transform(size, AFFINE, a, resample, fillcolor=fill): each output
// pixel's centre mapped by a into the input, sampled there by Geometry.c's
// bilinear or bicubic filter (edges clamped as it clamps them); centres that
// land outside keep the fill colour.
void affine(Image& img, const double a[6], const std::array<uint8_t, 3>& fill, Resample r) {
  const int64_t w = img.width, h = img.height;
  const std::vector<uint8_t>& in = img.pixels;
  std::vector<uint8_t> out(in.size());
  auto px = [&](int64_t y, int64_t x, int c) -> int { return in[(y * w + x) * 3 + c]; };
  auto xclip = [&](int64_t x) { return x < 0 ? 0 : x < w ? x : w - 1; };
  auto yclip = [&](int64_t y) { return y < 0 ? 0 : y < h ? y : h - 1; };
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      uint8_t* o = &out[(y * w + x) * 3];
      const double xo = x + 0.5, yo = y + 0.5;
      double xin = a[0] * xo + a[1] * yo + a[2];
      double yin = a[3] * xo + a[4] * yo + a[5];
      if (xin < 0.0 || xin >= static_cast<double>(w) || yin < 0.0 ||
          yin >= static_cast<double>(h)) {
        std::copy(fill.begin(), fill.end(), o);
        continue;
      }
      xin -= 0.5;
      yin -= 0.5;
      const int64_t fx = floor_int(xin), fy = floor_int(yin);
      const double dx = xin - static_cast<double>(fx), dy = yin - static_cast<double>(fy);
      if (r == Resample::bilinear) {
        const int64_t x0 = xclip(fx), x1 = xclip(fx + 1);
        for (int c = 0; c < 3; ++c) {
          const int64_t y0 = yclip(fy);
          double v1 = px(y0, x0, c) + (px(y0, x1, c) - px(y0, x0, c)) * dx, v2 = v1;
          if (fy + 1 >= 0 && fy + 1 < h)
            v2 = px(fy + 1, x0, c) + (px(fy + 1, x1, c) - px(fy + 1, x0, c)) * dx;
          v1 = v1 + (v2 - v1) * dy;
          o[c] = static_cast<uint8_t>(v1);
        }
        continue;
      }
      // Bicubic (Pillow's a = -1 cubic, Geometry.c's BICUBIC).
      auto cubic = [](double v1, double v2, double v3, double v4, double d) {
        const double p1 = v2, p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
        return p1 + d * (p2 + d * (p3 + d * p4));
      };
      const int64_t bx = fx - 1, by = fy - 1;
      const int64_t xs[4] = {xclip(bx), xclip(bx + 1), xclip(bx + 2), xclip(bx + 3)};
      for (int c = 0; c < 3; ++c) {
        auto line = [&](int64_t yy) {
          // (Pillow's first pass is integer arithmetic on the bytes: the same
          // values in double, exactly.)
          return cubic(px(yy, xs[0], c), px(yy, xs[1], c), px(yy, xs[2], c), px(yy, xs[3], c), dx);
        };
        const double v1 = line(yclip(by));
        const double v2 = by + 1 >= 0 && by + 1 < h ? line(by + 1) : v1;
        const double v3 = by + 2 >= 0 && by + 2 < h ? line(by + 2) : v2;
        const double v4 = by + 3 >= 0 && by + 3 < h ? line(by + 3) : v3;
        const double v = cubic(v1, v2, v3, v4, dy);
        o[c] = v <= 0.0 ? 0 : v >= 255.0 ? 255 : static_cast<uint8_t>(v);
      }
    }
  img.pixels = std::move(out);
}

// Python's round(v, 15).
double round15(double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%.15f", v);
  return std::strtod(text, nullptr);
}

// Image.rotate(degrees, resample, fillcolor=fill) without expand: the
// angle taken modulo 360 as Python's % does, 0 copied, 180 (and 90 and 270
// of a square) transposed, else the inverse
// rotation about the centre with its sines and cosines rounded to 15
// decimals, as Image.rotate builds it.
void rotate(Image& img, double degrees, const std::array<uint8_t, 3>& fill, Resample r) {
  double angle = std::fmod(degrees, 360.0);
  if (angle != 0 && angle < 0) angle += 360.0;
  if (angle == 0) return;
  // Image.rotate's fast paths: Transpose for 180, and for 90 and 270 of a square.
  if (angle == 180 || ((angle == 90 || angle == 270) && img.width == img.height)) {
    img = pillow::transpose(std::move(img), angle == 180  ? pillow::kRotate180
                                            : angle == 90 ? pillow::kRotate90
                                                          : pillow::kRotate270);
    return;
  }
  const double rad = -(angle * (M_PI / 180.0));
  const double cx = static_cast<double>(img.width) / 2, cy = static_cast<double>(img.height) / 2;
  double m[6] = {round15(std::cos(rad)),  round15(std::sin(rad)), 0.0,
                 round15(-std::sin(rad)), round15(std::cos(rad)), 0.0};
  const double x = -cx - 0, y = -cy - 0;
  const double c = m[0] * x + m[1] * y + m[2], f = m[3] * x + m[4] * y + m[5];
  m[2] = c + cx;
  m[5] = f + cy;
  affine(img, m, fill, r);
}

}  // namespace

const char* augment_op_name(AugmentOp op) {
  static const char* const names[kAugmentOps] = {
      "AutoContrast", "Equalize",    "Invert", "Rotate",        "Posterize",
      "Solarize",     "SolarizeAdd", "Color",  "Contrast",      "Brightness",
      "Sharpness",    "ShearX",      "ShearY", "TranslateXRel", "TranslateYRel"};
  const int i = static_cast<int>(op);
  return i >= 0 && i < kAugmentOps ? names[i] : "unknown";
}

bool augment_op_negates(AugmentOp op, bool increasing) {
  switch (op) {
    case AugmentOp::Rotate:
    case AugmentOp::ShearX:
    case AugmentOp::ShearY:
    case AugmentOp::TranslateXRel:
    case AugmentOp::TranslateYRel: return true;
    case AugmentOp::Color:
    case AugmentOp::Contrast:
    case AugmentOp::Brightness:
    case AugmentOp::Sharpness: return increasing;
    default: return false;
  }
}

double augment_level_to_arg(AugmentOp op, double level, bool increasing, bool negate) {
  const double sign = negate && augment_op_negates(op, increasing) ? -1.0 : 1.0;
  const double l = level / 10.0;
  switch (op) {
    case AugmentOp::Rotate: return sign * (l * 30.0);
    case AugmentOp::Posterize: {
      const double bits = static_cast<double>(static_cast<int64_t>(l * 4));
      return increasing ? 4 - bits : bits;
    }
    case AugmentOp::Solarize: {
      const double t = std::min(256.0, static_cast<double>(static_cast<int64_t>(l * 256)));
      return increasing ? 256 - t : t;
    }
    case AugmentOp::SolarizeAdd:
      return std::min(128.0, static_cast<double>(static_cast<int64_t>(l * 110)));
    case AugmentOp::Color:
    case AugmentOp::Contrast:
    case AugmentOp::Brightness:
    case AugmentOp::Sharpness:
      return increasing ? std::max(0.1, 1.0 + sign * (l * 0.9)) : l * 1.8 + 0.1;
    case AugmentOp::ShearX:
    case AugmentOp::ShearY: return sign * (l * 0.3);
    case AugmentOp::TranslateXRel:
    case AugmentOp::TranslateYRel: return sign * (l * 0.45);
    default: return 0;
  }
}

void augment_op(Image& img, AugmentOp op, double arg, const std::array<uint8_t, 3>& fill,
                Resample resample) {
  if (img.channels != 3)
    fail("RandAugment", "takes RGB images, got " + std::to_string(img.channels) + " channels");
  if (resample != Resample::bilinear && resample != Resample::bicubic)
    fail("RandAugment",
         "resamples bilinear or bicubic, got filter " + std::to_string(static_cast<int>(resample)));
  Lut lut;
  switch (op) {
    case AugmentOp::AutoContrast: autocontrast(img); return;
    case AugmentOp::Equalize: equalize(img); return;
    case AugmentOp::Invert:
      for (uint8_t& v : img.pixels) v = static_cast<uint8_t>(255 - v);
      return;
    case AugmentOp::Posterize: {
      const auto bits = static_cast<int64_t>(arg);
      if (bits >= 8) return;
      const int mask = bits <= 0 ? 0 : ~((1 << (8 - bits)) - 1) & 0xff;
      for (int i = 0; i < 256; ++i) lut[i] = static_cast<uint8_t>(i & mask);
      apply_lut(img, lut);
      return;
    }
    case AugmentOp::Solarize:
      for (int i = 0; i < 256; ++i) lut[i] = static_cast<uint8_t>(i < arg ? i : 255 - i);
      apply_lut(img, lut);
      return;
    case AugmentOp::SolarizeAdd: {
      const auto add = static_cast<int64_t>(arg);
      for (int i = 0; i < 256; ++i) lut[i] = i < 128 ? clip8(i + add) : static_cast<uint8_t>(i);
      apply_lut(img, lut);
      return;
    }
    case AugmentOp::Color: pillow::color(img, arg); return;
    case AugmentOp::Contrast: pillow::contrast(img, arg); return;
    case AugmentOp::Brightness: pillow::brightness(img, arg); return;
    case AugmentOp::Sharpness: pillow::blend(smooth(img), img.pixels, arg); return;
    case AugmentOp::Rotate: rotate(img, arg, fill, resample); return;
    case AugmentOp::ShearX: {
      const double m[6] = {1, arg, 0, 0, 1, 0};
      affine(img, m, fill, resample);
      return;
    }
    case AugmentOp::ShearY: {
      const double m[6] = {1, 0, 0, arg, 1, 0};
      affine(img, m, fill, resample);
      return;
    }
    case AugmentOp::TranslateXRel: {
      const double m[6] = {1, 0, arg * static_cast<double>(img.width), 0, 1, 0};
      affine(img, m, fill, resample);
      return;
    }
    case AugmentOp::TranslateYRel: {
      const double m[6] = {1, 0, 0, 0, 1, arg * static_cast<double>(img.height)};
      affine(img, m, fill, resample);
      return;
    }
  }
  fail("RandAugment", "unknown operation " + std::to_string(static_cast<int>(op)));
}

RandAugmentOptions RandAugmentOptions::parse(const std::string& config, const std::string& flag) {
  RandAugmentOptions o;
  o.enabled = true;
  auto bad = [&](const std::string& what) { fail(flag, "'" + config + "': " + what); };
  std::vector<std::string> sections;
  for (size_t start = 0;;) {
    const size_t dash = config.find('-', start);
    sections.push_back(config.substr(start, dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  if (sections[0] != "rand")
    bad("expected timm's RandAugment config, \"rand\" then sections such as m9, n2, mstd0.5 "
        "(e.g. rand-m9-mstd0.5)");
  for (size_t i = 1; i < sections.size(); ++i) {
    const std::string& s = sections[i];
    const size_t digit = s.find_first_of("0123456789");
    const std::string key = s.substr(0, digit);
    const std::string val = digit == std::string::npos ? "" : s.substr(digit);
    if (!s.empty() && s[0] == 't')
      bad("section '" + s + "': named or weighted transform sets are not supported");
    if (val.empty() ||
        (key != "m" && key != "n" && key != "p" && key != "mstd" && key != "mmax" && key != "inc"))
      bad("section '" + s +
          "': expected m<int>, n<int>, p<float>, mstd<float>, mmax<int> or "
          "inc<0|1>");
    const bool integral = key == "m" || key == "n" || key == "mmax" || key == "inc";
    char* end = nullptr;
    errno = 0;
    // Integers past a million are out of every range below (and stay exact).
    const double v = integral ? static_cast<double>(std::clamp<long long>(
                                    std::strtoll(val.c_str(), &end, 10), -1000000, 1000000))
                              : std::strtod(val.c_str(), &end);
    if (end != val.c_str() + val.size() || !std::isfinite(v) || errno == ERANGE)
      bad("section '" + s + "': '" + val + "' is not " +
          (integral ? "an integer" : "a number") + " in range");
    if (key == "m") o.magnitude = v;
    if (key == "n") o.num_layers = static_cast<int64_t>(v);
    if (key == "p") o.prob = v;
    if (key == "mstd") o.magnitude_std = v > 100 ? INFINITY : v;
    if (key == "mmax") o.magnitude_max = v;
    if (key == "inc") {
      if (v != 0 && v != 1) bad("section '" + s + "': expected inc0 or inc1");
      o.increasing = v == 1;
    }
  }
  o.validate(flag);
  return o;
}

void RandAugmentOptions::validate(const std::string& flag) const {
  if (!enabled) return;
  auto bad = [&](const std::string& what) { fail(flag, what); };
  if (num_layers < 0 || num_layers > 100)
    bad("n " + std::to_string(num_layers) + ": expected 0 to 100 operations per image");
  if (!(prob >= 0 && prob <= 1)) bad("p " + std::to_string(prob) + ": expected 0 to 1");
  if (!(magnitude_max > 0 && magnitude_max <= 1000))
    bad("mmax " + std::to_string(magnitude_max) + ": expected 1 to 1000");
  if (!(magnitude >= 0 && magnitude <= 1000))
    bad("m " + std::to_string(magnitude) + ": expected 0 to 1000");
  if (!(magnitude_std >= 0)) bad("mstd " + std::to_string(magnitude_std) + ": expected >= 0");
  if (resample != Resample::bilinear && resample != Resample::bicubic)
    bad("the geometric operations resample bilinear or bicubic");
}

void rand_augment(Image& img, const RandAugmentOptions& o, const std::function<double()>& uniform) {
  if (!o.enabled) return;
  std::vector<AugmentOp> ops;
  for (int64_t i = 0; i < o.num_layers; ++i)
    ops.push_back(static_cast<AugmentOp>(
        std::min(kAugmentOps - 1, static_cast<int>(uniform() * kAugmentOps))));
  for (AugmentOp op : ops) {
    if (o.prob < 1.0 && uniform() > o.prob) continue;
    double m = o.magnitude;
    if (std::isinf(o.magnitude_std)) {
      m = o.magnitude * uniform();
    } else if (o.magnitude_std > 0) {
      const double u1 = uniform(), u2 = uniform();
      m = o.magnitude +
          o.magnitude_std * std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * M_PI * u2);
    }
    m = std::max(0.0, std::min(m, o.magnitude_max));
    const bool negate = augment_op_negates(op, o.increasing) && uniform() > 0.5;
    augment_op(img, op, augment_level_to_arg(op, m, o.increasing, negate), o.fill, o.resample);
  }
}

}  // namespace kiln::data
