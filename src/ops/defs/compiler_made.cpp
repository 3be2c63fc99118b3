// kiln ops: the definitions of the primitives that only the compiler makes
// (fused elementwise programs, GEMM epilogues, fused reductions), after
// differentiation.
#include "ops/defs/defs.h"
#include "ops/dispatch.h"

namespace kiln::defs {
namespace {

// A fused program's registers are defined before they are read, and its ops
// are fusable, each with the operands its kind takes.
void check_program(const Primitive& p, const FusedAttrs& f, const char* which) {
  const int ni = static_cast<int>(f.reads.size());
  for (size_t i = 0; i < f.program.size(); ++i) {
    const FusedInstr& in = f.program[i];
    const int defined = ni + static_cast<int>(i);
    KILN_EXPECT(op_has(in.op, kFusable), p,
                std::string(which) + std::string(op_name(in.op)) + " is not fusable");
    KILN_EXPECT(
        in.a >= 0 && in.a < defined && in.b < defined &&
            (in.b < 0) == (op_kind(in.op) == OpKind::Unary),
        p,
        std::string(which) + "instruction " + std::to_string(i) + " reads an undefined register");
  }
}

// Operand `index` (of the `kind`) read as `mode` over values of shape `over`: whole (as many
// elements, in order: a reshape is no copy), a scalar, or a row repeated over
// the leading axes.
void check_read(const Primitive& p, FusedRead mode, const Aval& in, const Shape& over,
                const char* kind, size_t index) {
  auto what = [&] { return std::string(kind) + " " + std::to_string(index); };
  const int64_t n = numel(in.shape);
  const bool ok = mode == FusedRead::Whole    ? n == numel(over)
                  : mode == FusedRead::Scalar ? n == 1
                                              : numel(over) % std::max<int64_t>(1, n) == 0;
  KILN_EXPECT(
      ok, p,
      what() + " of shape " + str(in.shape) + " does not fit its read mode over " + str(over));
  KILN_EXPECT(in.dtype == DType::f32 || in.dtype == DType::bf16, p,
              what() + " is " + str(in) + ", expected f32 (or bf16, widened as it is read)");
}

void check_fused_elementwise(const Primitive& p, const std::vector<Aval>& in, const Aval& out) {
  const auto& f = p.attrs<FusedAttrs>();
  check_program(p, f, "");
  for (size_t j = 0; j < in.size(); ++j) check_read(p, f.reads[j], in[j], out.shape, "operand", j);
  KILN_EXPECT(out.dtype == DType::f32 || out.dtype == DType::bf16, p,
              "writes " + str(out) + ", expected f32 or bf16");
}

// The matmul's output, which every step's operand fits as its read mode
// says (a row: one value per output column).
Aval matmul_epilogue_type(const Primitive& p, const std::vector<Aval>& in) {
  const auto& e = p.attrs<EpilogueAttrs>();
  const Shape out = matmul_type(p, e.mm, in[0], in[1]).shape;
  for (size_t i = 0; i < e.steps.size(); ++i) {
    const EpilogueStep& st = e.steps[i];
    KILN_EXPECT(op_has(st.op, kFusable) && (st.operand < 0) == (op_kind(st.op) == OpKind::Unary), p,
                "step " + std::to_string(i) + " (" + op_name(st.op) +
                    ") is not a fusable op with " + "the operands its kind takes");
    if (st.operand < 0) continue;
    const size_t k = 2 + st.operand;
    KILN_EXPECT(k < in.size(), p, "step " + std::to_string(i) + " reads a missing operand");
    const int64_t want = st.read == FusedRead::Whole ? numel(out)
                         : st.read == FusedRead::Row ? out.back()
                                                     : 1;
    KILN_EXPECT(numel(in[k].shape) == want && is_float(in[k].dtype), p,
                "step " + std::to_string(i) + "'s operand is " + str(in[k]) + ", expected " +
                    std::to_string(want) + " float values for the output " + str(out));
  }
  return {out, e.mm.out};
}

// The body's sums over `reduce.axes` of `shape`, through the epilogue, in
// any shape of as many elements (the fusion takes in a reshape after it), f32
// or bf16.
void check_fused_reduce(const Primitive& p, const std::vector<Aval>& in, const Aval& result) {
  const auto& a = p.attrs<FusedReduceAttrs>();
  check_program(p, a.body, "body: ");
  const size_t nb = a.body.reads.size();
  for (size_t j = 0; j < nb; ++j) check_read(p, a.body.reads[j], in[j], a.shape, "body operand", j);
  for (size_t i = 0; i < a.reduce.axes.size(); ++i) {
    expect_axis(p, a.reduce.axes[i], a.shape.size());
    KILN_EXPECT(i == 0 || a.reduce.axes[i] > a.reduce.axes[i - 1], p,
                "axes are not sorted and unique");
  }
  const Shape sums = reduced_shape(a.shape, a.reduce.axes, a.reduce.keepdims);
  KILN_EXPECT(numel(result.shape) == numel(sums), p,
              "writes " + str(result) + ", not the " + std::to_string(numel(sums)) + " sums of " +
                  str(sums));
  KILN_EXPECT(result.dtype == DType::f32 || result.dtype == DType::bf16, p,
              "writes " + str(result) + ", expected f32 or bf16");
  const Shape& out = result.shape;
  if (!a.epilogue.program.empty()) {
    check_program(p, a.epilogue, "epilogue: ");
    const int ne = static_cast<int>(a.epilogue.reads.size());
    KILN_EXPECT(a.epilogue_sum >= 0 && a.epilogue_sum < ne, p,
                "the epilogue's sum register is missing");
    for (int r = 0, j = static_cast<int>(nb); r < ne; ++r) {
      if (r == a.epilogue_sum) continue;
      check_read(p, a.epilogue.reads[r], in[j], out, "epilogue operand", r);
      ++j;
    }
  }
}

// ---- fallbacks: the fused programs run as one primitive per instruction,
// in f32 ----

// Operand x read as `mode` over values of shape `over`, in f32 and shaped to
// broadcast there: whole, a scalar, or a row (the trailing axes of `over`
// that hold its elements).
Array read_as(const Array& x, FusedRead mode, const Shape& over) {
  const Array w = astype(x, DType::f32);
  if (mode == FusedRead::Whole) return w.shape() == over ? w : reshape(w, over);
  if (mode == FusedRead::Scalar) return reshape(w, {});
  Shape tail;
  for (size_t d = over.size(); d-- > 0 && numel(tail) < w.size();)
    tail.insert(tail.begin(), over[d]);
  return reshape(w, tail);
}

// The program's last register, its first ones `regs`, broadcast to `over`.
Array run_program(const FusedAttrs& f, std::vector<Array> regs, const Shape& over) {
  for (const FusedInstr& i : f.program) {
    std::vector<Array> operands{regs[i.a]};
    if (i.b >= 0) operands.push_back(regs[i.b]);
    Array r = apply(Primitive(i.op), std::move(operands));
    regs.push_back(i.round_bf16 ? astype(astype(r, DType::bf16), DType::f32) : r);
  }
  return regs.back().shape() == over ? regs.back() : broadcast_to(regs.back(), over);
}

Array fused_elementwise_fallback(const Primitive& p, const std::vector<Array>& in,
                                 const Aval& out) {
  const auto& f = p.attrs<FusedAttrs>();
  std::vector<Array> regs;
  for (size_t j = 0; j < in.size(); ++j) regs.push_back(read_as(in[j], f.reads[j], out.shape));
  return run_program(f, std::move(regs), out.shape);
}

// The matmul in f32 (f64 for f64 operands), then its steps.
Array matmul_epilogue_fallback(const Primitive& p, const std::vector<Array>& in, const Aval& out) {
  const auto& e = p.attrs<EpilogueAttrs>();
  const DType acc = in[0].dtype() == DType::f64 ? DType::f64 : DType::f32;
  Array y = matmul(in[0], in[1],
                   {e.mm.transpose_a, e.mm.transpose_b, acc,
                    e.mm.tf32 ? MatmulPrecision::tf32 : MatmulPrecision::fp32});
  for (const EpilogueStep& st : e.steps) {
    if (st.operand < 0) {
      y = apply(Primitive(st.op), {y});
      continue;
    }
    const Array& x = in[2 + st.operand];
    const Shape shape = st.read == FusedRead::Whole ? out.shape
                        : st.read == FusedRead::Row ? Shape{out.shape.back()}
                                                    : Shape{};
    y = apply(Primitive(st.op), {y, reshape(astype(x, acc), shape)});
  }
  return y;
}

// The body over `shape`, summed over the axes, then the epilogue over the
// sums (its register epilogue_sum).
Array fused_reduce_fallback(const Primitive& p, const std::vector<Array>& in, const Aval& out) {
  const auto& a = p.attrs<FusedReduceAttrs>();
  const size_t nb = a.body.reads.size();
  std::vector<Array> regs;
  for (size_t j = 0; j < nb; ++j) regs.push_back(read_as(in[j], a.body.reads[j], a.shape));
  const Array sums =
      reshape(sum(run_program(a.body, std::move(regs), a.shape), a.reduce.axes, a.reduce.keepdims),
              out.shape);
  if (a.epilogue.program.empty()) return sums;
  std::vector<Array> epi;
  size_t j = nb;
  for (int r = 0; r < static_cast<int>(a.epilogue.reads.size()); ++r)
    epi.push_back(r == a.epilogue_sum ? sums : read_as(in[j++], a.epilogue.reads[r], out.shape));
  return run_program(a.epilogue, std::move(epi), out.shape);
}

}  // namespace

void compiler_made(OpDefs& d) {
  constexpr const char* kWhy = " exists only inside compiled graphs, after differentiation";
  define(
      d, Op::FusedElementwise,
      {.arity_of =
           [](const Primitive& p) { return static_cast<int>(p.attrs<FusedAttrs>().reads.size()); },
       .check = check_fused_elementwise,
       .no_vjp = kWhy,
       .fallback = fused_elementwise_fallback});
  // a, b, then one operand per binary step.
  define(d, Op::MatmulEpilogue,
         {.arity_of =
              [](const Primitive& p) {
                int n = 2;
                for (const auto& st : p.attrs<EpilogueAttrs>().steps) n += st.operand >= 0;
                return n;
              },
          .infer = matmul_epilogue_type,
          .no_vjp = kWhy,
          .fallback = matmul_epilogue_fallback});
  // The body's reads, then the epilogue's but the sums' register.
  define(d, Op::FusedReduce,
         {.arity_of =
              [](const Primitive& p) {
                const auto& a = p.attrs<FusedReduceAttrs>();
                const int epi = static_cast<int>(a.epilogue.reads.size());
                return static_cast<int>(a.body.reads.size()) +
                       (a.epilogue.program.empty() ? 0 : epi - 1);
              },
          .check = check_fused_reduce,
          .no_vjp = kWhy,
          .fallback = fused_reduce_fallback});
}

}  // namespace kiln::defs
