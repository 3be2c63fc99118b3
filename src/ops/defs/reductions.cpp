// kiln ops: the reductions' definitions (Sum, Max, Argmax over any axes),
// the scan's (Cumsum along one axis) and the sort's (Argsort along one axis).
#include "ops/defs/defs.h"

namespace kiln::defs {
namespace {

// The reduced shape with the reduced axes kept (as 1).
Shape kept_shape(const Shape& in, const ReduceAttrs& r) {
  Shape kept = in;
  for (int ax : r.axes) kept[ax] = 1;
  return kept;
}

// Sum, Max, Argmax: numbers over sorted, unique axes in range (Max and
// Argmax over non-empty ones); Argmax gives i32.
Aval reduce_type(const Primitive& p, const std::vector<Aval>& in) {
  const auto& r = p.attrs<ReduceAttrs>();
  const Shape& s = in[0].shape;
  KILN_EXPECT(in[0].dtype != DType::bool_ && in[0].dtype != DType::f16, p,
              "operand is " + str(in[0]) + ", expected a float or integer array");
  for (size_t i = 0; i < r.axes.size(); ++i) {
    expect_axis(p, r.axes[i], s.size());
    KILN_EXPECT(i == 0 || r.axes[i] > r.axes[i - 1], p, "axes are not sorted and unique");
    KILN_EXPECT(p.op() == Op::Sum || s[r.axes[i]] > 0, p,
                "reduction over an empty axis of " + str(s));
  }
  return {reduced_shape(s, r.axes, r.keepdims), p.op() == Op::Argmax ? DType::i32 : in[0].dtype};
}

// Cumsum and Argsort: numbers along one axis; Argsort gives i32.
template <typename A>
Aval along_axis_type(const Primitive& p, const std::vector<Aval>& in) {
  KILN_EXPECT(in[0].dtype != DType::bool_ && in[0].dtype != DType::f16, p,
              "operand is " + str(in[0]) + ", expected a float or integer array");
  expect_axis(p, p.attrs<A>().axis, in[0].shape.size());
  return {in[0].shape, p.op() == Op::Argsort ? DType::i32 : in[0].dtype};
}

}  // namespace

void reductions(OpDefs& d) {
  define(d, Op::Sum,
         {.arity = 1, .infer = reduce_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            const Shape& in = a.in[0].shape();
            ct[0] = broadcast_to(reshape(a.g, kept_shape(in, a.p.attrs<ReduceAttrs>())), in);
          }});
  // The maxima share the cotangent equally.
  define(d, Op::Max,
         {.arity = 1, .infer = reduce_type, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            const auto& r = a.p.attrs<ReduceAttrs>();
            const Shape kept = kept_shape(a.in[0].shape(), r);
            const Array mask = astype(equal(a.in[0], reshape(a.out, kept)), a.g.dtype());
            ct[0] = reshape(a.g, kept) * mask / sum(mask, r.axes, true);
          }});
  define(d, Op::Argmax, {.arity = 1, .infer = reduce_type});  // indices: no cotangent
  // Each input element adds to the sums at and after it: its cotangent is
  // the running sum of g the other way.
  define(d, Op::Cumsum,
         {.arity = 1,
          .infer = along_axis_type<ScanAttrs>,
          .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
            const auto& s = a.p.attrs<ScanAttrs>();
            ct[0] = cumsum(a.g, s.axis, !s.reverse);
          }});
  // Indices: no cotangent (sort and top_k differentiate through the gather
  // that applies them).
  define(d, Op::Argsort, {.arity = 1, .infer = along_axis_type<SortAttrs>});
}

}  // namespace kiln::defs
