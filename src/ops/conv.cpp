// kiln ops: conv1d and conv2d (the Conv primitive from PyTorch-style
// options: per-axis or shared strides, dilations and paddings, "same"
// padding) and the primitives of its VJP.
#include <algorithm>
#include <string>

#include "kiln/ops.h"
#include "ops/conv_geometry.h"
#include "ops/dispatch.h"
#include "ops/vjp.h"

namespace kiln {
namespace {

// One value per spatial axis from `given` (empty: `fallback`; one value:
// every axis).
Shape per_axis(const std::vector<int64_t>& given, size_t axes, int64_t fallback, const char* op,
               const char* what) {
  if (given.empty()) return Shape(axes, fallback);
  if (given.size() == 1) return Shape(axes, given[0]);
  if (given.size() != axes)
    fail(op, std::string(what) + " has " + std::to_string(given.size()) +
                 " entries, expected 1 or " + std::to_string(axes) + " (one per spatial axis)");
  return Shape(given.begin(), given.end());
}

// The attributes of a convolution over the last `axes` spatial axes of
// spatial sizes `size` and kernel sizes `kernel`.
ConvAttrs attrs_for(const ConvOptions& opt, const Shape& size, const Shape& kernel,
                    const char* op) {
  const size_t axes = size.size();
  ConvAttrs a;
  a.stride = per_axis(opt.stride, axes, 1, op, "stride");
  a.dilation = per_axis(opt.dilation, axes, 1, op, "dilation");
  a.groups = opt.groups;
  a.channels_last = opt.channels_last;
  a.pad_lo.assign(axes, 0);
  a.pad_hi.assign(axes, 0);
  if (opt.same) {
    for (size_t i = 0; i < axes; ++i) {
      if (a.stride[i] < 1) break;  // conv_geometry names it
      const int64_t out = (size[i] + a.stride[i] - 1) / a.stride[i];
      const int64_t total = std::max<int64_t>(
          (out - 1) * a.stride[i] + a.dilation[i] * (kernel[i] - 1) + 1 - size[i], 0);
      a.pad_lo[i] = total / 2;
      a.pad_hi[i] = total - total / 2;
    }
  } else if (!opt.padding.empty()) {
    if (opt.padding.size() != 1 && opt.padding.size() != axes)
      fail(op, "padding has " + std::to_string(opt.padding.size()) + " entries, expected 1 or " +
                   std::to_string(axes) + " (before, after) pairs");
    for (size_t i = 0; i < axes; ++i) {
      const auto& [lo, hi] = opt.padding[opt.padding.size() == 1 ? 0 : i];
      a.pad_lo[i] = lo;
      a.pad_hi[i] = hi;
    }
  }
  return a;
}

void require_conv_operands(const Array& x, const Array& w, int64_t rank, const char* op,
                           const char* layout) {
  if (!x.valid() || !w.valid()) fail(op, "an operand is an empty Array handle");
  if (static_cast<int64_t>(x.ndim()) != rank)
    fail(op, "input " + str(x.shape()) + ": expected rank " + std::to_string(rank) + ", " + layout);
  if (static_cast<int64_t>(w.ndim()) != rank)
    fail(op, "weight " + str(w.shape()) + ": expected rank " + std::to_string(rank) +
                 ", [out channels, in channels / groups, kernel...]");
}

}  // namespace

Array conv2d(const Array& x, const Array& w, const ConvOptions& opt) {
  require_conv_operands(
      x, w, 4, "conv2d",
      opt.channels_last ? "[batch, height, width, channels]" : "[batch, channels, height, width]");
  const Shape& s = x.shape();
  const Shape size = opt.channels_last ? Shape{s[1], s[2]} : Shape{s[2], s[3]};
  ConvAttrs a = attrs_for(opt, size, {w.shape()[2], w.shape()[3]}, "conv2d");
  a.tf32 = x.dtype() == DType::f32 && matmul_precision() == MatmulPrecision::tf32;
  return apply(Primitive(Op::Conv, a), {x, w});
}

// A 2-d convolution over a height of 1.
Array conv1d(const Array& x, const Array& w, const ConvOptions& opt) {
  require_conv_operands(
      x, w, 3, "conv1d",
      opt.channels_last ? "[batch, length, channels]" : "[batch, channels, length]");
  const Shape& s = x.shape();
  const int64_t length = opt.channels_last ? s[1] : s[2];
  ConvAttrs a = attrs_for(opt, {length}, {w.shape()[2]}, "conv1d");
  a.tf32 = x.dtype() == DType::f32 && matmul_precision() == MatmulPrecision::tf32;
  a.stride.insert(a.stride.begin(), 1);
  a.dilation.insert(a.dilation.begin(), 1);
  a.pad_lo.insert(a.pad_lo.begin(), 0);
  a.pad_hi.insert(a.pad_hi.begin(), 0);
  const Array x2 =
      opt.channels_last ? reshape(x, {s[0], 1, s[1], s[2]}) : reshape(x, {s[0], s[1], 1, s[2]});
  const Shape& k = w.shape();
  const Array y = apply(Primitive(Op::Conv, a), {x2, reshape(w, {k[0], k[1], 1, k[2]})});
  const Shape& o = y.shape();
  return opt.channels_last ? reshape(y, {o[0], o[2], o[3]}) : reshape(y, {o[0], o[1], o[3]});
}

namespace {

Array pool(PoolKind kind, const Array& x, const std::vector<int64_t>& window,
           const PoolOptions& opt, const char* op) {
  if (!x.valid()) fail(op, "the input is an empty Array handle");
  if (x.ndim() != 4)
    fail(op, "input " + str(x.shape()) + ": expected rank 4, " +
                 (opt.channels_last ? "[batch, height, width, channels]"
                                    : "[batch, channels, height, width]"));
  PoolAttrs a;
  a.kind = kind;
  a.window = per_axis(window, 2, 1, op, "window");
  if (window.empty()) fail(op, "no window given");
  a.stride = opt.stride.empty() ? a.window : per_axis(opt.stride, 2, 1, op, "stride");
  a.pad_lo.assign(2, 0);
  a.pad_hi.assign(2, 0);
  if (!opt.padding.empty()) {
    if (opt.padding.size() != 1 && opt.padding.size() != 2)
      fail(op, "padding has " + std::to_string(opt.padding.size()) +
                   " entries, expected 1 or 2 (before, after) pairs");
    for (size_t i = 0; i < 2; ++i) {
      a.pad_lo[i] = opt.padding[opt.padding.size() == 1 ? 0 : i].first;
      a.pad_hi[i] = opt.padding[opt.padding.size() == 1 ? 0 : i].second;
    }
  }
  a.channels_last = opt.channels_last;
  a.count_include_pad = opt.count_include_pad;
  return apply(Primitive(Op::Pool, a), {x});
}

}  // namespace

Array max_pool2d(const Array& x, const std::vector<int64_t>& window, const PoolOptions& opt) {
  return pool(PoolKind::Max, x, window, opt, "max_pool2d");
}
Array avg_pool2d(const Array& x, const std::vector<int64_t>& window, const PoolOptions& opt) {
  return pool(PoolKind::Avg, x, window, opt, "avg_pool2d");
}

Array adaptive_avg_pool2d(const Array& x, int64_t height, int64_t width, bool channels_last) {
  const char* op = "adaptive_avg_pool2d";
  if (!x.valid()) fail(op, "the input is an empty Array handle");
  if (x.ndim() != 4) fail(op, "input " + str(x.shape()) + ": expected rank 4");
  if (height < 1 || width < 1)
    fail(op, "output size " + std::to_string(height) + "x" + std::to_string(width) +
                 ": expected at least 1x1");
  const int ha = channels_last ? 1 : 2, wa = ha + 1;
  const int64_t H = x.shape()[ha], W = x.shape()[wa];
  if (H == 0 || W == 0) fail(op, "input " + str(x.shape()) + " has no pixels to average");
  std::vector<Array> rows;
  for (int64_t i = 0; i < height; ++i) {
    const int64_t h0 = i * H / height, h1 = ((i + 1) * H + height - 1) / height;
    std::vector<Array> cols;
    for (int64_t j = 0; j < width; ++j) {
      const int64_t w0 = j * W / width, w1 = ((j + 1) * W + width - 1) / width;
      Shape start(4, 0), stop = x.shape();
      start[ha] = h0;
      stop[ha] = h1;
      start[wa] = w0;
      stop[wa] = w1;
      cols.push_back(mean(slice(x, start, stop), {ha, wa}, true));
    }
    rows.push_back(concatenate(cols, wa));
  }
  return concatenate(rows, ha);
}

Array pool_grad(const Array& x, const Array& dy, const PoolAttrs& attrs) {
  return apply(Primitive(Op::PoolGrad, attrs), {x, dy});
}

Array conv_grad_input(const Array& dy, const Array& w, const ConvAttrs& attrs, const Shape& input) {
  ConvAttrs a = attrs;
  a.input = input;
  a.weight = {};
  return apply(Primitive(Op::ConvGradInput, a), {dy, w});
}

Array conv_grad_weight(const Array& x, const Array& dy, const ConvAttrs& attrs,
                       const Shape& weight) {
  ConvAttrs a = attrs;
  a.input = {};
  a.weight = weight;
  return apply(Primitive(Op::ConvGradWeight, a), {x, dy});
}

}  // namespace kiln
