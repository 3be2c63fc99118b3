// kiln ops: the table of op definitions, built once from the families'
// (src/ops/defs/), and what is read from it.
#include "ops/op_defs.h"

namespace kiln {

const OpDef& op_def(Op op) {
  static const OpDefs table = [] {
    OpDefs d{};
    defs::elementwise(d);
    defs::reductions(d);
    defs::layout(d);
    defs::nn(d);
    defs::collectives(d);
    defs::compiler_made(d);
    for (int i = 0; i < kOpCount; ++i)
      if (!d[i].defined)
        fail("ops", std::string(op_name(static_cast<Op>(i))) +
                        " has no definition (src/ops/defs/: every primitive needs one)");
    return d;
  }();
  return table[static_cast<int>(op)];
}

int operand_count(const Primitive& p) {
  const OpDef& d = op_def(p.op());
  return d.arity_of ? d.arity_of(p) : d.arity;
}

}  // namespace kiln
