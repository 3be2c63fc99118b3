// kiln cpu backend: its kernel table and what it supports, registered by
// register_builtin_backends (src/backend/registry.cpp).
#include <algorithm>

#include "backend/collectives.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/sgemm.h"
#include "kiln/ops.h"
#include "ops/op_facts.h"

namespace kiln {
namespace cpu {
namespace {

// What the cpu backend runs beyond having a kernel: the fused primitives'
// steps (every FusedElementwise/FusedReduce instruction an f32 scalar op,
// GEMM epilogues oneDNN's post-ops can run).
bool supports(const Primitive& p, const std::vector<DType>& inputs, DType out) {
  auto fusable = [](const FusedAttrs& f) {
    for (const auto& ins : f.program)
      if (!op_has(ins.op, kFusable)) return false;
    return true;
  };
  // Fused programs read f32 or bf16 (widened as they are read) and compute
  // in f32; FusedElementwise may round its result to bf16 as it stores it.
  auto f32_or_bf16 = [](DType d) { return d == DType::f32 || d == DType::bf16; };
  const bool program_dtypes = std::all_of(inputs.begin(), inputs.end(), f32_or_bf16);
  const Attrs& a = p.attrs_variant();
  switch (p.op()) {
    case Op::MatmulEpilogue:
      return std::holds_alternative<EpilogueAttrs>(a) &&
             supports_epilogue(p.attrs<EpilogueAttrs>(), inputs, out);
    case Op::FusedElementwise:
      return std::holds_alternative<FusedAttrs>(a) && fusable(p.attrs<FusedAttrs>()) &&
             program_dtypes && f32_or_bf16(out);
    case Op::FusedReduce:
      return std::holds_alternative<FusedReduceAttrs>(a) &&
             fusable(p.attrs<FusedReduceAttrs>().body) &&
             fusable(p.attrs<FusedReduceAttrs>().epilogue) && program_dtypes && out == DType::f32;
    case Op::LayerNorm:  // the input's dtype, or bf16 from f32
    case Op::SoftmaxCrossEntropyGrad:
      return !inputs.empty() &&
             (out == inputs[0] || (inputs[0] == DType::f32 && out == DType::bf16));
    case Op::LayerNormGrad:
    case Op::LayerNormParamGrad: {  // dy may be bf16 for f32 x (nn.cpp's with_dy)
      const size_t dy = layer_norm_dy_slot(p, inputs.size());
      for (size_t j = 0; j < inputs.size(); ++j)
        if (inputs[j] != inputs[0] &&
            !(j == dy && inputs[0] == DType::f32 && inputs[j] == DType::bf16))
          return false;
      return true;
    }
    default: return true;
  }
}

}  // namespace

void register_backend() {
  static KernelTable table;
  register_elementwise(table);
  register_reduce(table);
  register_matmul(table);
  register_layout(table);
  register_nn(table);
  register_conv(table);
  register_random(table);
  register_fused(table);
  register_attention(table);
  register_transfer(table);
  dist::register_host_collectives(table);
  table.supports = supports;
  register_kernels(DeviceType::cpu, &table);
}

}  // namespace cpu

void set_num_threads(int n) {
  if (n < 1) fail("set_num_threads", "thread count must be positive, got " + std::to_string(n));
  omp_set_num_threads(n);
}
int num_threads() {
  return omp_get_max_threads();
}
std::string cpu_gemm_library() {
  return cpu::sgemm_library_name();
}
std::string cpu_gemm_library_reason() {
  return cpu::sgemm_library_reason();
}
std::string cpu_gemm_isa() {
  if (cpu::sgemm_runs_avx512()) return "AVX-512";
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "AVX2" : "SSE";
}
bool cpu_bf16_gemm_native() {
  return cpu::native_bf16_gemm();
}
std::string cpu_bf16_gemm_unit() {
  const std::string unit = cpu::bf16_gemm_unit();
  return unit.empty() ? cpu_gemm_isa() : unit;
}

}  // namespace kiln
