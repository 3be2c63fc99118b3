// kiln ops: the definitions of the primitives that move values without
// arithmetic — layout (reshape, transpose, broadcast, concatenate, slices,
// gathers and scatters, one-hot), copies between devices — and of the
// sources (Random, Fill).
#include "ops/defs/defs.h"

namespace kiln::defs {
namespace {

Aval reshape_type(const Primitive& p, const std::vector<Aval>& in) {
  const Shape& to = p.attrs<ShapeAttrs>().shape;
  KILN_EXPECT(numel(to) == numel(in[0].shape), p,
              "cannot reshape " + str(in[0].shape) + " into " + str(to));
  return {to, in[0].dtype};
}

Aval transpose_type(const Primitive& p, const std::vector<Aval>& in) {
  const auto& perm = p.attrs<PermAttrs>().perm;
  const Shape& s = in[0].shape;
  KILN_EXPECT(perm.size() == s.size(), p,
              "a permutation of " + std::to_string(perm.size()) + " axes for shape " + str(s));
  std::vector<bool> seen(s.size());
  Shape out(s.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    expect_axis(p, perm[i], s.size());
    KILN_EXPECT(!seen[perm[i]], p,
                "axis " + std::to_string(perm[i]) + " repeated in the permutation");
    seen[perm[i]] = true;
    out[i] = s[perm[i]];
  }
  return {out, in[0].dtype};
}

Aval broadcast_type(const Primitive& p, const std::vector<Aval>& in) {
  const Shape& to = p.attrs<ShapeAttrs>().shape;
  KILN_EXPECT(broadcast_shapes(in[0].shape, to, p.name()) == to, p,
              "cannot broadcast " + str(in[0].shape) + " to " + str(to));
  return {to, in[0].dtype};
}

// One dtype and rank, extents equal but along the axis, where they add up.
Aval concatenate_type(const Primitive& p, const std::vector<Aval>& in) {
  KILN_EXPECT(!in.empty(), p, "no operands");
  const int ax = p.attrs<AxisAttrs>().axis;
  expect_axis(p, ax, in[0].shape.size());
  Aval out = in[0];
  out.shape[ax] = 0;
  for (const Aval& x : in) {
    KILN_EXPECT(x.dtype == in[0].dtype, p, str(in[0]) + " and " + str(x) + " differ in dtype");
    KILN_EXPECT(x.shape.size() == in[0].shape.size(), p,
                "ranks differ: " + str(in[0].shape) + " and " + str(x.shape));
    for (size_t i = 0; i < x.shape.size(); ++i)
      KILN_EXPECT(static_cast<int>(i) == ax || x.shape[i] == in[0].shape[i], p,
                  "shapes " + str(in[0].shape) + " and " + str(x.shape) + " differ outside axis " +
                      std::to_string(ax));
    out.shape[ax] += x.shape[ax];
  }
  return out;
}

// The extents a slice of `full` keeps (start <= stop <= full, step > 0).
Shape sliced_shape(const Primitive& p, const SliceAttrs& s) {
  const size_t r = s.full.size();
  KILN_EXPECT(s.start.size() == r && s.stop.size() == r && s.step.size() == r, p,
              "start, stop and step need one entry per axis of " + str(s.full));
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    KILN_EXPECT(
        s.step[i] > 0 && 0 <= s.start[i] && s.start[i] <= s.stop[i] && s.stop[i] <= s.full[i], p,
        "axis " + std::to_string(i) + " is sliced out of its range");
    out[i] = (s.stop[i] - s.start[i] + s.step[i] - 1) / s.step[i];
  }
  return out;
}

Aval slice_type(const Primitive& p, const std::vector<Aval>& in) {
  const auto& s = p.attrs<SliceAttrs>();
  KILN_EXPECT(in[0].shape == s.full, p,
              "slices " + str(in[0].shape) + ", its attributes say " + str(s.full));
  return {sliced_shape(p, s), in[0].dtype};
}

// SliceGrad: the slice's gradient, scattered back into zeros of `full`.
Aval slice_grad_type(const Primitive& p, const std::vector<Aval>& in) {
  const auto& s = p.attrs<SliceAttrs>();
  const Shape sliced = sliced_shape(p, s);
  KILN_EXPECT(in[0].shape == sliced, p,
              "gradient " + str(in[0].shape) + " for a slice of shape " + str(sliced));
  return {s.full, in[0].dtype};
}

// DynamicSlice(x, starts) and DynamicUpdateSlice(x, update, starts): integer
// starts [ndim], and a window (`what`: the sizes or the update's shape) of
// x's rank no larger than x on any axis.
void expect_window(const Primitive& p, const Aval& x, const Shape& window, const Aval& starts,
                   const std::string& what) {
  expect_integer(p, starts, "starts");
  const auto rank = static_cast<int64_t>(x.shape.size());
  KILN_EXPECT(starts.shape == Shape{rank}, p,
              "starts " + str(starts) + ", expected one per axis of x " + str(x) + ": [" +
                  std::to_string(rank) + "]");
  bool fits = window.size() == x.shape.size();
  for (size_t i = 0; fits && i < window.size(); ++i)
    fits = window[i] >= 0 && window[i] <= x.shape[i];
  KILN_EXPECT(fits, p,
              what + " " + str(window) + " does not fit in x " + str(x) +
                  " (expected its rank, no larger on any axis)");
}

Aval dynamic_slice_type(const Primitive& p, const std::vector<Aval>& in) {
  const Shape& sizes = p.attrs<ShapeAttrs>().shape;
  expect_window(p, in[0], sizes, in[1], "sizes");
  return {sizes, in[0].dtype};
}

Aval dynamic_update_slice_type(const Primitive& p, const std::vector<Aval>& in) {
  KILN_EXPECT(in[1].dtype == in[0].dtype, p,
              "update " + str(in[1]) + " must have x's dtype, x is " + str(in[0]));
  expect_window(p, in[0], in[1].shape, in[2], "update");
  return in[0];
}

// a[..., indices, ...] along the axis: indices' shape in place of the axis.
Shape gathered_shape(const Shape& a, int ax, const Shape& indices) {
  Shape s(a.begin(), a.begin() + ax);
  s.insert(s.end(), indices.begin(), indices.end());
  s.insert(s.end(), a.begin() + ax + 1, a.end());
  return s;
}

Aval take_type(const Primitive& p, const std::vector<Aval>& in) {
  const int ax = p.attrs<AxisAttrs>().axis;
  expect_axis(p, ax, in[0].shape.size());
  expect_integer(p, in[1], "indices");
  return {gathered_shape(in[0].shape, ax, in[1].shape), in[0].dtype};
}

// ScatterAdd(indices, updates): updates shaped as Take's output would be.
Aval scatter_add_type(const Primitive& p, const std::vector<Aval>& in) {
  const auto& s = p.attrs<ScatterAttrs>();
  expect_axis(p, s.axis, s.shape.size());
  expect_integer(p, in[0], "indices");
  const Shape want = gathered_shape(s.shape, s.axis, in[0].shape);
  KILN_EXPECT(in[1].shape == want, p,
              "updates " + str(in[1].shape) + " where " + str(want) +
                  " fits the indices and the output " + str(s.shape));
  return {s.shape, in[1].dtype};
}

Aval one_hot_type(const Primitive& p, const std::vector<Aval>& in) {
  const auto& a = p.attrs<OneHotAttrs>();
  expect_integer(p, in[0], "labels");
  KILN_EXPECT(a.depth > 0, p, "depth " + std::to_string(a.depth) + " is not positive");
  Shape s = in[0].shape;
  s.push_back(a.depth);
  return {s, a.dtype};
}

// A draw of the attributes' shape and dtype; the key's bits as an optional
// i32[2] operand.
Aval random_type(const Primitive& p, const std::vector<Aval>& in) {
  const auto& a = p.attrs<RandomAttrs>();
  KILN_EXPECT(in.size() <= 1, p,
              "takes at most a key array, got " + std::to_string(in.size()) + " operands");
  KILN_EXPECT(
      (in.empty() || in[0] == Aval{{2}, DType::i32}), p,
      "the key array is " + (in.empty() ? std::string() : str(in[0])) + ", expected i32 (2)");
  return {a.shape, a.dtype};
}

}  // namespace

void layout(OpDefs& d) {
  define(d, Op::Reshape,
         {.arity = 1, .infer = reshape_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            ct[0] = reshape(a.g, a.in[0].shape());
          }});
  define(d, Op::Transpose,
         {.arity = 1, .infer = transpose_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            const auto& perm = a.p.attrs<PermAttrs>().perm;
            std::vector<int> inv(perm.size());
            for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int>(i);
            ct[0] = transpose(a.g, inv);
          }});
  define(d, Op::BroadcastTo,
         {.arity = 1, .infer = broadcast_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            ct[0] = sum_to(a.g, a.in[0].shape());
          }});
  // Each operand's cotangent is its slice of g.
  define(d, Op::Concatenate,
         {.infer = concatenate_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            const int ax = a.p.attrs<AxisAttrs>().axis;
            int64_t offset = 0;
            for (size_t i = 0; i < a.in.size(); ++i) {
              const int64_t n = a.in[i].shape()[ax];
              if (a.want(i)) {
                Shape start(a.g.ndim(), 0), stop = a.g.shape();
                start[ax] = offset;
                stop[ax] = offset + n;
                ct[i] = slice(a.g, start, stop);
              }
              offset += n;
            }
          }});
  define(d, Op::Slice,
         {.arity = 1, .infer = slice_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            ct[0] = slice_grad(a.g, a.p.attrs<SliceAttrs>());
          }});
  define(
      d, Op::SliceGrad,
      {.arity = 1, .infer = slice_grad_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
         const auto& s = a.p.attrs<SliceAttrs>();
         ct[0] = slice(a.g, s.start, s.stop, s.step);
       }});
  // Take(a, indices) and ScatterAdd(indices, updates) are each other's VJP.
  define(d, Op::Take,
         {.arity = 2, .infer = take_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            if (a.want(0))
              ct[0] = scatter_add(a.in[1], a.g, a.p.attrs<AxisAttrs>().axis, a.in[0].shape());
          }});
  define(
      d, Op::ScatterAdd,
      {.arity = 2, .infer = scatter_add_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
         if (a.want(1)) ct[1] = take(a.g, a.in[0], a.p.attrs<ScatterAttrs>().axis);
       }});
  // DynamicSlice and DynamicUpdateSlice are each other's VJP (the starts
  // get none).
  define(d, Op::DynamicSlice,
         {.arity = 2,
          .infer = dynamic_slice_type,
          .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            if (a.want(0))
              ct[0] = dynamic_update_slice(
                  zeros(a.in[0].shape(), a.in[0].dtype(), a.in[0].device()), a.g, a.in[1]);
          }});
  define(d, Op::DynamicUpdateSlice,
         {.arity = 3,
          .infer = dynamic_update_slice_type,
          .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            if (a.want(0))
              ct[0] = dynamic_update_slice(a.g, zeros(a.in[1].shape(), a.g.dtype(), a.g.device()),
                                           a.in[2]);
            if (a.want(1)) ct[1] = dynamic_slice(a.g, a.in[2], a.in[1].shape());
          }});
  define(d, Op::OneHot, {.arity = 1, .infer = one_hot_type});  // from integer labels: no cotangent
  define(d, Op::Copy,
         {.arity = 1, .infer = first_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            ct[0] = a.g.to(a.in[0].device());
          }});
  define(d, Op::Random, {.infer = random_type});  // optionally a key array: no cotangent
  // Any shape and dtype, with no operands: the creation functions run it at
  // once into an array they made.
  define(d, Op::Fill,
         {.arity = 0, .check = [](const Primitive& p, const std::vector<Aval>&, const Aval& out) {
            KILN_EXPECT(out.dtype != DType::f16, p, "fills f16, which kiln does not support");
          }});
}

}  // namespace kiln::defs
