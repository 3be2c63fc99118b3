// kiln ops: the scalar function of every elementwise primitive
// (ops/scalar_math.h, written once and used by every backend's kernels and by
// the CUDA code generator), and visit_scalar, which turns a run-time op into
// a compile-time one so that a kernel's inner loop is compiled once per op.
#pragma once
#include <string>
#include <utility>

#include "kiln/error.h"
#include "ops/op_facts.h"
#include "ops/scalar_math.h"

namespace kiln {

namespace scalar_detail {
template <int I, typename F>
inline void visit(Op op, const char* who, F& f) {
  if constexpr (I < kOpCount) {
    constexpr Op o = static_cast<Op>(I);
    if constexpr (op_has(o, kScalar)) {
      if (op == o) return f(std::integral_constant<Op, o>{});
    }
    return visit<I + 1>(op, who, f);
  } else {
    fail(who, std::string(op_name(op)) + " has no scalar function (ops/op_facts.h)");
  }
}
}  // namespace scalar_detail

// Calls f(std::integral_constant<Op, op>{}) for a run-time `op` with a scalar
// function, so that a kernel's inner loop is compiled once per op:
//   visit_scalar(op, "add", [&](auto o) { ... scalar<decltype(o)::value>(x, y) ... });
template <typename F>
inline void visit_scalar(Op op, const char* who, F&& f) {
  scalar_detail::visit<0>(op, who, f);
}

}  // namespace kiln
