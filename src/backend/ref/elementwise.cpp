// kiln ref backend: elementwise kernels — unary, binary and comparison ops
// through scalar<op> (floats in f64, integers and bools in int64, exactly),
// with NumPy broadcasting; where; cast. (The views' entries, which run
// nothing, come from register_views_and_scalar_ops, as on every backend.)
#include <cstdint>

#include "backend/ref/ref_common.h"

namespace kiln::ref {
namespace {

bool integer_like(DType dt) {
  return is_integral(dt) || dt == DType::bool_;
}

[[noreturn]] void no_kernel(const Primitive& p, DType dt) {
  fail(p.name(), std::string("no ref kernel for dtype ") + name_of(dt));
}

// Neg, ReLU and Abs also run on integers; the other unary ops on floats
// (f32, f64, bf16), as on the cpu backend.
void unary_kernel(const KernelContext&, const Primitive& p,
                  const std::vector<Array>& in, ArrayNode& out) {
  const DType dt = in[0].dtype();
  const bool integer = is_integral(dt);
  if (dt == DType::bool_ || dt == DType::f16 || (integer && !op_has(p.op(), kIntegers)))
    no_kernel(p, dt);
  const std::vector<double> x = load(in[0]);
  std::vector<double> y(x.size());
  visit_scalar(p.op(), p.name(), [&](auto o) {
    constexpr Op k = decltype(o)::value;
    if constexpr (op_kind(k) != OpKind::Unary) {
      fail(p.name(), "not a unary primitive");
    } else {
      for (size_t i = 0; i < x.size(); ++i) {
        if constexpr (op_has(k, kIntegers)) {
          if (integer) {
            y[i] = static_cast<double>(scalar<k>(static_cast<int64_t>(x[i])));
            continue;
          }
        }
        y[i] = scalar<k>(x[i]);
      }
    }
  });
  store(out, y);
}

// The flat index of each operand (of shape s) at every output element.
std::vector<int64_t> operand_indices(const Shape& out, const Shape& s) {
  std::vector<int64_t> idx(numel(out));
  for (int64_t i = 0; i < static_cast<int64_t>(idx.size()); ++i)
    idx[i] = s == out ? i : broadcast_index(unravel(i, out), s);
  return idx;
}

// Binary and comparison ops: out[i] = op(a[ia], b[ib]) over the broadcast
// shape. Operands share a dtype (the op constructors promote them).
void binary_kernel(const KernelContext&, const Primitive& p,
                   const std::vector<Array>& in, ArrayNode& out) {
  const DType dt = in[0].dtype();
  const bool compare = op_kind(p.op()) == OpKind::Compare;
  if (dt == DType::f16 || (!compare && dt == DType::bool_)) no_kernel(p, dt);
  const bool integer = integer_like(dt);
  const std::vector<double> a = load(in[0]), b = load(in[1]);
  if (integer && p.op() == Op::Div)
    for (double d : b)
      if (d == 0) fail("divide", "integer division by zero");
  const std::vector<int64_t> ia = operand_indices(out.shape, in[0].shape());
  const std::vector<int64_t> ib = operand_indices(out.shape, in[1].shape());
  std::vector<double> y(ia.size());
  visit_scalar(p.op(), p.name(), [&](auto o) {
    constexpr Op k = decltype(o)::value;
    if constexpr (op_kind(k) != OpKind::Binary && op_kind(k) != OpKind::Compare) {
      fail(p.name(), "not a binary or comparison primitive");
    } else {
      for (size_t i = 0; i < y.size(); ++i) {
        const double x = a[ia[i]], z = b[ib[i]];
        if (integer)
          y[i] = static_cast<double>(scalar<k>(static_cast<int64_t>(x), static_cast<int64_t>(z)));
        else
          y[i] = static_cast<double>(scalar<k>(x, z));
      }
    }
  });
  store(out, y);
}

// out = cond ? a : b, all three broadcast to the output's shape.
void where_kernel(const KernelContext&, const Primitive& p,
                  const std::vector<Array>& in, ArrayNode& out) {
  if (in[1].dtype() == DType::f16) no_kernel(p, in[1].dtype());
  const std::vector<double> c = load(in[0]), a = load(in[1]), b = load(in[2]);
  const std::vector<int64_t> ic = operand_indices(out.shape, in[0].shape());
  const std::vector<int64_t> ia = operand_indices(out.shape, in[1].shape());
  const std::vector<int64_t> ib = operand_indices(out.shape, in[2].shape());
  std::vector<double> y(ic.size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = c[ic[i]] != 0 ? a[ia[i]] : b[ib[i]];
  store(out, y);
}

// A dtype conversion, element by element with kiln's conversion rule (the
// one rule every backend shares: bool is x != 0, bf16 rounds through f32,
// floats to integers truncate).
void cast_kernel(const KernelContext&, const Primitive&,
                 const std::vector<Array>& in, ArrayNode& out) {
  void* y = alloc_output(out);
  const char* x = static_cast<const char*>(in[0].raw());
  const size_t sx = size_of(in[0].dtype()), sy = size_of(out.dtype);
  for (int64_t i = 0; i < in[0].size(); ++i)
    convert(x + i * sx, in[0].dtype(), static_cast<char*>(y) + i * sy, out.dtype, 1);
}

}  // namespace

void register_elementwise(KernelTable& t) {
  // The reference's binary kernel computes comparisons too.
  register_views_and_scalar_ops(t, unary_kernel, binary_kernel, binary_kernel);
  t.kernels[static_cast<int>(Op::Where)] = where_kernel;
  t.kernels[static_cast<int>(Op::Cast)] = cast_kernel;
}

}  // namespace kiln::ref
