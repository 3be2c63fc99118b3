// kiln ops: the windowed primitives' definitions — Conv (a 2-d
// convolution: strides, dilation, asymmetric zero padding, groups, NCHW or
// NHWC) and its backward primitives ConvGradInput and ConvGradWeight, which
// are not differentiated again. Their fallbacks are the convolution as one
// batched GEMM per group over the window's taps gathered by strided slices
// (im2col), and its adjoints. Pool (max and average pooling) and its
// PoolGrad, whose fallbacks are the same strided slices combined.
#include <limits>

#include "ops/conv_geometry.h"
#include "ops/defs/defs.h"

namespace kiln {

ConvGeometry conv_geometry(const ConvAttrs& a, const Shape& x, const Shape& w, const char* who) {
  auto two = [&](const Shape& v, const char* name, int64_t least) {
    if (v.size() != 2)
      fail(who, std::string(name) + " has " + std::to_string(v.size()) +
                    " entries, expected 2 (height, width)");
    for (int64_t e : v)
      if (e < least)
        fail(who,
             std::string(name) + " " + str(v) + ": expected entries >= " + std::to_string(least));
  };
  two(a.stride, "stride", 1);
  two(a.dilation, "dilation", 1);
  two(a.pad_lo, "padding before", 0);
  two(a.pad_hi, "padding after", 0);
  if (x.size() != 4)
    fail(who, "input " + str(x) + ": expected rank 4, " +
                  (a.channels_last ? "[batch, height, width, channels]"
                                   : "[batch, channels, height, width]"));
  if (w.size() != 4)
    fail(who, "weight " + str(w) +
                  ": expected rank 4, [out channels, in channels / groups, "
                  "kernel height, kernel width]");
  ConvGeometry q;
  q.channels_last = a.channels_last;
  q.n = x[0];
  q.c = a.channels_last ? x[3] : x[1];
  q.h = a.channels_last ? x[1] : x[2];
  q.w = a.channels_last ? x[2] : x[3];
  q.o = w[0];
  q.kh = w[2];
  q.kw = w[3];
  q.groups = a.groups;
  if (q.groups < 1) fail(who, "groups is " + std::to_string(q.groups) + ", expected >= 1");
  if (q.c % q.groups || q.o % q.groups)
    fail(who, std::to_string(q.c) + " input and " + std::to_string(q.o) +
                  " output channels do not divide into " + std::to_string(q.groups) + " groups");
  q.cg = q.c / q.groups;
  q.og = q.o / q.groups;
  if (w[1] != q.cg)
    fail(who, "weight " + str(w) + " has " + std::to_string(w[1]) +
                  " input channels per group, expected " + std::to_string(q.cg) + " (" +
                  std::to_string(q.c) + " channels in " + std::to_string(q.groups) + " groups)");
  if (q.kh < 1 || q.kw < 1) fail(who, "weight " + str(w) + " has an empty window");
  q.sh = a.stride[0];
  q.sw = a.stride[1];
  q.dh = a.dilation[0];
  q.dw = a.dilation[1];
  q.ph = a.pad_lo[0];
  q.pw = a.pad_lo[1];
  q.ph_after = a.pad_hi[0];
  q.pw_after = a.pad_hi[1];
  const int64_t hp = q.h + a.pad_lo[0] + a.pad_hi[0], wp = q.w + a.pad_lo[1] + a.pad_hi[1];
  const int64_t eh = q.dh * (q.kh - 1) + 1, ew = q.dw * (q.kw - 1) + 1;
  if (eh > hp || ew > wp)
    fail(who,
         "the window " + std::to_string(q.kh) + "x" + std::to_string(q.kw) +
             (q.dh > 1 || q.dw > 1 ? " dilated to " + std::to_string(eh) + "x" + std::to_string(ew)
                                   : std::string()) +
             " does not fit the input " + std::to_string(q.h) + "x" + std::to_string(q.w) +
             " padded to " + std::to_string(hp) + "x" + std::to_string(wp));
  q.ho = (hp - eh) / q.sh + 1;
  q.wo = (wp - ew) / q.sw + 1;
  return q;
}

ConvGeometry pool_geometry(const PoolAttrs& a, const Shape& x, const char* who) {
  if (a.window.size() != 2)
    fail(who,
         "window has " + std::to_string(a.window.size()) + " entries, expected 2 (height, width)");
  for (int64_t k : a.window)
    if (k < 1) fail(who, "window " + str(a.window) + ": expected entries >= 1");
  if (x.size() != 4)
    fail(who, "input " + str(x) + ": expected rank 4, " +
                  (a.channels_last ? "[batch, height, width, channels]"
                                   : "[batch, channels, height, width]"));
  const int64_t c = a.channels_last ? x[3] : x[1];
  const ConvAttrs conv{a.stride,        {1, 1}, a.pad_lo, a.pad_hi, std::max<int64_t>(c, 1),
                       a.channels_last, {},     {}};
  const ConvGeometry q = conv_geometry(conv, x, {c, c ? 1 : 0, a.window[0], a.window[1]}, who);
  for (size_t i = 0; i < 2; ++i)
    if (2 * a.pad_lo[i] > a.window[i] || 2 * a.pad_hi[i] > a.window[i])
      fail(who, "padding " + str(a.pad_lo) + " before and " + str(a.pad_hi) +
                    " after: expected at most half the window " + str(a.window));
  return q;
}

namespace defs {
namespace {

void expect_one_float_dtype(const Primitive& p, const Aval& a, const Aval& b, const char* an,
                            const char* bn) {
  expect_float(p, a, an);
  KILN_EXPECT(
      a.dtype == b.dtype, p,
      std::string(an) + " is " + str(a) + " and " + bn + " " + str(b) + ": expected one dtype");
}

// x, w -> y.
Aval conv_type(const Primitive& p, const std::vector<Aval>& in) {
  expect_one_float_dtype(p, in[0], in[1], "input", "weight");
  const auto& a = p.attrs<ConvAttrs>();
  KILN_EXPECT(a.input.empty() && a.weight.empty(), p, "a forward convolution names no shapes");
  return {conv_geometry(a, in[0].shape, in[1].shape, p.name()).output_shape(), in[0].dtype};
}

// dy, w -> dx of shape `input`.
Aval conv_grad_input_type(const Primitive& p, const std::vector<Aval>& in) {
  expect_one_float_dtype(p, in[0], in[1], "dy", "weight");
  const auto& a = p.attrs<ConvAttrs>();
  const ConvGeometry q = conv_geometry(a, a.input, in[1].shape, p.name());
  KILN_EXPECT(in[0].shape == q.output_shape(), p,
              "dy is " + str(in[0]) + ", expected " + str(q.output_shape()));
  return {a.input, in[0].dtype};
}

// x, dy -> dw of shape `weight`.
Aval conv_grad_weight_type(const Primitive& p, const std::vector<Aval>& in) {
  expect_one_float_dtype(p, in[0], in[1], "input", "dy");
  const auto& a = p.attrs<ConvAttrs>();
  const ConvGeometry q = conv_geometry(a, in[0].shape, a.weight, p.name());
  KILN_EXPECT(in[1].shape == q.output_shape(), p,
              "dy is " + str(in[1]) + ", expected " + str(q.output_shape()));
  return {a.weight, in[0].dtype};
}

void conv_vjp(const VjpArgs& args, std::vector<Array>& ct) {
  const auto& a = args.p.attrs<ConvAttrs>();
  const Array g = astype(args.g, args.in[0].dtype());
  if (args.want(0)) ct[0] = conv_grad_input(g, args.in[1], a, args.in[0].shape());
  if (args.want(1)) ct[1] = conv_grad_weight(args.in[0], g, a, args.in[1].shape());
}

// ---- fallbacks, in f32 for bf16 ----

Array wide(const Array& x) {
  return x.dtype() == DType::bf16 ? astype(x, DType::f32) : x;
}
Array to_nchw(const Array& x, bool channels_last) {
  return channels_last ? transpose(x, {0, 3, 1, 2}) : x;
}
Array from_nchw(const Array& y, bool channels_last) {
  return channels_last ? transpose(y, {0, 2, 3, 1}) : y;
}
Array gemm(const Array& a, const Array& b, bool ta, bool tb) {
  return matmul(a, b, {ta, tb, std::nullopt, MatmulPrecision::fp32});
}

// The NCHW input inside its zero padding: what the window slides over.
SliceAttrs padding(const ConvAttrs& a, const ConvGeometry& q) {
  return {{0, 0, a.pad_lo[0], a.pad_lo[1]},
          {q.n, q.c, a.pad_lo[0] + q.h, a.pad_lo[1] + q.w},
          {1, 1, 1, 1},
          {q.n, q.c, q.h + a.pad_lo[0] + a.pad_hi[0], q.w + a.pad_lo[1] + a.pad_hi[1]}};
}
// The padded input's elements under tap (i, j) of the window at every output
// position: [N, C, HO, WO].
SliceAttrs tap(const ConvAttrs& a, const ConvGeometry& q, int64_t i, int64_t j) {
  const int64_t r = i * q.dh, c = j * q.dw;
  return {{0, 0, r, c},
          {q.n, q.c, r + (q.ho - 1) * q.sh + 1, c + (q.wo - 1) * q.sw + 1},
          {1, 1, q.sh, q.sw},
          padding(a, q).full};
}

// [G, C/G * KH * KW, N * HO * WO]: every tap's input for every output position.
Array columns(const Array& x, const ConvAttrs& a, const ConvGeometry& q) {
  const SliceAttrs pad = padding(a, q);
  const Array xp = pad.full == x.shape() ? x : slice_grad(x, pad);
  std::vector<Array> taps;
  for (int64_t i = 0; i < q.kh; ++i)
    for (int64_t j = 0; j < q.kw; ++j) {
      const SliceAttrs t = tap(a, q, i, j);
      taps.push_back(
          reshape(slice(xp, t.start, t.stop, t.step), {q.n, q.groups, q.cg, 1, q.ho * q.wo}));
    }
  return reshape(transpose(concatenate(taps, 3), {1, 2, 3, 0, 4}),
                 {q.groups, q.cg * q.kh * q.kw, q.n * q.ho * q.wo});
}
// dy [N, O, HO, WO] as [G, O/G, N * HO * WO].
Array grouped_rows(const Array& dy, const ConvGeometry& q) {
  return reshape(transpose(reshape(dy, {q.n, q.groups, q.og, q.ho * q.wo}), {1, 2, 0, 3}),
                 {q.groups, q.og, q.n * q.ho * q.wo});
}
Shape nchw(const Shape& s, bool channels_last) {
  return channels_last ? Shape{s[0], s[3], s[1], s[2]} : s;
}
ConvAttrs nchw_attrs(ConvAttrs a) {
  a.channels_last = false;
  return a;
}

Array conv_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const ConvAttrs a = nchw_attrs(p.attrs<ConvAttrs>());
  const bool cl = p.attrs<ConvAttrs>().channels_last;
  const Array x = to_nchw(wide(in[0]), cl), w = wide(in[1]);
  const ConvGeometry q = conv_geometry(a, x.shape(), w.shape(), p.name());
  const Array y = gemm(reshape(w, {q.groups, q.og, q.cg * q.kh * q.kw}), columns(x, a, q), false,
                       false);  // [G, O/G, N * HO * WO]
  return from_nchw(reshape(transpose(reshape(y, {q.groups, q.og, q.n, q.ho * q.wo}), {2, 0, 1, 3}),
                           {q.n, q.o, q.ho, q.wo}),
                   cl);
}

// Each tap's columns scattered back to where it read them, summed, unpadded.
Array conv_grad_input_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const ConvAttrs a = nchw_attrs(p.attrs<ConvAttrs>());
  const bool cl = p.attrs<ConvAttrs>().channels_last;
  const Array dy = to_nchw(wide(in[0]), cl), w = wide(in[1]);
  const ConvGeometry q =
      conv_geometry(a, nchw(p.attrs<ConvAttrs>().input, cl), w.shape(), p.name());
  const int64_t taps = q.kh * q.kw, positions = q.ho * q.wo;
  const Array cols = gemm(reshape(w, {q.groups, q.og, q.cg * taps}), grouped_rows(dy, q), true,
                          false);  // [G, C/G * KH * KW, N * HO * WO]
  const Array t = transpose(reshape(cols, {q.groups, q.cg, taps, q.n, positions}), {3, 0, 1, 2, 4});
  Array dxp;
  for (int64_t i = 0; i < q.kh; ++i)
    for (int64_t j = 0; j < q.kw; ++j) {
      const int64_t k = i * q.kw + j;
      const Array part = reshape(slice(t, {0, 0, 0, k, 0}, {q.n, q.groups, q.cg, k + 1, positions}),
                                 {q.n, q.c, q.ho, q.wo});
      const SliceAttrs at = tap(a, q, i, j);
      const Array back = at.full == part.shape() ? part : slice_grad(part, at);
      dxp = dxp.valid() ? dxp + back : back;
    }
  const SliceAttrs pad = padding(a, q);
  return from_nchw(slice(dxp, pad.start, pad.stop), cl);
}

Array conv_grad_weight_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const ConvAttrs a = nchw_attrs(p.attrs<ConvAttrs>());
  const bool cl = p.attrs<ConvAttrs>().channels_last;
  const Array x = to_nchw(wide(in[0]), cl), dy = to_nchw(wide(in[1]), cl);
  const ConvGeometry q = conv_geometry(a, x.shape(), p.attrs<ConvAttrs>().weight, p.name());
  return reshape(gemm(grouped_rows(dy, q), columns(x, a, q), false, true), q.weight_shape());
}

// ---- pooling ----

ConvAttrs pool_as_conv(const PoolAttrs& a) {
  return {a.stride, {1, 1}, a.pad_lo, a.pad_hi, 1, false, {}, {}};
}

Aval pool_type(const Primitive& p, const std::vector<Aval>& in) {
  expect_float(p, in[0], "input");
  return {pool_geometry(p.attrs<PoolAttrs>(), in[0].shape, p.name()).output_shape(), in[0].dtype};
}

// x, dy -> dx.
Aval pool_grad_type(const Primitive& p, const std::vector<Aval>& in) {
  expect_one_float_dtype(p, in[0], in[1], "input", "dy");
  const ConvGeometry q = pool_geometry(p.attrs<PoolAttrs>(), in[0].shape, p.name());
  KILN_EXPECT(in[1].shape == q.output_shape(), p,
              "dy is " + str(in[1]) + ", expected " + str(q.output_shape()));
  return in[0];
}

void pool_vjp(const VjpArgs& args, std::vector<Array>& ct) {
  if (args.want(0))
    ct[0] = pool_grad(args.in[0], astype(args.g, args.in[0].dtype()), args.p.attrs<PoolAttrs>());
}

// The NCHW input padded (max: with -inf, never chosen; average: zeros), and
// the taps of its windows in window order.
struct PoolTaps {
  ConvGeometry q;
  ConvAttrs conv;
  std::vector<Array> taps;  // [N, C, HO, WO] each
  std::vector<SliceAttrs> where;
};
PoolTaps pool_taps(const Array& x, const PoolAttrs& a, const char* who) {
  PoolTaps t;
  t.conv = pool_as_conv(a);
  t.q = pool_geometry({a.kind, a.window, a.stride, a.pad_lo, a.pad_hi, false, a.count_include_pad},
                      x.shape(), who);
  const SliceAttrs pad = padding(t.conv, t.q);
  Array xp = x;
  if (pad.full != x.shape()) {
    xp = slice_grad(x, pad);
    if (a.kind == PoolKind::Max)
      xp = where(greater(slice_grad(ones_like(x), pad), scalar_like(x, 0.5)), xp,
                 scalar_like(x, -std::numeric_limits<double>::infinity()));
  }
  for (int64_t i = 0; i < t.q.kh; ++i)
    for (int64_t j = 0; j < t.q.kw; ++j) {
      t.where.push_back(tap(t.conv, t.q, i, j));
      t.taps.push_back(slice(xp, t.where.back().start, t.where.back().stop, t.where.back().step));
    }
  return t;
}
// Average pooling's divisor: the window, or the taps inside the input.
Array pool_count(const Array& x, const PoolAttrs& a, const PoolTaps& t) {
  if (a.count_include_pad) return scalar_like(x, static_cast<double>(t.q.kh * t.q.kw));
  const PoolTaps ones_taps = pool_taps(ones_like(x), a, "pool");
  Array n = ones_taps.taps[0];
  for (size_t k = 1; k < ones_taps.taps.size(); ++k) n = n + ones_taps.taps[k];
  return n;
}

Array pool_of(const Array& x, const PoolAttrs& a, const PoolTaps& t) {
  Array y = t.taps[0];
  for (size_t k = 1; k < t.taps.size(); ++k)
    y = a.kind == PoolKind::Max ? maximum(y, t.taps[k]) : y + t.taps[k];
  return a.kind == PoolKind::Max ? y : y / pool_count(x, a, t);
}

Array pool_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const auto& a = p.attrs<PoolAttrs>();
  const Array x = to_nchw(wide(in[0]), a.channels_last);
  return from_nchw(pool_of(x, a, pool_taps(x, a, p.name())), a.channels_last);
}

// Each tap's share of dy scattered back to where it read: a max window's to
// its first largest element, an average's to all.
Array pool_grad_fallback(const Primitive& p, const std::vector<Array>& in, const Aval&) {
  const auto& a = p.attrs<PoolAttrs>();
  const Array x = to_nchw(wide(in[0]), a.channels_last), g = to_nchw(wide(in[1]), a.channels_last);
  const PoolTaps t = pool_taps(x, a, p.name());
  Array dxp;
  auto add = [&](const Array& part, const SliceAttrs& at) {
    const Array back = at.full == part.shape() ? part : slice_grad(part, at);
    dxp = dxp.valid() ? dxp + back : back;
  };
  if (a.kind == PoolKind::Max) {
    const Array y = pool_of(x, a, t);
    Array taken = zeros_like(y);
    for (size_t k = 0; k < t.taps.size(); ++k) {
      const Array hit = astype(equal(t.taps[k], y), x.dtype()) * (scalar_like(y, 1.0) - taken);
      taken = taken + hit;
      add(hit * g, t.where[k]);
    }
  } else {
    const Array share = g / pool_count(x, a, t);
    for (size_t k = 0; k < t.taps.size(); ++k) add(share + zeros_like(g), t.where[k]);
  }
  const SliceAttrs pad = padding(t.conv, t.q);
  return from_nchw(slice(dxp, pad.start, pad.stop), a.channels_last);
}

}  // namespace

void conv(OpDefs& d) {
  define(d, Op::Pool, {.arity = 1, .infer = pool_type, .vjp = pool_vjp, .fallback = pool_fallback});
  define(d, Op::PoolGrad,
         {.arity = 2,
          .infer = pool_grad_type,
          .no_vjp = kNoSecondOrder,
          .fallback = pool_grad_fallback});
  define(d, Op::Conv, {.arity = 2, .infer = conv_type, .vjp = conv_vjp, .fallback = conv_fallback});
  define(d, Op::ConvGradInput,
         {.arity = 2,
          .infer = conv_grad_input_type,
          .no_vjp = kNoSecondOrder,
          .fallback = conv_grad_input_fallback});
  define(d, Op::ConvGradWeight,
         {.arity = 2,
          .infer = conv_grad_weight_type,
          .no_vjp = kNoSecondOrder,
          .fallback = conv_grad_weight_fallback});
}

}  // namespace defs
}  // namespace kiln
