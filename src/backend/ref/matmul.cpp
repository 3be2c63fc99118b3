// kiln ref backend: Matmul and MatmulEpilogue — the triple loop in f64 over
// [batch, M, K] x [batch, K, N] (transposes as index swaps; a batch of one,
// or a rank-2 operand, is shared by every batch), then the epilogue's steps
// through scalar<op> on each result before it is stored. The epilogue rounds
// the product and each step's result to the output's dtype (f32 for a bf16
// output, which is then rounded once as it is stored), as the unfused Matmul,
// elementwise ops and cast store them: fusing changes no bit.
#include <algorithm>
#include <cstdint>

#include "backend/ref/ref_common.h"
#include "ops/op_defs.h"

namespace kiln::ref {
namespace {

struct Gemm : GemmDims {
  int64_t batch = 1;  // max(batch_a, batch_b)
};

Gemm gemm_of(const MatmulAttrs& attrs, const Array& a, const Array& b) {
  Gemm g;
  static_cast<GemmDims&>(g) =
      matmul_dims(a.shape(), b.shape(), attrs.transpose_a, attrs.transpose_b, "matmul");
  g.batch = std::max(g.batch_a, g.batch_b);
  return g;
}

void check_float(const Primitive& p, const Array& a, const Array& b) {
  for (const Array* x : {&a, &b})
    if (!is_floating(x->dtype()) || x->dtype() == DType::f16)
      fail(p.name(), std::string("no ref kernel for dtype ") + name_of(x->dtype()));
}

// C [batch, M, N] in f64, row-major.
std::vector<double> gemm(const Gemm& g, const std::vector<double>& a,
                         const std::vector<double>& b) {
  std::vector<double> c(g.batch * g.m * g.n, 0.0);
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const double* A = a.data() + (g.batch_a == 1 ? 0 : bi) * g.m * g.k;
    const double* B = b.data() + (g.batch_b == 1 ? 0 : bi) * g.k * g.n;
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < g.k; ++p)
          s += (g.ta ? A[p * g.m + i] : A[i * g.k + p]) * (g.tb ? B[j * g.k + p] : B[p * g.n + j]);
        c[(bi * g.m + i) * g.n + j] = s;
      }
  }
  return c;
}

void matmul_kernel(const KernelContext&, const Primitive& p,
                   const std::vector<Array>& in, ArrayNode& out) {
  check_float(p, in[0], in[1]);
  const Gemm g = gemm_of(p.attrs<MatmulAttrs>(), in[0], in[1]);
  std::vector<double> c = gemm(g, load(in[0]), load(in[1]));
  // A bf16 result is rounded from the f32 one, as the other backends
  // accumulate in f32 (and as Matmul-then-cast gives).
  if (out.dtype == DType::bf16) round_to(c, DType::f32);
  store(out, c);
}

// Each step applies its op to the running value (the left operand) and, for a
// binary step, operand 2 + step.operand read at output element i as Whole
// (element i), Row (element i mod N: one value per output column) or Scalar.
void matmul_epilogue_kernel(const KernelContext&, const Primitive& p,
                            const std::vector<Array>& in, ArrayNode& out) {
  const auto& attrs = p.attrs<EpilogueAttrs>();
  check_float(p, in[0], in[1]);
  const Gemm g = gemm_of(attrs.mm, in[0], in[1]);
  std::vector<double> c = gemm(g, load(in[0]), load(in[1]));
  // A bf16 result (a cast the compiler folded in) is the f32 epilogue's,
  // rounded once as it is stored.
  const DType compute = out.dtype == DType::bf16 ? DType::f32 : out.dtype;
  round_to(c, compute);
  std::vector<std::vector<double>> operands;
  for (size_t i = 2; i < in.size(); ++i) operands.push_back(load(in[i]));
  for (const auto& st : attrs.steps) {
    if (st.operand >= static_cast<int>(operands.size()))
      fail("MatmulEpilogue", "epilogue operand " + std::to_string(st.operand) + " of " +
                                 std::to_string(operands.size()));
    visit_scalar(st.op, "MatmulEpilogue", [&](auto o) {
      constexpr Op k = decltype(o)::value;
      if constexpr (op_kind(k) == OpKind::Compare) {
        fail("MatmulEpilogue", std::string("cannot run ") + op_name(k));
      } else if constexpr (op_kind(k) == OpKind::Unary) {
        for (double& v : c) v = scalar<k>(v);
      } else {
        if (st.operand < 0) fail("MatmulEpilogue", std::string(op_name(k)) + " needs an operand");
        const std::vector<double>& x = operands[st.operand];
        for (size_t i = 0; i < c.size(); ++i) {
          const double y = st.read == FusedRead::Whole ? x[i]
                           : st.read == FusedRead::Row ? x[i % g.n]
                                                       : x[0];
          c[i] = scalar<k>(c[i], y);
        }
      }
    });
    round_to(c, compute);
  }
  store(out, c);
}

}  // namespace

void register_matmul(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Matmul)] = matmul_kernel;
  t.kernels[static_cast<int>(Op::MatmulEpilogue)] = matmul_epilogue_kernel;
}

}  // namespace kiln::ref
