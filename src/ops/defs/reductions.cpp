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

}  // namespace

void reductions(OpDefs& d) {
  define(d, Op::Sum, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                        const Shape& in = a.in[0].shape();
                        ct[0] = broadcast_to(reshape(a.g, kept_shape(in, a.p.attrs<ReduceAttrs>())),
                                             in);
                      }});
  // The maxima share the cotangent equally.
  define(d, Op::Max, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                        const auto& r = a.p.attrs<ReduceAttrs>();
                        const Shape kept = kept_shape(a.in[0].shape(), r);
                        const Array mask =
                            astype(equal(a.in[0], reshape(a.out, kept)), a.g.dtype());
                        ct[0] = reshape(a.g, kept) * mask / sum(mask, r.axes, true);
                      }});
  define(d, Op::Argmax, {.arity = 1});  // indices: no cotangent
  // Each input element adds to the sums at and after it: its cotangent is
  // the running sum of g the other way.
  define(d, Op::Cumsum, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                           const auto& s = a.p.attrs<ScanAttrs>();
                           ct[0] = cumsum(a.g, s.axis, !s.reverse);
                         }});
  // Indices: no cotangent (sort and top_k differentiate through the gather
  // that applies them).
  define(d, Op::Argsort, {.arity = 1});
}

}  // namespace kiln::defs
