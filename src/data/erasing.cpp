// kiln data: random erasing of images, as timm's RandomErasing computes it
// (one box per image), with its draws made from a Threefry key.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/data.h"

namespace kiln::data {

void ErasingOptions::validate() const {
  if (!(prob >= 0 && prob <= 1))
    fail("train", "--reprob " + std::to_string(prob) + ", expected 0 to 1");
  if (mode != "pixel" && mode != "rand" && mode != "const")
    fail("train", "--remode '" + mode + "', expected pixel, rand or const");
  if (!(min_area > 0 && min_area <= max_area && max_area <= 1))
    fail("train", "random erasing's area range [" + std::to_string(min_area) + ", " +
                      std::to_string(max_area) + "], expected 0 < min <= max <= 1");
  if (!(min_aspect > 0 && min_aspect <= 1))
    fail("train", "random erasing's min_aspect " + std::to_string(min_aspect) +
                      ", expected 0 < min_aspect <= 1");
}

EraseBox erase_box(const ErasingOptions& opt, int64_t height, int64_t width,
                   const std::function<double()>& uniform) {
  EraseBox box;
  if (uniform() > opt.prob) return box;
  auto between = [&](double a, double b) { return a + (b - a) * uniform(); };
  auto randint = [&](int64_t a, int64_t b) {
    return a + static_cast<int64_t>(std::floor(uniform() * static_cast<double>(b - a + 1)));
  };
  const double area = static_cast<double>(height * width);
  const double lo = std::log(opt.min_aspect), hi = std::log(1.0 / opt.min_aspect);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = between(opt.min_area, opt.max_area) * area;
    const double aspect = std::exp(between(lo, hi));
    // Python's round: half to even, as nearbyint in the default rounding mode.
    const int64_t h = static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));
    const int64_t w = static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
    if (w < width && h < height) {
      box.erase = true;
      box.top = randint(0, height - h);
      box.left = randint(0, width - w);
      box.height = h, box.width = w;
      break;
    }
  }
  return box;
}

EraseBox draw_erase(const ErasingOptions& opt, const random::Key& key, int64_t height,
                    int64_t width) {
  uint32_t n = 0;
  return erase_box(opt, height, width, [&] {
    const uint32_t in[2] = {n++, 0x6572u};  // "er"
    uint32_t out[2];
    random::threefry2x32(key.k, in, out);
    const uint64_t bits = (static_cast<uint64_t>(out[0]) << 21) ^ (out[1] >> 11);
    return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1p-53;
  });
}

Array erase_batch(const Array& images, const std::vector<EraseBox>& boxes,
                  const ErasingOptions& opt, const random::Key& key, bool channels_last) {
  if (images.ndim() != 4 || images.dtype() != DType::f32)
    fail("random erasing", "images " + std::string(name_of(images.dtype())) + " " +
                               str(images.shape()) + ", expected f32 [batch, channels, height, width]");
  const Shape& s = images.shape();
  if (static_cast<int64_t>(boxes.size()) != s[0])
    fail("random erasing", std::to_string(boxes.size()) + " boxes for " + std::to_string(s[0]) + " images");
  bool any = false;
  for (const EraseBox& b : boxes) any |= b.erase;
  if (!any) return images;
  const int64_t h = channels_last ? s[1] : s[2], w = channels_last ? s[2] : s[3],
                ch = channels_last ? s[3] : s[1], per = ch * h * w;
  std::vector<float> x = images.to_vector<float>();
  for (int64_t i = 0; i < s[0]; ++i) {
    const EraseBox& b = boxes[static_cast<size_t>(i)];
    if (!b.erase) continue;
    if (b.top < 0 || b.left < 0 || b.top + b.height > h || b.left + b.width > w)
      fail("random erasing", "a box outside the image");
    // The fill in timm's order: [C, height, width] normals ("pixel"), one per
    // channel ("rand"), or zeros.
    std::vector<float> fill(static_cast<size_t>(opt.mode == "pixel" ? ch * b.height * b.width
                                                                    : ch), 0.0f);
    if (opt.mode != "const") random::fill_normal(random::fold_in(key, static_cast<uint32_t>(i)), fill.data(),
                                                 static_cast<int64_t>(fill.size()));
    float* img = &x[static_cast<size_t>(i * per)];
    for (int64_t c = 0; c < ch; ++c)
      for (int64_t r = 0; r < b.height; ++r)
        for (int64_t q = 0; q < b.width; ++q) {
          const int64_t y = b.top + r, xq = b.left + q;
          const int64_t at = channels_last ? (y * w + xq) * ch + c : (c * h + y) * w + xq;
          img[at] = opt.mode == "pixel" ? fill[static_cast<size_t>((c * b.height + r) * b.width + q)]
                                        : fill[static_cast<size_t>(c)];
        }
  }
  return Array::from_data(x.data(), s, DType::f32).to(images.device());
}

}  // namespace kiln::data
