// kiln cpu backend: kernel registration, one function per kernel family.
#pragma once
#include "backend/cpu/cpu_common.h"

namespace kiln::cpu {

// Registers the cpu backend's kernel table (called by register_builtin_backends).
void register_backend();

void register_elementwise(KernelTable& t);
void register_reduce(KernelTable& t);
void register_matmul(KernelTable& t);
void register_layout(KernelTable& t);
void register_nn(KernelTable& t);
void register_conv(KernelTable& t);
void register_random(KernelTable& t);
void register_fused(KernelTable& t);
void register_attention(KernelTable& t);
void register_transfer(KernelTable& t);
// Whether MatmulEpilogue runs these steps on these dtypes (oneDNN has a
// post-op for each step; matmul.cpp).
bool supports_epilogue(const EpilogueAttrs& attrs, const std::vector<DType>& inputs, DType out);
// Whether bf16 matmuls run natively (oneDNN on a bf16 unit) on this CPU,
// rather than widened to f32 by kiln (probed once; matmul.cpp).
bool native_bf16_gemm();
// The matrix unit oneDNN runs bf16 GEMMs on: "AMX", "AVX512-BF16", or ""
// where there is none (kiln widens the operands and runs them at the f32 rate).
std::string bf16_gemm_unit();

// y[i] = op(a[i]) or op(a[i], b[i]) for the f32 ops FusedElementwise runs
// (y may alias a or b).
void run_pointwise(Op op, float* y, const float* a, const float* b, int64_t n);

}  // namespace kiln::cpu
