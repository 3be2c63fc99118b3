// kiln cpu backend: f32 GEMM on oneMKL or oneDNN (see sgemm.h).
#include "backend/cpu/sgemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kiln/error.h"

#ifdef KILN_HAVE_MKL
#include <mkl_cblas.h>
#include <mkl_service.h>
#endif

namespace kiln::cpu {
namespace {

// The library KILN_SGEMM asks for, chosen once; a bad value is kept as an
// error and raised by the next sgemm outside a parallel region (never inside
// one, where an exception would end the process).
struct Choice {
  std::atomic<SgemmLibrary> lib{SgemmLibrary::onednn};
  std::string error;
  Choice() {
    const char* env = std::getenv("KILN_SGEMM");
    const std::string want = env ? env : "";
    if (want.empty()) {
      lib = have_onemkl() ? SgemmLibrary::onemkl : SgemmLibrary::onednn;
    } else if (want == "onednn") {
      lib = SgemmLibrary::onednn;
    } else if (want == "onemkl" && have_onemkl()) {
      lib = SgemmLibrary::onemkl;
    } else if (want == "onemkl") {
      error =
          "KILN_SGEMM is 'onemkl', but kiln was built without oneMKL (scripts/fetch-mkl.sh "
          "fetches it into .deps/mkl)";
    } else {
      error = "KILN_SGEMM is '" + want + "', expected onemkl or onednn";
    }
  }
};

Choice& choice() {
  static Choice c;
  return c;
}

}  // namespace

bool have_onemkl() {
#ifdef KILN_HAVE_MKL
  return true;
#else
  return false;
#endif
}

SgemmLibrary sgemm_library() {
  return choice().lib.load(std::memory_order_relaxed);
}

void check_sgemm_library() {
  if (!choice().error.empty()) fail("sgemm", choice().error);
}

void set_sgemm_library(SgemmLibrary lib) {
  if (lib == SgemmLibrary::onemkl && !have_onemkl())
    fail("sgemm", "kiln was built without oneMKL (scripts/fetch-mkl.sh fetches it into .deps/mkl)");
  choice().lib.store(lib, std::memory_order_relaxed);
  choice().error.clear();
}

std::string sgemm_library_name() {
  check_sgemm_library();
#ifdef KILN_HAVE_MKL
  if (sgemm_library() == SgemmLibrary::onemkl) {
    MKLVersion v;  // 2026.2 reports major 2026, minor 0, update 2
    mkl_get_version(&v);
    return "oneMKL " + std::to_string(v.MajorVersion) + "." + std::to_string(v.UpdateVersion) +
           " (build " + v.Build + ")";
  }
#endif
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " (dnnl_sgemm)";
}

bool sgemm_runs_avx512() {
  if (!__builtin_cpu_supports("avx512f")) return false;
#ifdef KILN_HAVE_MKL
  if (sgemm_library() == SgemmLibrary::onemkl) {
    // The code path oneMKL chose for this CPU (MKL_ENABLE_INSTRUCTIONS caps
    // it), e.g. "Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors".
    MKLVersion v;
    mkl_get_version(&v);
    return std::string(v.Processor).find("AVX-512") != std::string::npos;
  }
#endif
  // oneDNN's (ONEDNN_MAX_CPU_ISA caps it).
  return (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
}

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
           const char* who) {
  if (!omp_in_parallel()) check_sgemm_library();
#ifdef KILN_HAVE_MKL
  // oneMKL's LP64 interface takes 32-bit sizes; larger ones go to oneDNN.
  const int64_t largest = std::max({m, n, k, lda, ldb, ldc});
  if (sgemm_library() == SgemmLibrary::onemkl && largest <= INT32_MAX) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                static_cast<MKL_INT>(m), static_cast<MKL_INT>(n), static_cast<MKL_INT>(k), alpha, a,
                static_cast<MKL_INT>(lda), b, static_cast<MKL_INT>(ldb), beta, c,
                static_cast<MKL_INT>(ldc));
    return;
  }
#endif
  dnnl_status_t st =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success) fail(who, "dnnl_sgemm failed with status " + std::to_string(st));
}

}  // namespace kiln::cpu
