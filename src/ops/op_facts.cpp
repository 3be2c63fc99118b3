// kiln ops: the per-op facts that depend on a primitive's attributes (the
// table itself is constexpr, in ops/op_facts.h).
#include "ops/op_facts.h"

namespace kiln {

size_t layer_norm_dy_slot(const Primitive& prim, size_t inputs) {
  if (prim.op() == Op::LayerNormParamGrad) return 1;
  if (prim.op() != Op::LayerNormGrad || inputs == 0) return SIZE_MAX;
  const bool residual =
      std::holds_alternative<NormAttrs>(prim.attrs_variant()) && prim.attrs<NormAttrs>().residual;
  return inputs - (residual ? 2 : 1);
}

bool in_place_safe(const Primitive& prim, size_t j) {
  if (!op_has(prim.op(), kInPlace)) return false;
  if (prim.op() != Op::FusedReduce) return true;
  // An epilogue operand read whole: the epilogue reads each chunk before it
  // stores the chunk's sums.
  const auto& a = prim.attrs<FusedReduceAttrs>();
  const size_t nbody = a.body.reads.size();
  if (a.epilogue.program.empty() || j < nbody) return false;
  size_t r = j - nbody;
  if (static_cast<int>(r) >= a.epilogue_sum) ++r;
  return r < a.epilogue.reads.size() && a.epilogue.reads[r] == FusedRead::Whole;
}

}  // namespace kiln
