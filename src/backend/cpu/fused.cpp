// kiln cpu backend: FusedElementwise — a chain of f32 elementwise ops run as
// one pass over memory. The output is processed in chunks small enough that
// every intermediate register stays in L1.
#include "backend/cpu/kernels.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kChunk = 256;

template <typename F>
inline void map1(float* y, const float* a, int64_t n, F f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = f(a[i]);
}
template <typename F>
inline void map2(float* y, const float* a, const float* b, int64_t n, F f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
}

}  // namespace

void run_pointwise(Op op, float* y, const float* a, const float* b, int64_t n) {
  switch (op) {
    case Op::Neg: return map1(y, a, n, [](float x) { return -x; });
    case Op::Exp: return map1(y, a, n, [](float x) { return exp_approx(x); });
    case Op::Log: return map1(y, a, n, [](float x) { return std::log(x); });
    case Op::Sqrt: return map1(y, a, n, [](float x) { return std::sqrt(x); });
    case Op::Rsqrt: return map1(y, a, n, [](float x) { return 1.0f / std::sqrt(x); });
    case Op::Tanh: return map1(y, a, n, [](float x) { return std::tanh(x); });
    case Op::Erf: return map1(y, a, n, [](float x) { return std::erf(x); });
    case Op::Gelu: return map1(y, a, n, [](float x) { return gelu_exact(x); });
    case Op::GeluTanh: return map1(y, a, n, [](float x) { return gelu_tanh(x); });
    case Op::GeluGrad: return map1(y, a, n, [](float x) { return gelu_exact_grad(x); });
    case Op::GeluTanhGrad: return map1(y, a, n, [](float x) { return gelu_tanh_grad(x); });
    case Op::Relu: return map1(y, a, n, [](float x) { return x > 0 ? x : 0.0f; });
    case Op::Abs: return map1(y, a, n, [](float x) { return x < 0 ? -x : x; });
    case Op::Add: return map2(y, a, b, n, [](float x, float z) { return x + z; });
    case Op::Sub: return map2(y, a, b, n, [](float x, float z) { return x - z; });
    case Op::Mul: return map2(y, a, b, n, [](float x, float z) { return x * z; });
    case Op::Div: return map2(y, a, b, n, [](float x, float z) { return x / z; });
    case Op::Maximum: return map2(y, a, b, n, [](float x, float z) { return x > z ? x : z; });
    case Op::Minimum: return map2(y, a, b, n, [](float x, float z) { return x < z ? x : z; });
    default: fail("FusedElementwise", std::string("cannot run ") + op_name(op));
  }
}

namespace {

void fused_kernel(const Primitive& p, const std::vector<Array>& in, ArrayNode& out) {
  const auto& attrs = p.attrs<FusedAttrs>();
  const int ni = static_cast<int>(in.size());
  const int nregs = ni + static_cast<int>(attrs.program.size());
  const int64_t total = numel(out.shape);
  float* y = static_cast<float*>(alloc_output(out));
  std::vector<const float*> src(ni);
  std::vector<int64_t> row(ni, 1);
  for (int k = 0; k < ni; ++k) {
    src[k] = in[k].data<float>();
    row[k] = in[k].size();
  }
  parallel_for((total + kChunk - 1) / kChunk, kChunk * nregs, [&](int64_t c0, int64_t c1) {
    std::vector<float> scratch(static_cast<size_t>(nregs) * kChunk);
    std::vector<const float*> reg(nregs);
    for (int64_t c = c0; c < c1; ++c) {
      int64_t base = c * kChunk, n = std::min(kChunk, total - base);
      for (int k = 0; k < ni; ++k) {
        float* buf = scratch.data() + k * kChunk;
        switch (attrs.reads[k]) {
          case FusedRead::Whole: reg[k] = src[k] + base; break;
          case FusedRead::Scalar:
            std::fill_n(buf, n, src[k][0]);
            reg[k] = buf;
            break;
          case FusedRead::Row:
            for (int64_t i = 0; i < n; ++i) buf[i] = src[k][(base + i) % row[k]];
            reg[k] = buf;
            break;
        }
      }
      for (size_t i = 0; i < attrs.program.size(); ++i) {
        const FusedInstr& ins = attrs.program[i];
        bool last = i + 1 == attrs.program.size();
        float* dst = last ? y + base : scratch.data() + (ni + i) * kChunk;
        run_pointwise(ins.op, dst, reg[ins.a], ins.b >= 0 ? reg[ins.b] : nullptr, n);
        reg[ni + i] = dst;
      }
    }
  });
}

}  // namespace

void register_fused(KernelTable& t) {
  t.kernels[static_cast<int>(Op::FusedElementwise)] = fused_kernel;
}

}  // namespace kiln::cpu
