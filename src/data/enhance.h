// kiln data (internal): Pillow's ImageEnhance on RGB images, byte for byte,
// shared by color jitter and RandAugment (src/data/color_jitter.cpp, compiled
// without fused multiply-adds as Pillow's baseline build is).
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/data.h"

namespace kiln::data::pillow {

// Image.blend(degenerate, img, alpha) into img: alpha is a C float; 0 and 1
// copy; truncation inside [0, 1], clipping outside it.
void blend(const std::vector<uint8_t>& degenerate, std::vector<uint8_t>& img, double factor);
// ITU-R 601-2 luma as Pillow's "L" conversion computes it.
uint8_t luma(const uint8_t* rgb);
// ImageEnhance.Brightness, Contrast and Color.
void brightness(Image& img, double factor);
void contrast(Image& img, double factor);
void color(Image& img, double factor);

}  // namespace kiln::data::pillow
