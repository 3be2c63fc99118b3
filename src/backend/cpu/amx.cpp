// kiln cpu backend: kiln's own AMX kernels (amx.h).
#include "backend/cpu/amx.h"

#include <atomic>
#include <string>

#include "backend/cpu/kernels.h"

#if defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 11)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define KILN_AMX_BUILT 1
#define KILN_AMX __attribute__((target("amx-tile,amx-bf16")))
#else
#define KILN_AMX_BUILT 0
#endif

namespace kiln::cpu {
namespace {
std::atomic<bool> g_amx_on{true};
}

bool amx_kernels() {
#if KILN_AMX_BUILT
  static const bool granted = [] {
    if (bf16_gemm_unit() != "AMX") return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted && g_amx_on.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void set_amx_kernels(bool on) {
  g_amx_on.store(on, std::memory_order_relaxed);
}

namespace amx {
#if KILN_AMX_BUILT
namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// One block of MI x NJ accumulator tiles (tmm0, tmm1 along n; tmm2, tmm3
// the next 16 rows) over kt steps of 32: A tiles tmm4, tmm5, B tiles tmm6,
// tmm7. (Tile numbers are immediates, hence the constant branches.)
template <int MI, int NJ>
KILN_AMX void block(int64_t kt, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                    float* c, int64_t ldc) {
  const int64_t sa = lda * 2, sb = ldb * 2, sc = ldc * 4;
  _tile_zero(0);
  if constexpr (NJ > 1) _tile_zero(1);
  if constexpr (MI > 1) _tile_zero(2);
  if constexpr (MI > 1 && NJ > 1) _tile_zero(3);
  for (int64_t k = 0; k < kt; ++k) {
    const uint16_t* bk = b + k * 16 * ldb;
    _tile_loadd(6, bk, sb);
    if constexpr (NJ > 1) _tile_loadd(7, bk + 32, sb);
    _tile_loadd(4, a + k * 32, sa);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NJ > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MI > 1) {
      _tile_loadd(5, a + 16 * lda + k * 32, sa);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NJ > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, sc);
  if constexpr (NJ > 1) _tile_stored(1, c + 16, sc);
  if constexpr (MI > 1) _tile_stored(2, c + 16 * ldc, sc);
  if constexpr (MI > 1 && NJ > 1) _tile_stored(3, c + 16 * ldc + 16, sc);
}

}  // namespace

KILN_AMX void begin() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.bytes_per_row[t] = 64;
  // GCC 12's _tile_loadconfig tells the compiler that it reads 8 bytes of
  // the 64, which lets it drop the stores of the rest: make them all happen.
  __asm__ __volatile__("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
}

KILN_AMX void end() {
  _tile_release();
}

KILN_AMX void gemm(int64_t mt, int64_t nt, int64_t kt, const uint16_t* a, int64_t lda,
                   const uint16_t* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t i = 0; i < mt; i += 2) {
    const uint16_t* ai = a + i * 16 * lda;
    float* ci = c + i * 16 * ldc;
    for (int64_t j = 0; j < nt; j += 2) {
      const uint16_t* bj = b + j * 32;
      float* cij = ci + j * 16;
      if (i + 1 < mt && j + 1 < nt)
        block<2, 2>(kt, ai, lda, bj, ldb, cij, ldc);
      else if (i + 1 < mt)
        block<2, 1>(kt, ai, lda, bj, ldb, cij, ldc);
      else if (j + 1 < nt)
        block<1, 2>(kt, ai, lda, bj, ldb, cij, ldc);
      else
        block<1, 1>(kt, ai, lda, bj, ldb, cij, ldc);
    }
  }
}
#else
void begin() {
  fail("amx", "kiln was built without AMX support");
}
void end() {}
void gemm(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, float*,
          int64_t) {
  fail("amx", "kiln was built without AMX support");
}
#endif
}  // namespace amx
}  // namespace kiln::cpu
