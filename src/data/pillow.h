// kiln data (internal): Pillow operations that several data files share,
// byte for byte: ImageEnhance on RGB images (src/data/color_jitter.cpp,
// compiled without fused multiply-adds as Pillow's baseline build is), used
// by color jitter and RandAugment; Image.transpose (src/data/decode.cpp),
// used by EXIF orientation, RandAugment's rotations and the folder's flip.
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

// Image.transpose by EXIF orientation number (ImageOps.exif_transpose's
// table): 2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE,
// 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90; anything else changes nothing.
Image transpose(Image in, int orientation);
inline constexpr int kFlipLeftRight = 2, kRotate180 = 3, kRotate270 = 6, kRotate90 = 8;

}  // namespace kiln::data::pillow
