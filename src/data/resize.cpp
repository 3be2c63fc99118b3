// kiln data: resizing 8-bit images exactly as Pillow does (Image.resize), so
// that pixel values equal those of transformers' Pillow-backed image
// processors. Pillow's src/libImaging/Resample.c and Geometry.c are the
// specification; this is an independent implementation of the same
// arithmetic.
#include <cmath>

#include "kiln/data.h"

namespace kiln::data {
namespace {

// 8 bits of result, 2 for the filters' negative lobes and overshoot.
constexpr int kPrecisionBits = 32 - 8 - 2;

struct Filter {
  double (*weight)(double x);
  double support;
};

double box_weight(double x) {
  return x > -0.5 && x <= 0.5 ? 1.0 : 0.0;
}
double bilinear_weight(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}
double hamming_weight(double x) {
  x = std::abs(x);
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x *= M_PI;
  // Pillow writes the window's constants as floats.
  return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));
}
double bicubic_weight(double x) {
  const double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}
double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}
double lanczos_weight(double x) {
  return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3) : 0.0;
}

Filter filter_of(Resample r) {
  switch (r) {
    case Resample::box: return {box_weight, 0.5};
    case Resample::bilinear: return {bilinear_weight, 1.0};
    case Resample::hamming: return {hamming_weight, 1.0};
    case Resample::bicubic: return {bicubic_weight, 2.0};
    case Resample::lanczos: return {lanczos_weight, 3.0};
    case Resample::nearest: break;
  }
  fail("resize", "no convolution filter for NEAREST");
}

// For each output index along one axis: the first input index, the number of
// inputs, and their fixed-point weights (ksize per output).
struct Taps {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weight;
};

Taps taps(int in_size, int out_size, const Filter& f) {
  const double scale = static_cast<double>(static_cast<float>(in_size)) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = f.support * filterscale;
  Taps t;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.weight.assign(static_cast<size_t>(out_size) * t.ksize, 0);
  std::vector<double> k(t.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[x] = f.weight((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    for (int x = 0; x < xmax; ++x) {
      if (ww != 0.0) k[x] /= ww;
      // Round half away from zero into fixed point.
      const double v = k[x] * (1 << kPrecisionBits);
      t.weight[static_cast<size_t>(xx) * t.ksize + x] = static_cast<int32_t>(v < 0 ? v - 0.5 : v + 0.5);
    }
    t.first[xx] = xmin;
    t.count[xx] = xmax;
  }
  return t;
}

uint8_t clip8(int v) {
  const int s = v >> kPrecisionBits;  // arithmetic: floor
  return static_cast<uint8_t>(s < 0 ? 0 : s > 255 ? 255 : s);
}

// One pass along x (horizontal) or y over `in` (w x h x c); the other axis
// starts at `offset` of the input (the rows or columns the next pass reads).
Image pass(const Image& in, const Taps& t, bool horizontal, int offset, int out_w, int out_h) {
  const int64_t c = in.channels;
  Image out{out_w, out_h, c, std::vector<uint8_t>(static_cast<size_t>(out_w) * out_h * c)};
  for (int yy = 0; yy < out_h; ++yy)
    for (int xx = 0; xx < out_w; ++xx) {
      const int o = horizontal ? xx : yy;
      const int32_t* k = &t.weight[static_cast<size_t>(o) * t.ksize];
      for (int64_t ch = 0; ch < c; ++ch) {
        int ss = 1 << (kPrecisionBits - 1);
        for (int i = 0; i < t.count[o]; ++i) {
          const int64_t x = horizontal ? t.first[o] + i : xx + offset;
          const int64_t y = horizontal ? yy + offset : t.first[o] + i;
          ss += static_cast<int>(in.pixels[(y * in.width + x) * c + ch]) * k[i];
        }
        out.pixels[(static_cast<size_t>(yy) * out_w + xx) * c + ch] = clip8(ss);
      }
    }
  return out;
}

// NEAREST: Pillow's affine scaling, positions accumulated step by step in double.
Image nearest(const Image& in, int64_t out_w, int64_t out_h) {
  const double ax = static_cast<double>(static_cast<float>(in.width)) / out_w;
  const double ay = static_cast<double>(static_cast<float>(in.height)) / out_h;
  auto coord = [](double v) { return v < 0.0 ? -1 : static_cast<int64_t>(v); };
  std::vector<int64_t> xs(out_w);
  double xo = ax * 0.5;
  for (int64_t x = 0; x < out_w; ++x, xo += ax) xs[x] = std::min(coord(xo), in.width - 1);
  const int64_t c = in.channels;
  Image out{out_w, out_h, c, std::vector<uint8_t>(static_cast<size_t>(out_w) * out_h * c)};
  double yo = ay * 0.5;
  for (int64_t y = 0; y < out_h; ++y, yo += ay) {
    const int64_t yi = std::min(coord(yo), in.height - 1);
    for (int64_t x = 0; x < out_w; ++x)
      for (int64_t ch = 0; ch < c; ++ch)
        out.pixels[(y * out_w + x) * c + ch] = in.pixels[(yi * in.width + xs[x]) * c + ch];
  }
  return out;
}

}  // namespace

Image resize_like_pillow(const Image& in, int64_t width, int64_t height, Resample filter) {
  if (in.channels != 1 && in.channels != 3)
    fail("resize", "images of 1 or 3 channels, got " + std::to_string(in.channels));
  if (in.width <= 0 || in.height <= 0 || width <= 0 || height <= 0 || width > (1 << 20) ||
      height > (1 << 20))
    fail("resize", std::to_string(in.width) + "x" + std::to_string(in.height) + " to " +
                       std::to_string(width) + "x" + std::to_string(height) +
                       ": sizes must be positive (and at most 2^20)");
  if (width == in.width && height == in.height) return in;  // Image.resize returns a copy
  if (filter == Resample::nearest) return nearest(in, width, height);
  const Filter f = filter_of(filter);
  const int w = static_cast<int>(in.width), h = static_cast<int>(in.height);
  const int ow = static_cast<int>(width), oh = static_cast<int>(height);
  Taps th = taps(w, ow, f), tv = taps(h, oh, f);
  // Pillow 13 starts with the vertical pass when the height shrinks by more
  // than twice what the width does (it reads fewer rows); the first pass
  // computes only the rows (or columns) that the second one reads.
  if (oh < h && 2 * (w - ow) < h - oh) {
    const int first = th.first[0], last = th.first[ow - 1] + th.count[ow - 1];
    Image cur = oh != h ? pass(in, tv, false, first, last - first, oh) : in;
    if (ow == w) return cur;
    if (oh != h)
      for (auto& c : th.first) c -= first;
    return pass(cur, th, true, 0, ow, oh);
  }
  const int first = tv.first[0], last = tv.first[oh - 1] + tv.count[oh - 1];
  Image cur = ow != w ? pass(in, th, true, first, ow, last - first) : in;
  if (oh == h) return cur;
  if (ow != w)
    for (auto& r : tv.first) r -= first;
  return pass(cur, tv, false, 0, ow, oh);
}

}  // namespace kiln::data
