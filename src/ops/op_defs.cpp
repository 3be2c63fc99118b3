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
    defs::conv(d);
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

std::string str(const Aval& a) {
  return std::string(name_of(a.dtype)) + " " + str(a.shape);
}

Aval infer_type(const Primitive& p, const std::vector<Aval>& in) {
  const OpDef& d = op_def(p.op());
  if (!d.infer) fail(p.name(), "its output's type is not fixed by its operands and attributes");
  const int want = operand_count(p);
  if (want >= 0 && static_cast<int>(in.size()) != want)
    fail(p.name(),
         "has " + std::to_string(in.size()) + " operands, expected " + std::to_string(want));
  return d.infer(p, in);
}

std::string check_type(const Primitive& p, const std::vector<Aval>& in, const Aval& out) {
  const OpDef& d = op_def(p.op());
  try {
    if (d.check) {
      const int want = operand_count(p);
      if (want >= 0 && static_cast<int>(in.size()) != want)
        return "has " + std::to_string(in.size()) + " operands, expected " + std::to_string(want);
      d.check(p, in, out);
      return {};
    }
    const Aval t = infer_type(p, in);
    const bool narrowed = d.narrows_to_bf16 && t.dtype == DType::f32 && out.dtype == DType::bf16;
    if (t.shape != out.shape || (t.dtype != out.dtype && !narrowed))
      return "is " + str(out) + " where its shape rule gives " + str(t);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

MatmulDims matmul_dims(const Shape& a, const Shape& b, bool transpose_a, bool transpose_b,
                       const char* who) {
  auto shapes = [&] {
    return str(a) + (transpose_a ? "ᵀ" : "") + " @ " + str(b) + (transpose_b ? "ᵀ" : "");
  };
  if (a.size() < 2 || b.size() < 2)
    fail(who, "operands must have rank >= 2, got " + str(a) + " @ " + str(b));
  const size_t ra = a.size(), rb = b.size();
  MatmulDims d;
  d.ta = transpose_a;
  d.tb = transpose_b;
  d.m = a[ra - (transpose_a ? 1 : 2)];
  d.k = a[ra - (transpose_a ? 2 : 1)];
  d.n = b[rb - (transpose_b ? 2 : 1)];
  if (b[rb - (transpose_b ? 1 : 2)] != d.k) fail(who, "inner dimensions differ: " + shapes());
  const Shape ba(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  if (ba != bb && !ba.empty() && !bb.empty())
    fail(who, "batch dimensions differ: " + shapes() +
                  " (they must be equal, or one operand must have rank 2)");
  d.batch_a = numel(ba);
  d.batch_b = numel(bb);
  d.out = ba.empty() ? bb : ba;
  d.out.push_back(d.m);
  d.out.push_back(d.n);
  return d;
}

}  // namespace kiln
