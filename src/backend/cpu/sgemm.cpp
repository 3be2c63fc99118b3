// kiln cpu backend: f32 GEMM on oneMKL or oneDNN (see sgemm.h).
#include "backend/cpu/sgemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "backend/cpu/kernels.h"
#include "kiln/error.h"

#ifdef KILN_HAVE_MKL
#include <mkl_cblas.h>
#include <mkl_service.h>
#endif

namespace kiln::cpu {
namespace {

// One f32 GEMM on `lib`, bypassing the choice (the measurement below runs
// both libraries before there is one).
void sgemm_on(SgemmLibrary lib, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc, const char* who) {
#ifdef KILN_HAVE_MKL
  // oneMKL's LP64 interface takes 32-bit sizes; larger ones go to oneDNN.
  const int64_t largest = std::max({m, n, k, lda, ldb, ldc});
  if (lib == SgemmLibrary::onemkl && largest <= INT32_MAX) {
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

const char* library_word(SgemmLibrary lib) {
  return lib == SgemmLibrary::onemkl ? "onemkl" : "onednn";
}

// Seconds each library takes for the three GEMMs of a linear layer's training
// step at ViT-S/16 sizes with 8 images (rows 8·197, 384 <-> 1536): forward
// X·Wᵀ, dX = dY·W, dW = dYᵀ·X; the best of three interleaved rounds of each.
std::pair<double, double> time_both_libraries() {
  struct Shape {
    bool ta, tb;
    int64_t m, n, k;
  } shapes[] = {{false, true, 1576, 1536, 384},
                {false, false, 1576, 384, 1536},
                {true, false, 1536, 384, 1576}};
  const int64_t big = 1576 * 1536;
  std::vector<float> a(big, 0.01f), b(big, 0.02f), c(big);
  double best[2][3];
  for (auto& row : best) std::fill(row, row + 3, 1e30);
  for (int round = 0; round < 4; ++round)
    for (int l = 0; l < 2; ++l)
      for (int s = 0; s < 3; ++s) {
        const Shape& g = shapes[s];
        auto t0 = std::chrono::steady_clock::now();
        sgemm_on(l == 0 ? SgemmLibrary::onemkl : SgemmLibrary::onednn, g.ta, g.tb, g.m, g.n, g.k,
                 1.0f, a.data(), g.ta ? g.m : g.k, b.data(), g.tb ? g.k : g.n, 0.0f, c.data(), g.n,
                 "sgemm");
        double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (round > 0) best[l][s] = std::min(best[l][s], secs);  // round 0 warms up
      }
  return {best[0][0] + best[0][1] + best[0][2], best[1][0] + best[1][1] + best[1][2]};
}

// Where the choice measured on this machine is remembered: one small file per
// (CPU, ISA caps, threads, library versions), in KILN_CACHE_DIR, else
// $XDG_CACHE_HOME/kiln, else ~/.cache/kiln; "" when there is no such place.
std::string choice_cache_path() {
  std::string dir;
  if (const char* d = std::getenv("KILN_CACHE_DIR"); d && *d)
    dir = d;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    dir = std::string(x) + "/kiln";
  else if (const char* h = std::getenv("HOME"); h && *h)
    dir = std::string(h) + "/.cache/kiln";
  else
    return "";
  std::string cpu;
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu = line;
      break;
    }
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  const dnnl_version_t* v = dnnl_version();
  std::string key = cpu + "|" + env("ONEDNN_MAX_CPU_ISA") + "|" + env("MKL_ENABLE_INSTRUCTIONS") +
                    "|" + std::to_string(omp_get_max_threads()) + "|" + std::to_string(v->major) +
                    "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
#ifdef KILN_HAVE_MKL
  MKLVersion mv;
  mkl_get_version(&mv);
  key += std::string("|") + mv.Build;
#endif
  char name[64];
  std::snprintf(name, sizeof name, "/sgemm-choice-%016zx.txt", std::hash<std::string>{}(key));
  return dir + name;
}

// The library that measured faster here, from the cache file when an earlier
// process measured it (so that every process on a machine makes the same
// choice and results stay reproducible from run to run), else measured now
// and stored; the first process to store it wins. `why` says which.
SgemmLibrary measured_choice(std::string& why) {
  const std::string path = choice_cache_path();
  auto read = [&](SgemmLibrary& out) {
    std::ifstream in(path);
    std::string word;
    if (!(in >> word) || (word != "onemkl" && word != "onednn")) return false;
    out = word == "onemkl" ? SgemmLibrary::onemkl : SgemmLibrary::onednn;
    why = "measured faster on this machine (remembered in " + path + ")";
    return true;
  };
  SgemmLibrary lib;
  if (!path.empty() && read(lib)) return lib;
  auto [mkl, dnnl] = time_both_libraries();
  lib = mkl <= dnnl ? SgemmLibrary::onemkl : SgemmLibrary::onednn;
  char buf[160];
  std::snprintf(buf, sizeof buf, "measured faster on this machine (%.1f ms against %.1f ms)",
                1e3 * std::min(mkl, dnnl), 1e3 * std::max(mkl, dnnl));
  why = buf;
  if (path.empty()) return lib;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << library_word(lib) << "\n" << buf << "\n";
    if (!out) return lib;  // an unwritable cache only costs a measurement per process
  }
  // link() never replaces: when another process stored its choice first, use that.
  bool stored = ::link(tmp.c_str(), path.c_str()) == 0;
  std::filesystem::remove(tmp, ec);
  if (!stored) read(lib);
  return lib;
}

// The library KILN_SGEMM asks for, chosen once: oneDNN's, oneMKL's, or
// (unset, or auto) the faster of the two on this machine where oneMKL is
// built in. A bad value is kept as an error and raised by the next sgemm
// outside a parallel region (never inside one, where an exception would end
// the process).
struct Choice {
  std::atomic<SgemmLibrary> lib{SgemmLibrary::onednn};
  std::string error, why;
  Choice() {
    const char* env = std::getenv("KILN_SGEMM");
    const std::string want = env ? env : "";
    if (want.empty() || want == "auto") {
      if (!have_onemkl()) {
        why = "oneMKL is not built in";
      } else if (omp_in_parallel()) {
        // Inside a parallel region a measurement would time one thread.
        lib = SgemmLibrary::onemkl;
        why = "the default (chosen inside a parallel region, where nothing was measured)";
      } else {
        lib = measured_choice(why);
      }
    } else if (want == "onednn") {
      lib = SgemmLibrary::onednn;
      why = "KILN_SGEMM=onednn";
    } else if (want == "onemkl" && have_onemkl()) {
      lib = SgemmLibrary::onemkl;
      why = "KILN_SGEMM=onemkl";
    } else if (want == "onemkl") {
      error =
          "KILN_SGEMM is 'onemkl', but kiln was built without oneMKL (scripts/fetch-mkl.sh "
          "fetches it into .deps/mkl)";
    } else {
      error = "KILN_SGEMM is '" + want + "', expected auto, onemkl or onednn";
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
  choice().why = "set_sgemm_library";
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
  sgemm_on(sgemm_library(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, who);
}

bool gemm_bf16_native() {
  // oneDNN's choice of bf16 unit stands for the CPU and its caps
  // (ONEDNN_MAX_CPU_ISA; scripts/test-isa.sh caps oneMKL alike).
  static const bool native = have_onemkl() && !bf16_gemm_unit().empty();
  return native;
}

void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc,
               const char* who) {
#ifdef KILN_HAVE_MKL
  const int64_t largest = std::max({m, n, k, lda, ldb, ldc});
  if (gemm_bf16_native() && largest <= INT32_MAX) {
    cblas_gemm_bf16bf16f32(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                           tb ? CblasTrans : CblasNoTrans, static_cast<MKL_INT>(m),
                           static_cast<MKL_INT>(n), static_cast<MKL_INT>(k), alpha,
                           reinterpret_cast<const MKL_BF16*>(a), static_cast<MKL_INT>(lda),
                           reinterpret_cast<const MKL_BF16*>(b), static_cast<MKL_INT>(ldb), beta, c,
                           static_cast<MKL_INT>(ldc));
    return;
  }
#endif
  // op(A) is [m, k]: stored [m, k] (rows of lda), or [k, m] when transposed.
  // Widened into contiguous buffers of the stored shape.
  auto widen = [](std::vector<float>& buf, const uint16_t* x, int64_t rows, int64_t cols,
                  int64_t ld) {
    buf.resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* src = x + r * ld;
      float* dst = buf.data() + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) dst[j] = widen_bf16(src[j]);
    }
  };
  thread_local std::vector<float> wa, wb;
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  widen(wa, a, a_rows, a_cols, lda);
  widen(wb, b, b_rows, b_cols, ldb);
  sgemm(ta, tb, m, n, k, alpha, wa.data(), a_cols, wb.data(), b_cols, beta, c, ldc, who);
}

std::string sgemm_library_reason() {
  check_sgemm_library();
  return choice().why;
}

}  // namespace kiln::cpu
