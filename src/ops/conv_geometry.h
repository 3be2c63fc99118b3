// kiln ops: a convolution's geometry (ConvAttrs with its operands' shapes),
// shared by its definitions and every backend's kernels.
#pragma once
#include <cstdint>

#include "kiln/shape.h"
#include "ops/primitive.h"

namespace kiln {

struct ConvGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;  // the input: batch, channels, height, width
  int64_t o = 0, kh = 0, kw = 0;       // the weight [O, C / groups, KH, KW]
  int64_t ho = 0, wo = 0;              // the output's height and width
  int64_t groups = 1, cg = 0, og = 0;  // input and output channels per group
  int64_t sh = 1, sw = 1, dh = 1, dw = 1, ph = 0, pw = 0;  // stride, dilation, padding before
  int64_t ph_after = 0, pw_after = 0;                      // padding after
  bool channels_last = false;

  Shape input_shape() const { return channels_last ? Shape{n, h, w, c} : Shape{n, c, h, w}; }
  Shape output_shape() const { return channels_last ? Shape{n, ho, wo, o} : Shape{n, o, ho, wo}; }
  Shape weight_shape() const { return {o, cg, kh, kw}; }
  int64_t x_index(int64_t b, int64_t ch, int64_t y, int64_t x) const {
    return channels_last ? ((b * h + y) * w + x) * c + ch : ((b * c + ch) * h + y) * w + x;
  }
  int64_t y_index(int64_t b, int64_t ch, int64_t y, int64_t x) const {
    return channels_last ? ((b * ho + y) * wo + x) * o + ch : ((b * o + ch) * ho + y) * wo + x;
  }
  int64_t w_index(int64_t oc, int64_t ic, int64_t i, int64_t j) const {
    return ((oc * cg + ic) * kh + i) * kw + j;
  }
};

// The geometry of a convolution with attributes `a` of an input of shape x
// by a weight of shape w; fails (kiln::Error naming `who`) where they do not
// fit: ranks, channels and groups, strides, dilations and paddings, and a
// window larger than the padded input.
ConvGeometry conv_geometry(const ConvAttrs& a, const Shape& x, const Shape& w, const char* who);

// A pooling's geometry as a depthwise convolution's: one input channel per
// group, the window for the weight (w_index: the tap's place in its
// window, plus channel * KH * KW). Fails as conv_geometry does, and where
// the padding is more than half the window (PyTorch's rule: no window is
// padding only).
ConvGeometry pool_geometry(const PoolAttrs& a, const Shape& x, const char* who);

// Calls f(x_index, w_index, y_index) for every output element and window
// tap whose input element lies inside x (not in the padding), in a fixed
// order: batch, output channel, output row and column, input channel, tap.
template <typename F>
void for_each_tap(const ConvGeometry& q, F&& f) {
  for (int64_t b = 0; b < q.n; ++b)
    for (int64_t oc = 0; oc < q.o; ++oc) {
      const int64_t g = oc / q.og;
      for (int64_t y = 0; y < q.ho; ++y)
        for (int64_t x = 0; x < q.wo; ++x) {
          const int64_t yi = q.y_index(b, oc, y, x);
          for (int64_t ic = 0; ic < q.cg; ++ic)
            for (int64_t i = 0; i < q.kh; ++i) {
              const int64_t r = y * q.sh - q.ph + i * q.dh;
              if (r < 0 || r >= q.h) continue;
              for (int64_t j = 0; j < q.kw; ++j) {
                const int64_t col = x * q.sw - q.pw + j * q.dw;
                if (col < 0 || col >= q.w) continue;
                f(q.x_index(b, g * q.cg + ic, r, col), q.w_index(oc, ic, i, j), yi);
              }
            }
        }
    }
}

// Calls f(x_index) for each tap of output (b, c, y, x)'s pooling window
// that lies inside the input, in window order; returns how many it called.
template <typename F>
int64_t for_each_in_window(const ConvGeometry& q, int64_t b, int64_t c, int64_t y, int64_t x,
                           F&& f) {
  int64_t n = 0;
  for (int64_t i = 0; i < q.kh; ++i) {
    const int64_t r = y * q.sh - q.ph + i;
    if (r < 0 || r >= q.h) continue;
    for (int64_t j = 0; j < q.kw; ++j) {
      const int64_t col = x * q.sw - q.pw + j;
      if (col < 0 || col >= q.w) continue;
      f(q.x_index(b, c, r, col));
      ++n;
    }
  }
  return n;
}

// Pooling of output element (b, c, y, x) of x (max: the first largest tap,
// NaN taken over any number; average: the sum over the window's count),
// and the input index of the max (-1: average).
template <typename T>
T pool_window(const ConvGeometry& q, bool max, bool count_include_pad, const T* x, int64_t b,
              int64_t c, int64_t y, int64_t xo, int64_t* arg) {
  T v = 0;
  int64_t best = -1;
  const int64_t n = for_each_in_window(q, b, c, y, xo, [&](int64_t i) {
    if (!max) {
      v += x[i];
    } else if (best < 0 || x[i] > v || (x[i] != x[i] && v == v)) {
      v = x[i];
      best = i;
    }
  });
  if (arg) *arg = best;
  if (max) return v;
  return v / static_cast<T>(count_include_pad ? q.kh * q.kw : n);
}

}  // namespace kiln
