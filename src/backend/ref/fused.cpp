// kiln ref backend: the compiler's fused elementwise primitives in f64 —
// FusedElementwise (a program of scalar<op> instructions over registers) and
// FusedReduce (a body program summed over a group of axes, then its optional
// epilogue program over the sums). Every register is a whole f64 array of
// the program's shape; each instruction is one loop over it. Each
// instruction's result and each sum is rounded to the output's dtype (f32;
// for a bf16 FusedElementwise, f32 and then bf16 as it is stored), as the
// unfused ops would store it, so fusing changes no bit: jit on ref gives
// eager ref's values. Inputs may be bf16 (load widens them). Also round_to.
#include <cstdint>

#include "backend/ref/ref_common.h"

namespace kiln::ref {
namespace {

using Values = std::vector<double>;

// Input x read at each of n positions: Whole (element i), Scalar (element 0)
// or Row (element i mod its size: a row repeated over the leading axes).
Values expand(const Values& x, FusedRead read, int64_t n) {
  if (x.empty() && n > 0) fail("FusedElementwise", "an empty input read by a program");
  Values r(n);
  for (int64_t i = 0; i < n; ++i)
    r[i] = read == FusedRead::Whole    ? x[i]
           : read == FusedRead::Scalar ? x[0]
                                       : x[i % static_cast<int64_t>(x.size())];
  return r;
}

// Runs `f` over n positions, its input registers given in `reg` (n values
// each), every instruction's result rounded to dtype dt; returns its last
// register.
Values run_program(const FusedAttrs& f, std::vector<Values> reg, int64_t n, DType dt) {
  for (const FusedInstr& ins : f.program) {
    const int nregs = static_cast<int>(reg.size());
    if (ins.a < 0 || ins.a >= nregs || ins.b >= nregs)
      fail("FusedElementwise", "an instruction reads a register not yet written");
    Values y(n);
    visit_scalar(ins.op, "FusedElementwise", [&](auto o) {
      constexpr Op k = decltype(o)::value;
      const Values& a = reg[ins.a];
      if constexpr (op_kind(k) == OpKind::Unary) {
        for (int64_t i = 0; i < n; ++i) y[i] = scalar<k>(a[i]);
      } else {
        if (ins.b < 0) fail("FusedElementwise", std::string(op_name(k)) + " needs two registers");
        const Values& b = reg[ins.b];
        for (int64_t i = 0; i < n; ++i) y[i] = static_cast<double>(scalar<k>(a[i], b[i]));
      }
    });
    round_to(y, ins.round_bf16 ? DType::bf16 : dt);
    reg.push_back(std::move(y));
  }
  if (reg.empty()) fail("FusedElementwise", "a program without registers");
  return std::move(reg.back());
}

void fused_kernel(const KernelContext&, const Primitive& p,
                  const std::vector<Array>& in, ArrayNode& out) {
  const auto& f = p.attrs<FusedAttrs>();
  if (f.reads.size() != in.size())
    fail("FusedElementwise", "expected " + std::to_string(f.reads.size()) + " inputs, got " +
                                 std::to_string(in.size()));
  const int64_t n = numel(out.shape);
  std::vector<Values> reg;
  for (size_t k = 0; k < in.size(); ++k) reg.push_back(expand(load(in[k]), f.reads[k], n));
  // A bf16 output (a cast the compiler folded in) computes in f32 and rounds
  // the result once, as it is stored.
  const DType compute = out.dtype == DType::bf16 ? DType::f32 : out.dtype;
  store(out, run_program(f, std::move(reg), n, compute));
}

// Inputs: the body's (one per body read), then the epilogue's other input
// registers in order. The body runs over attrs.shape; its values are summed
// over attrs.reduce.axes into the output (of the reduced shape); the
// epilogue, if any, runs over the sums (register epilogue_sum) and is stored.
void fused_reduce_kernel(const KernelContext&, const Primitive& p,
                         const std::vector<Array>& in, ArrayNode& out) {
  const auto& attrs = p.attrs<FusedReduceAttrs>();
  const size_t nbody = attrs.body.reads.size();
  const bool has_epilogue = !attrs.epilogue.program.empty();
  if (has_epilogue && (attrs.epilogue_sum < 0 ||
                       attrs.epilogue_sum >= static_cast<int>(attrs.epilogue.reads.size())))
    fail("FusedReduce", "the epilogue's sum register is out of range");
  const size_t nepi = has_epilogue ? attrs.epilogue.reads.size() - 1 : 0;
  if (in.size() != nbody + nepi)
    fail("FusedReduce",
         "expected " + std::to_string(nbody + nepi) + " inputs, got " + std::to_string(in.size()));
  // The body's values over its whole shape.
  const Shape& s = attrs.shape;
  const int64_t total = numel(s);
  std::vector<Values> reg;
  for (size_t k = 0; k < nbody; ++k) reg.push_back(expand(load(in[k]), attrs.body.reads[k], total));
  const Values body = run_program(attrs.body, std::move(reg), total, out.dtype);
  // Summed over the reduced axes: each element goes to its multi-index
  // without them.
  std::vector<bool> reduced(s.size(), false);
  for (int a : attrs.reduce.axes) reduced[a] = true;
  Shape kept;
  for (size_t d = 0; d < s.size(); ++d)
    if (!reduced[d]) kept.push_back(s[d]);
  const int64_t n = numel(out.shape);
  Values sums(n, 0.0);
  for (int64_t i = 0; i < total; ++i) {
    std::vector<int64_t> idx = unravel(i, s), k;
    for (size_t d = 0; d < s.size(); ++d)
      if (!reduced[d]) k.push_back(idx[d]);
    sums[ravel(k, kept)] += body[i];
  }
  if (!has_epilogue) return store(out, sums);
  round_to(sums, out.dtype);
  std::vector<Values> ereg;
  size_t next = nbody;
  for (size_t k = 0; k < attrs.epilogue.reads.size(); ++k) {
    if (static_cast<int>(k) == attrs.epilogue_sum)
      ereg.push_back(sums);
    else
      ereg.push_back(expand(load(in[next++]), attrs.epilogue.reads[k], n));
  }
  store(out, run_program(attrs.epilogue, std::move(ereg), n, out.dtype));
}

}  // namespace

void round_to(std::vector<double>& v, DType dt) {
  if (dt == DType::f64) return;
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<char> stored(v.size() * size_of(dt));
  convert(v.data(), DType::f64, stored.data(), dt, n);
  convert(stored.data(), dt, v.data(), DType::f64, n);
}

void register_fused(KernelTable& t) {
  t.kernels[static_cast<int>(Op::FusedElementwise)] = fused_kernel;
  t.kernels[static_cast<int>(Op::FusedReduce)] = fused_reduce_kernel;
}

}  // namespace kiln::ref
