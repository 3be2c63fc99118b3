// kiln cpu backend: kernel registration, one function per kernel family.
#pragma once
#include "backend/cpu/cpu_common.h"

namespace kiln {
struct ConvGeometry;
}

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
// C[m,n] = op(A)[m,k] · op(B)[k,n], row-major and contiguous, op(X) = Xᵀ
// where its flag is set (X then stored [k,m] or [n,k]): f32 operands with an
// f32 result on sgemm; bf16 operands (where native_bf16_gemm()) with an f32
// or bf16 result, the products summed in f32, on oneDNN's matmul. For kernels
// built on GEMMs (a 1x1 convolution; matmul.cpp).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, DType in, DType out, const void* a,
          const void* b, void* c);

// Whether the cpu runs a convolution (each of its passes) as one GEMM:
// a 1x1 window, any stride, no padding, one group, channels-last
// activations (ResNet's bottleneck convolutions and downsampling shortcuts:
// bf16 backward weights at 2-4x the speed of oneDNN 2.6's convolution
// kernels on AMX), unless KILN_CONV says otherwise (conv.cpp).
bool conv_runs_as_gemm(const ConvGeometry& q);

// y[i] = op(a[i]) or op(a[i], b[i]) for the f32 ops FusedElementwise runs
// (y may alias a or b).
void run_pointwise(Op op, float* y, const float* a, const float* b, int64_t n);

}  // namespace kiln::cpu
