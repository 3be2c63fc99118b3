// kiln data: mixup and cutmix of a batch, as timm's Mixup (mode "batch")
// computes them, with its draws made from a Threefry key.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/data.h"

namespace kiln::data {
namespace {

// A uniform double in [0, 1) from draw `n` of `key`: 53 bits of one
// Threefry block.
double uniform01(const random::Key& key, uint32_t n) {
  const uint32_t in[2] = {n, 0x6d69u};  // "mi"
  uint32_t out[2];
  random::threefry2x32(key.k, in, out);
  const uint64_t bits = (static_cast<uint64_t>(out[0]) << 21) ^ (out[1] >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1p-53;
}

// A standard normal by Box and Muller from draws n and n + 1.
double normal01(const random::Key& key, uint32_t n) {
  const double u = 1.0 - uniform01(key, n), v = uniform01(key, n + 1);
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
}

// Gamma(a, 1) by Marsaglia and Tsang (2000); a < 1 through Gamma(a + 1)·U^(1/a).
double gamma_draw(const random::Key& key, double a) {
  if (a < 1) {
    const double u = uniform01(random::fold_in(key, 1), 0);
    return gamma_draw(random::fold_in(key, 2), a + 1) * std::pow(u, 1.0 / a);
  }
  const double d = a - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (uint32_t n = 0;; n += 3) {
    const double x = normal01(key, n);
    double v = 1.0 + c * x;
    if (v <= 0) continue;
    v = v * v * v;
    const double u = uniform01(key, n + 2);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

}  // namespace

void MixupOptions::validate() const {
  if (!(mixup_alpha >= 0)) fail("train", "--mixup " + std::to_string(mixup_alpha) + ", expected >= 0");
  if (!(cutmix_alpha >= 0))
    fail("train", "--cutmix " + std::to_string(cutmix_alpha) + ", expected >= 0");
  if (!(prob >= 0 && prob <= 1))
    fail("train", "--mixup-prob " + std::to_string(prob) + ", expected 0 to 1");
  if (!(switch_prob >= 0 && switch_prob <= 1))
    fail("train", "--mixup-switch-prob " + std::to_string(switch_prob) + ", expected 0 to 1");
}

double beta_draw(const random::Key& key, double a, double b) {
  if (!(a > 0 && b > 0)) fail("random.beta", "a and b must be positive");
  const double x = gamma_draw(random::fold_in(key, 0), a);
  const double y = gamma_draw(random::fold_in(key, 1), b);
  return x / (x + y);
}

int64_t randint_draw(const random::Key& key, int64_t low, int64_t high) {
  if (high <= low) fail("random.randint", "high must be above low");
  const uint64_t span = static_cast<uint64_t>(high - low);
  // Rejection of the top partial range keeps every value equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  for (uint32_t n = 0;; ++n) {
    const uint32_t in[2] = {n, 0x7269u};  // "ri"
    uint32_t out[2];
    random::threefry2x32(key.k, in, out);
    const uint64_t v = (static_cast<uint64_t>(out[0]) << 32) | out[1];
    if (v < limit) return low + static_cast<int64_t>(v % span);
  }
}

MixParams draw_mix(const MixupOptions& opt, const random::Key& key, int64_t height, int64_t width) {
  MixParams m;
  if (!opt.enabled() || !(uniform01(key, 0) < opt.prob)) return m;
  const random::Key lam_key = random::fold_in(key, 1);
  if (opt.mixup_alpha > 0 && opt.cutmix_alpha > 0) {
    m.cutmix = uniform01(key, 1) < opt.switch_prob;
    const double alpha = m.cutmix ? opt.cutmix_alpha : opt.mixup_alpha;
    m.lam = beta_draw(lam_key, alpha, alpha);
  } else if (opt.mixup_alpha > 0) {
    m.lam = beta_draw(lam_key, opt.mixup_alpha, opt.mixup_alpha);
  } else {
    m.cutmix = true;
    m.lam = beta_draw(lam_key, opt.cutmix_alpha, opt.cutmix_alpha);
  }
  if (m.lam == 1.0 || !m.cutmix) return m;
  // rand_bbox: a box of √(1-λ) of each side around a uniform centre, clipped.
  const double ratio = std::sqrt(1.0 - m.lam);
  const int64_t cut_h = static_cast<int64_t>(static_cast<double>(height) * ratio);
  const int64_t cut_w = static_cast<int64_t>(static_cast<double>(width) * ratio);
  const int64_t cy = randint_draw(random::fold_in(key, 2), 0, height);
  const int64_t cx = randint_draw(random::fold_in(key, 3), 0, width);
  m.y0 = std::clamp<int64_t>(cy - cut_h / 2, 0, height);
  m.y1 = std::clamp<int64_t>(cy + (cut_h + 1) / 2, 0, height);
  m.x0 = std::clamp<int64_t>(cx - cut_w / 2, 0, width);
  m.x1 = std::clamp<int64_t>(cx + (cut_w + 1) / 2, 0, width);
  m.lam = 1.0 - static_cast<double>((m.y1 - m.y0) * (m.x1 - m.x0)) /
                    static_cast<double>(height * width);
  return m;
}

std::pair<Array, Array> mix_batch(const Array& images, const Array& labels, const MixParams& mix,
                                  int64_t num_classes, double label_smoothing, bool channels_last) {
  if (images.ndim() != 4 || images.dtype() != DType::f32)
    fail("mixup", "images " + std::string(name_of(images.dtype())) + " " + str(images.shape()) +
                      ", expected f32 [batch, channels, height, width] (or channels last)");
  const int64_t b = images.shape()[0];
  if (b % 2 != 0)
    fail("mixup", "a batch of " + std::to_string(b) +
                      " images, expected an even number (each is mixed with its mirror in the batch)");
  if (!is_integral(labels.dtype()) || labels.shape() != Shape{b})
    fail("mixup", "labels " + std::string(name_of(labels.dtype())) + " " + str(labels.shape()) +
                      ", expected integer classes [" + std::to_string(b) + "]");
  if (num_classes < 1) fail("mixup", "needs classes (num_labels >= 1)");
  const std::vector<int64_t> y = astype(labels, DType::i64).to_vector<int64_t>();
  for (int64_t c : y)
    if (c < 0 || c >= num_classes)
      fail("mixup", "label " + std::to_string(c) + " outside [0, " + std::to_string(num_classes) + ")");
  // Soft targets: smoothed one-hot rows mixed with the reversed batch's.
  const float off = static_cast<float>(label_smoothing / static_cast<double>(num_classes));
  const float on = static_cast<float>(1.0 - label_smoothing) + off;
  const float lam = static_cast<float>(mix.lam), rest = static_cast<float>(1.0 - mix.lam);
  std::vector<float> t(static_cast<size_t>(b * num_classes));
  for (int64_t i = 0; i < b; ++i) {
    float* row = &t[static_cast<size_t>(i * num_classes)];
    for (int64_t c = 0; c < num_classes; ++c) {
      const float a = c == y[i] ? on : off, r = c == y[b - 1 - i] ? on : off;
      row[c] = a * lam + r * rest;
    }
  }
  Array targets = Array::from_data(t.data(), {b, num_classes}, DType::f32);
  if (mix.lam == 1.0) return {images, targets.to(images.device())};
  std::vector<float> x = images.to_vector<float>();
  const std::vector<float> src = x;
  const Shape& s = images.shape();
  const int64_t h = channels_last ? s[1] : s[2], w = channels_last ? s[2] : s[3],
                ch = channels_last ? s[3] : s[1], per = ch * h * w;
  if (mix.cutmix) {
    for (int64_t i = 0; i < b; ++i) {
      const float* from = &src[static_cast<size_t>((b - 1 - i) * per)];
      float* to = &x[static_cast<size_t>(i * per)];
      for (int64_t c = 0; c < (channels_last ? 1 : ch); ++c)
        for (int64_t r = mix.y0; r < mix.y1; ++r) {
          // NCHW: a row of the box in channel c; NHWC: its pixels' channels.
          const int64_t at = channels_last ? (r * w + mix.x0) * ch : (c * h + r) * w + mix.x0;
          const int64_t n = (mix.x1 - mix.x0) * (channels_last ? ch : 1);
          std::copy(from + at, from + at + n, to + at);
        }
    }
  } else {
    for (int64_t i = 0; i < b; ++i) {
      const float* other = &src[static_cast<size_t>((b - 1 - i) * per)];
      float* to = &x[static_cast<size_t>(i * per)];
      for (int64_t k = 0; k < per; ++k) to[k] = to[k] * lam + other[k] * rest;
    }
  }
  return {Array::from_data(x.data(), s, DType::f32).to(images.device()), targets.to(images.device())};
}

}  // namespace kiln::data
