// kiln ops: what the families of op definitions (src/ops/defs/*.cpp) share.
#pragma once
#include "kiln/ops.h"
#include "ops/op_defs.h"

namespace kiln::defs {

// Defines `op` in d.
inline void define(OpDefs& d, Op op, OpDef def) {
  def.defined = true;
  d[static_cast<int>(op)] = def;
}

// The error of differentiating a backward-only primitive.
inline constexpr const char* kNoSecondOrder =
    " is the backward of another primitive; differentiating it (a second derivative) is not "
    "supported";

inline Array zero_like_scalar(const Array& g) {
  return scalar_like(g, 0.0);
}

}  // namespace kiln::defs
