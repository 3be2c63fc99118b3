// kiln cpu backend: the f32 GEMM every unbatched matmul and the attention
// kernels run on.
//
// Two libraries can serve it: Intel oneMKL's cblas_sgemm, when kiln was built
// with it (scripts/setup.sh fetches it from PyPI; CMake finds it in .deps/mkl),
// and oneDNN's dnnl_sgemm, always there. Which is faster depends on the
// machine, not on the vendor: on an Intel Xeon inside a ViT-S/16 training step
// oneMKL's GEMMs took 5-9% less time, ViT-Ti's and ViT-B's were level
// (bench/results/2026-11-30-sgemm-mkl-cpu/); on AMD CPUs oneMKL runs its
// AVX2 kernels even where the CPU has AVX-512. So by default (KILN_SGEMM unset
// or auto) the first process on a machine times a linear layer's three
// training GEMMs on both (~0.2 s) and every process uses the faster,
// remembered in ~/.cache/kiln per CPU, ISA caps, thread count and library
// versions. KILN_SGEMM=onemkl|onednn (or set_sgemm_library) fixes the choice.
#pragma once
#include <cstdint>
#include <string>

namespace kiln::cpu {

enum class SgemmLibrary { onemkl, onednn };

// C[m,n] = alpha · op(A)[m,k] · op(B)[k,n] + beta · C, row-major with leading
// dimensions; op(X) = Xᵀ when its flag is set (then X is stored [k,m] or
// [n,k]). Runs on OpenMP's threads, or on the calling thread alone inside a
// parallel region. `who` names the caller in an error.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
           const char* who);

// The same for bf16 A and B (raw bf16 bits) with f32 C, the products of the
// bf16 values summed in f32: oneMKL's cblas_gemm_bf16bf16f32 where oneMKL is
// built in and the CPU has a bf16 unit that the caps allow (AMX or
// AVX512-BF16: cpu_bf16_gemm_unit()), else A and B widened to f32 (exactly)
// in per-thread buffers and run on sgemm. For kernels that run small GEMMs
// per thread (attention): inside a parallel region it runs on the calling
// thread alone.
void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc,
               const char* who);
// Whether gemm_bf16 runs on oneMKL's bf16 GEMM (else: widened to f32).
bool gemm_bf16_native();

// The library sgemm runs on now, and whether oneMKL is built in.
SgemmLibrary sgemm_library();
bool have_onemkl();
// Raises the error of a bad KILN_SGEMM (kernels that run sgemm inside a
// parallel region call it first).
void check_sgemm_library();
// Selects the library (fails for oneMKL where it is not built in); for tests
// and benchmarks, between kernels, not while one runs.
void set_sgemm_library(SgemmLibrary lib);
// "oneMKL 2026.2 (build 20260915)" or "oneDNN 2.6.3 (dnnl_sgemm)".
std::string sgemm_library_name();
// Why that library: "KILN_SGEMM=onednn", "measured faster on this machine
// (...)", "oneMKL is not built in", ...
std::string sgemm_library_reason();
// Whether the library sgemm runs on now uses AVX-512 on this CPU (false on
// CPUs without it, and where ONEDNN_MAX_CPU_ISA or MKL_ENABLE_INSTRUCTIONS
// caps the library below it).
bool sgemm_runs_avx512();

}  // namespace kiln::cpu
