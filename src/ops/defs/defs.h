// kiln ops: what the families of op definitions (src/ops/defs/*.cpp) share.
#pragma once
#include <algorithm>
#include <string>

#include "kiln/ops.h"
#include "ops/op_defs.h"
#include "ops/op_facts.h"
#include "ops/vjp.h"

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

// ---- what the type rules share ----

// Fails, naming primitive p, unless ok; `why` is built only then (the
// verifier runs every rule on every node after every pass).
#define KILN_EXPECT(ok, p, why)         \
  do {                                  \
    if (!(ok)) fail((p).name(), (why)); \
  } while (0)
inline bool is_float(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16;
}
inline void expect_float(const Primitive& p, const Aval& a, const char* what = "operand") {
  KILN_EXPECT(is_float(a.dtype), p,
              std::string(what) + " is " + str(a) + ", expected f32, f64 or bf16");
}
inline void expect_integer(const Primitive& p, const Aval& a, const char* what) {
  KILN_EXPECT(is_integral(a.dtype), p,
              std::string(what) + " are " + str(a) + ", expected i32 or i64");
}
inline void expect_axis(const Primitive& p, int64_t axis, size_t rank) {
  KILN_EXPECT(axis >= 0 && axis < static_cast<int64_t>(rank), p,
              "axis " + std::to_string(axis) + " out of range for rank " + std::to_string(rank));
}
// The first operand's type.
inline Aval first_type(const Primitive&, const std::vector<Aval>& in) {
  return in[0];
}
// A matmul's output: float operands of one dtype, shapes as matmul_dims
// takes them; the dtype is m.out (f32 from bf16 operands, or theirs).
Aval matmul_type(const Primitive& p, const MatmulAttrs& m, const Aval& a, const Aval& b);
// s without `axes` (sorted, unique, in range), or with them as 1 (keepdims).
inline Shape reduced_shape(const Shape& s, const std::vector<int>& axes, bool keepdims) {
  Shape out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool reduced = std::binary_search(axes.begin(), axes.end(), static_cast<int>(i));
    if (!reduced)
      out.push_back(s[i]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

}  // namespace kiln::defs
