// kiln ops: VJP rules, run from the op definitions (src/ops/defs/). Each
// emits ordinary primitives, so a backward pass is a graph like any other.
#include "ops/vjp.h"

#include "ops/op_defs.h"

namespace kiln {

std::vector<Array> vjp_rule(const Primitive& p, const std::vector<Array>& in, const Array& out,
                            const Array& g, const std::vector<bool>& need) {
  const OpDef& d = op_def(p.op());
  if (d.no_vjp) fail("vjp", std::string(p.name()) + d.no_vjp);
  std::vector<Array> ct(in.size());
  const VjpArgs args{p, in, out, g, need};
  if (d.vjp) d.vjp(args, ct);
  for (size_t i = 0; i < ct.size(); ++i)
    if (!args.want(i)) ct[i] = Array();
  return ct;
}

}  // namespace kiln
