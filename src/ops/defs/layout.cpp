// kiln ops: the definitions of the primitives that move values without
// arithmetic — layout (reshape, transpose, broadcast, concatenate, slices,
// gathers and scatters, one-hot), copies between devices — and of the
// sources (Random, Fill).
#include "ops/defs/defs.h"

namespace kiln::defs {

void layout(OpDefs& d) {
  define(d, Op::Reshape, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                            ct[0] = reshape(a.g, a.in[0].shape());
                          }});
  define(d, Op::Transpose, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                              const auto& perm = a.p.attrs<PermAttrs>().perm;
                              std::vector<int> inv(perm.size());
                              for (size_t i = 0; i < perm.size(); ++i)
                                inv[perm[i]] = static_cast<int>(i);
                              ct[0] = transpose(a.g, inv);
                            }});
  define(d, Op::BroadcastTo, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                                ct[0] = sum_to(a.g, a.in[0].shape());
                              }});
  // Each operand's cotangent is its slice of g.
  define(d, Op::Concatenate, {.vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
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
  define(d, Op::Slice, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                          ct[0] = slice_grad(a.g, a.p.attrs<SliceAttrs>());
                        }});
  define(d, Op::SliceGrad, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                              const auto& s = a.p.attrs<SliceAttrs>();
                              ct[0] = slice(a.g, s.start, s.stop, s.step);
                            }});
  // Take(a, indices) and ScatterAdd(indices, updates) are each other's VJP.
  define(d, Op::Take, {.arity = 2, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                         if (a.want(0))
                           ct[0] = scatter_add(a.in[1], a.g, a.p.attrs<AxisAttrs>().axis,
                                               a.in[0].shape());
                       }});
  define(d, Op::ScatterAdd, {.arity = 2, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                               if (a.want(1))
                                 ct[1] = take(a.g, a.in[0], a.p.attrs<ScatterAttrs>().axis);
                             }});
  define(d, Op::OneHot, {.arity = 1});  // from integer labels: no cotangent
  define(d, Op::Copy, {.arity = 1, .vjp = [](const VjpArgs& a, std::vector<Array>& ct) {
                         ct[0] = a.g.to(a.in[0].device());
                       }});
  define(d, Op::Random, {});  // optionally a key array: no cotangent
  define(d, Op::Fill, {.arity = 0});
}

}  // namespace kiln::defs
