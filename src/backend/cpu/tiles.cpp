// kiln cpu backend: kiln's own bf16 tile kernels (tiles.h), on AMX or on
// AVX512-BF16.
#include "backend/cpu/tiles.h"
#include "backend/cpu/avx512.h"  // before <immintrin.h>: see its note on GCC's warnings

#include <algorithm>
#include <atomic>
#include <string>

#include "backend/cpu/kernels.h"

#if defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 11)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define KILN_TILES_BUILT 1
#define KILN_AMX __attribute__((target("amx-tile,amx-bf16")))
#define KILN_DPBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define KILN_TILES_BUILT 0
#endif

namespace kiln::cpu {
namespace {

std::atomic<bool> g_tiles_on{true};

enum class Unit { none, amx, dpbf16 };

// The unit this CPU offers, decided once: oneDNN's choice for its bf16 GEMMs
// (which an ONEDNN_MAX_CPU_ISA cap lowers), and for AMX Linux's grant of the
// tile state.
Unit cpu_unit() {
#if KILN_TILES_BUILT
  static const Unit unit = [] {
    const std::string gemm = bf16_gemm_unit();
    if (gemm == "AMX") {
      constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
      if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return Unit::amx;
      return Unit::dpbf16;  // every AMX CPU has AVX512-BF16 as well
    }
    return gemm == "AVX512-BF16" ? Unit::dpbf16 : Unit::none;
  }();
  return unit;
#else
  return Unit::none;
#endif
}

Unit unit() {
  return g_tiles_on.load(std::memory_order_relaxed) ? cpu_unit() : Unit::none;
}

}  // namespace

std::string tile_kernels() {
  switch (unit()) {
    case Unit::amx: return "AMX";
    case Unit::dpbf16: return "AVX512-BF16";
    case Unit::none: break;
  }
  return "";
}

void set_tile_kernels(bool on) {
  g_tiles_on.store(on, std::memory_order_relaxed);
}

namespace tiles {
#if KILN_TILES_BUILT
namespace {

// ---- AMX

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// One block of MI x NJ accumulator tiles (tmm0, tmm1 along n; tmm2, tmm3
// the next 16 rows) over kt steps of 32: A tiles tmm4, tmm5, B tiles tmm6,
// tmm7. (Tile numbers are immediates, hence the constant branches.) Add:
// the accumulators start from C's values rather than from zeros.
template <int MI, int NJ, bool Add>
KILN_AMX void amx_block(int64_t kt, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                        float* c, int64_t ldc) {
  const int64_t sa = lda * 2, sb = ldb * 2, sc = ldc * 4;
  if constexpr (Add) {
    _tile_loadd(0, c, sc);
    if constexpr (NJ > 1) _tile_loadd(1, c + 16, sc);
    if constexpr (MI > 1) _tile_loadd(2, c + 16 * ldc, sc);
    if constexpr (MI > 1 && NJ > 1) _tile_loadd(3, c + 16 * ldc + 16, sc);
  } else {
    _tile_zero(0);
    if constexpr (NJ > 1) _tile_zero(1);
    if constexpr (MI > 1) _tile_zero(2);
    if constexpr (MI > 1 && NJ > 1) _tile_zero(3);
  }
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

KILN_AMX void amx_begin() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.bytes_per_row[t] = 64;
  // GCC 12's _tile_loadconfig tells the compiler that it reads 8 bytes of
  // the 64, which lets it drop the stores of the rest: make them all happen.
  __asm__ __volatile__("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
}

KILN_AMX void amx_end() {
  _tile_release();
}

// Whole tiles of 16 rows and columns and 32 along k.
template <bool Add>
KILN_AMX void amx_gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                       const uint16_t* b, int64_t ldb, float* c, int64_t ldc) {
  const int64_t mt = (m + 15) / 16, nt = (n + 15) / 16, kt = (k + 31) / 32;
  for (int64_t i = 0; i < mt; i += 2) {
    const uint16_t* ai = a + i * 16 * lda;
    float* ci = c + i * 16 * ldc;
    for (int64_t j = 0; j < nt; j += 2) {
      const uint16_t* bj = b + j * 32;
      float* cij = ci + j * 16;
      if (i + 1 < mt && j + 1 < nt)
        amx_block<2, 2, Add>(kt, ai, lda, bj, ldb, cij, ldc);
      else if (i + 1 < mt)
        amx_block<2, 1, Add>(kt, ai, lda, bj, ldb, cij, ldc);
      else if (j + 1 < nt)
        amx_block<1, 2, Add>(kt, ai, lda, bj, ldb, cij, ldc);
      else
        amx_block<1, 1, Add>(kt, ai, lda, bj, ldb, cij, ldc);
    }
  }
}

// ---- AVX512-BF16: C[8 rows][16·NV] in 8·NV registers, each step along k
// one pair of A's columns (broadcast, a 32-bit load) against NV rows of
// 16 pairs of B (one 512-bit load each): 8·NV vdpbf16ps to NV + 8 loads.

constexpr int kRows = 8;

template <int NV, bool Add>
KILN_DPBF16 __attribute__((always_inline)) inline void dp_block(int64_t kp, const uint16_t* a,
                                                                int64_t lda, const uint16_t* b,
                                                                int64_t ldb, float* c,
                                                                int64_t ldc) {
  __m512 acc[kRows][NV];
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j)
      acc[i][j] = Add ? _mm512_loadu_ps(c + i * ldc + 16 * j) : _mm512_setzero_ps();
  for (int64_t r = 0; r < kp; ++r) {
    const uint16_t* br = b + r * ldb;
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = (__m512bh)_mm512_loadu_si512(br + 32 * j);
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      int32_t pair;
      __builtin_memcpy(&pair, a + i * lda + 2 * r, sizeof pair);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(c + i * ldc + 16 * j, acc[i][j]);
}

// Rows in blocks of 8, k in pairs (of the padding only what these need:
// T = 197 tokens run 200 rows and 99 pairs where AMX's tiles take 208 and
// 112); columns in blocks of 3 vectors (24 accumulators), or of 2 where the
// column tiles are even (head dims of 64: two blocks of 16 accumulators
// rather than one of 24 and one of 8). The block of columns is outermost, so
// that its rows of B stay in L1 while the rows of A go by.
template <int NV, bool Add>
KILN_DPBF16 void dp_columns(int64_t m, int64_t kp, const uint16_t* a, int64_t lda,
                            const uint16_t* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; i += kRows)
    dp_block<NV, Add>(kp, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
}

template <bool Add>
KILN_DPBF16 void dp_gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                         const uint16_t* b, int64_t ldb, float* c, int64_t ldc) {
  const int64_t kp = (k + 1) / 2, nt = (n + 15) / 16;
  const int step = nt % 3 != 0 && nt % 2 == 0 ? 2 : 3;
  for (int64_t j = 0; j < nt; j += step) {
    const uint16_t* bj = b + j * 32;
    float* cj = c + j * 16;
    switch (std::min<int64_t>(step, nt - j)) {
      case 3: dp_columns<3, Add>(m, kp, a, lda, bj, ldb, cj, ldc); break;
      case 2: dp_columns<2, Add>(m, kp, a, lda, bj, ldb, cj, ldc); break;
      default: dp_columns<1, Add>(m, kp, a, lda, bj, ldb, cj, ldc); break;
    }
  }
}

// ---- Aᵀ·B (gemm_at_b). AMX's A operand takes rows of C (16 of m) against
// 32 of k, so A [k, m] is transposed as it is packed (32 x 32 squares,
// transpose_square). B [k, n] needs only an interleave of its rows in pairs
// (the pair layout). Packed per chunk of kAtbChunk along k, each thread its
// part (gemm_at_b_part), C's tiles loaded and stored once a chunk; within a
// chunk A is packed and multiplied kAtbGroupRows of the part's rows at a
// time, so that the packed group stays in L2 beside B's chunk and C's part
// and the chunk can be 512 long (C's tiles loaded and stored half as often,
// and the tile unit's wait for each block's stores paid half as often, as
// with 256). ViT-S's four weight gradients ran at 1.62-1.88 TFLOP/s alone
// where oneDNN 2.6's brgemm ran them at 1.38-1.46, and took 204 ms of the
// step where they took 257 (bench/results/2026-12-07-amx-weight-gradients/);
// groups of 128 rows in chunks of 512, with transpose_square, ran them 13.7%
// faster again on two cores (4 rounds) and took 6% less of a one-thread
// step (6 rounds) than the part's rows at once in chunks of 256
// (bench/results/2026-12-07-transpose-lanes/). The sums and their order
// depend on neither: C's tiles are stored and loaded as f32.
constexpr int64_t kAtbChunk = 512, kAtbGroupRows = 128;

alignas(64) constexpr uint16_t kPairs[64] = {
    0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
    11, 43, 12, 44, 13, 45, 14, 46, 15, 47, 16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53,
    22, 54, 23, 55, 24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

// Row k of x [rows, width] (32 values from column j), or zeros past the rows
// and past the columns (masked loads: nothing past them is read).
KILN_DPBF16 inline __m512i row32(const uint16_t* x, int64_t rows, int64_t width, int64_t k,
                                 int64_t j) {
  if (k >= rows) return _mm512_setzero_si512();
  if (j + 32 <= width) return _mm512_loadu_si512(x + k * width + j);
  return _mm512_maskz_loadu_epi16(static_cast<__mmask32>((uint64_t{1} << (width - j)) - 1),
                                  x + k * width + j);
}

// Transposes 16 x 16 32-bit lanes: r[i][p] <- r[p][i].
KILN_DPBF16 inline void transpose_pairs(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 16; i += 8)
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

// B's rows [k0, k0 + kc) (zeros past k) and columns [j0, j0 + w) in the pair
// layout: row r of dst, 2w values, interleaves rows k0 + 2r and k0 + 2r + 1.
KILN_DPBF16 void pack_pairs(const uint16_t* b, int64_t k, int64_t n, int64_t k0, int64_t kc,
                            int64_t j0, int64_t w, uint16_t* dst) {
  const __m512i lo = _mm512_load_si512(kPairs), hi = _mm512_load_si512(kPairs + 32);
  for (int64_t r = 0; r < kc / 2; ++r) {
    uint16_t* d = dst + r * 2 * w;
    for (int64_t j = 0; j < w; j += 32) {
      const __m512i x0 = row32(b, k, n, k0 + 2 * r, j0 + j);
      const __m512i x1 = row32(b, k, n, k0 + 2 * r + 1, j0 + j);
      _mm512_storeu_si512(d + 2 * j, _mm512_permutex2var_epi16(x0, lo, x1));
      _mm512_storeu_si512(d + 2 * j + 32, _mm512_permutex2var_epi16(x0, hi, x1));
    }
  }
}

// dst[i][c] = src[c][i] for a 32 x 32 square (src's rows lds apart, dst's
// ld apart). Register i of group g gathers columns 8g..8g + 7 of rows i,
// i + 8, i + 16 and i + 24 from memory (one 16-byte piece per lane), so
// that three rounds of in-lane unpacks transpose the square: 96 shuffles,
// where interleaving pairs of rows (vpermt2w) and transposing 16 x 16 pairs
// took 192, and the inserts can run on port 0 beside them. Alone, from L2,
// 11.1 against 10.1 bytes a cycle; ViT-S's four weight gradients about 7%
// faster on one core (bench/results/2026-12-07-transpose-lanes/).
KILN_DPBF16 inline void transpose_square(const uint16_t* src, int64_t lds, uint16_t* dst,
                                         int64_t ld) {
  for (int g = 0; g < 4; ++g) {  // columns 8g..8g + 7 of src, rows 8g..8g + 7 of dst
    __m512i x[8], t[8];
    for (int i = 0; i < 8; ++i) {
      const uint16_t* s = src + i * lds + 8 * g;
      auto piece = [&](int q) {  // columns 8g..8g + 7 of row i + 8q
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 8 * q * lds));
      };
      __m512i z = _mm512_castsi128_si512(piece(0));
      z = _mm512_inserti32x4(z, piece(1), 1);  // lanes as literals: clang wants immediates
      z = _mm512_inserti32x4(z, piece(2), 2);
      x[i] = _mm512_inserti32x4(z, piece(3), 3);
    }
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm512_unpacklo_epi16(x[i], x[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi16(x[i], x[i + 1]);
    }
    for (int h = 0; h < 8; h += 4) {
      x[h] = _mm512_unpacklo_epi32(t[h], t[h + 2]);
      x[h + 1] = _mm512_unpackhi_epi32(t[h], t[h + 2]);
      x[h + 2] = _mm512_unpacklo_epi32(t[h + 1], t[h + 3]);
      x[h + 3] = _mm512_unpackhi_epi32(t[h + 1], t[h + 3]);
    }
    for (int c = 0; c < 4; ++c) {
      _mm512_storeu_si512(dst + (8 * g + 2 * c) * ld, _mm512_unpacklo_epi64(x[c], x[c + 4]));
      _mm512_storeu_si512(dst + (8 * g + 2 * c + 1) * ld, _mm512_unpackhi_epi64(x[c], x[c + 4]));
    }
  }
}

// Aᵀ's rows [i0, i0 + 32) and columns [k0, k0 + 32) (zeros past m and k)
// into dst, rows ld apart: dst[i][c] = A[k0 + c][i0 + i].
KILN_DPBF16 void pack_transposed(const uint16_t* a, int64_t k, int64_t m, int64_t i0, int64_t k0,
                                 uint16_t* dst, int64_t ld) {
  if (k0 + 32 <= k && i0 + 32 <= m) return transpose_square(a + k0 * m + i0, m, dst, ld);
  alignas(64) uint16_t square[32 * 32];  // the last rows or columns, padded with zeros
  for (int r = 0; r < 32; ++r) _mm512_store_si512(square + r * 32, row32(a, k, m, k0 + r, i0));
  transpose_square(square, 32, dst, ld);
}

// C's tiles [32, 32] = c_in (rows ldc apart; zeros where c_in is null) plus
// a [32, 32·ks] (rows lda apart) · two column blocks of B in the pair
// layout (step s's tiles at b0 + s·b_step and b1 + s·b_step, rows ldb
// elements apart), stored at c_out (rows ldo apart). Software-pipelined:
// step s + 1's tiles are loaded between step s's products. B's tiles are
// loaded with the T1 hint (tileloaddt1, as oneDNN's brgemm does): B streams
// from L2 past the A rows that L1 keeps for the next block; with plain
// loads it evicts them (ViT-S's linears alone: 1.97 against 2.25 TFLOP/s,
// bench/results/2026-12-07-amx-t1/). At each step, line s of pf_rows rows
// of pf (rows lda apart) is prefetched into L2. gemm_at_b's A comes
// packed, gemm_ab's in place.
KILN_AMX void amx_block_2x2(int64_t ks, const uint16_t* a, int64_t lda, const uint16_t* b0,
                            const uint16_t* b1, int64_t ldb, int64_t b_step, const float* c_in,
                            int64_t ldc, float* c_out, int64_t ldo, const uint16_t* pf = nullptr,
                            int64_t pf_rows = 0) {
  const int64_t sc = ldc * 4, so = ldo * 4, sa = lda * 2, sb = ldb * 2;
  const uint16_t* a1 = a + 16 * lda;
  _tile_stream_loadd(6, b0, sb);
  _tile_loadd(4, a, sa);
  if (c_in) {
    _tile_loadd(0, c_in, sc);
    _tile_loadd(1, c_in + 16, sc);
    _tile_loadd(2, c_in + 16 * ldc, sc);
    _tile_loadd(3, c_in + 16 * ldc + 16, sc);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  _tile_stream_loadd(7, b1, sb);
  _tile_loadd(5, a1, sa);
  for (int64_t s = 0; s < ks; ++s) {
    for (int64_t r = 0; r < pf_rows; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(pf + r * lda + s * 32), _MM_HINT_T1);
    const bool more = s + 1 < ks;
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if (more) _tile_stream_loadd(6, b0 + (s + 1) * b_step, sb);
    _tile_dpbf16ps(1, 4, 7);
    if (more) _tile_loadd(4, a + (s + 1) * 32, sa);
    _tile_dpbf16ps(3, 5, 7);
    if (more) {
      _tile_stream_loadd(7, b1 + (s + 1) * b_step, sb);
      _tile_loadd(5, a1 + (s + 1) * 32, sa);
    }
  }
  _tile_stored(0, c_out, so);
  _tile_stored(1, c_out + 16, so);
  _tile_stored(2, c_out + 16 * ldo, so);
  _tile_stored(3, c_out + 16 * ldo + 16, so);
}

// ---- A·B for a linear (gemm_ab). B small beside A (a weight), packed once a
// call into the pair layout by blocks of 16 columns: block jb holds its k/2
// rows of 16 pairs contiguously, so that each B tile is 1 KB in a row. A is
// read where it is (a tile is 16 of its rows, 64 bytes apart along k). Each
// thread owns a range of 32-row bands of C; along n in panels whose packed B
// stays in L2 (kAbPanelBytes), along k in chunks of equal length, none
// longer than kAbChunk, whose band of A stays in L1 (the sums of all but
// the last kept in a band buffer); the next band's rows are prefetched into
// L2 a line a row at a time while the current band computes (a training
// step's activations come from memory). A finished 32x32 block goes to one
// of two 4 KB slots, which stay in L1, and is written out (its epilogue
// applied) after the next block's tile work is issued. Measured in ViT-S's
// bf16 step (bench/ab.sh, 3 rounds each, bench/results/2026-12-07-amx-linears/):
// panels of 2 MiB against 1 MiB 0.953 against 0.986 s (ViT-B: 2.88 against
// 3.22 s with no panels at all); the prefetch 0.995 against 1.011 s without
// it. Alone, with B's tiles loaded with the T1 hint (amx_block_2x2), chunks
// of up to 512 against 256, and blocks written from L1 against a band's
// rows from L2: bench/results/2026-12-07-amx-t1/.
constexpr int64_t kAbChunk = 512, kAbPanelBytes = 2 << 20;

// Columns [j0, j0 + 32) of B [k, n] (row-major) into blocks j0/16, j0/16 + 1.
KILN_DPBF16 void pack_ab_rows(const uint16_t* b, int64_t k, int64_t n, int64_t j0, uint16_t* dst) {
  const __m512i lo = _mm512_load_si512(kPairs), hi = _mm512_load_si512(kPairs + 32);
  uint16_t* d0 = dst + (j0 / 16) * (k / 2) * 32;
  uint16_t* d1 = d0 + (k / 2) * 32;
  for (int64_t r = 0; r < k / 2; ++r) {
    const __m512i x0 = _mm512_loadu_si512(b + 2 * r * n + j0);
    const __m512i x1 = _mm512_loadu_si512(b + (2 * r + 1) * n + j0);
    _mm512_storeu_si512(d0 + r * 32, _mm512_permutex2var_epi16(x0, lo, x1));
    _mm512_storeu_si512(d1 + r * 32, _mm512_permutex2var_epi16(x0, hi, x1));
  }
}

// Columns [j0, j0 + 16) of B = Wᵀ, W [n, k] row-major, into block j0/16: a
// pair of W's row j is one 32-bit lane, so 16 rows by 16 pairs transpose.
KILN_DPBF16 void pack_ab_cols(const uint16_t* w, int64_t k, int64_t j0, uint16_t* dst) {
  uint16_t* d = dst + (j0 / 16) * (k / 2) * 32;
  for (int64_t r0 = 0; r0 < k / 2; r0 += 16) {
    __m512i x[16];
    for (int i = 0; i < 16; ++i) x[i] = _mm512_loadu_si512(w + (j0 + i) * k + 2 * r0);
    transpose_pairs(x);
    for (int p = 0; p < 16; ++p) _mm512_storeu_si512(d + (r0 + p) * 32, x[p]);
  }
}

}  // namespace

bool gemm_ab_fits(int64_t m, int64_t n, int64_t k) {
  return unit() == Unit::amx && n % 32 == 0 && k % 32 == 0 && m > 0 && n > 0 && k > 0;
}

namespace {

// C = A·B by 32x32 blocks: store(i0, rows, j0, s) gets the f32 sums of C's
// rows [i0, i0 + rows) and columns [j0, j0 + 32), rows 32 apart at s.
template <class Store>
void gemm_ab_blocks(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b, bool tb,
                    const Store& store) {
  if (!gemm_ab_fits(m, n, k)) fail("tiles", "gemm_ab needs AMX and n, k multiples of 32");
  Buffer packed(&cpu_allocator(), k * n * 2, Device::cpu());
  auto* pb = static_cast<uint16_t*>(packed.data());
  if (tb)
    parallel_for(n / 16, 16 * k, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) pack_ab_cols(b, k, j * 16, pb);
    });
  else
    parallel_for(n / 32, 32 * k, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) pack_ab_rows(b, k, n, j * 32, pb);
    });
  const int64_t chunks = (k + kAbChunk - 1) / kAbChunk;
  const int64_t kc = (k / 32 + chunks - 1) / chunks * 32;
  // Panels of equal width (in 32s), as few as keep each within the budget.
  const int64_t widest = std::max<int64_t>(32, kAbPanelBytes / (2 * k) / 32 * 32);
  const int64_t panels = (n + widest - 1) / widest;
  const int64_t nc = (n / 32 + panels - 1) / panels * 32;
  const int64_t bands = (m + 31) / 32;
  parallel_for(bands, 2 * 32 * n * k, [&](int64_t b0, int64_t b1) {
    const int64_t band_sums = chunks > 1 ? 32 * nc : 0;
    Buffer sums(&cpu_allocator(), (band_sums + 2 * 32 * 32) * sizeof(float), Device::cpu());
    Buffer tail(&cpu_allocator(), 32 * k * 2, Device::cpu());
    float* cs = static_cast<float*>(sums.data());
    float* slots = cs + band_sums;
    struct {
      int64_t i0 = 0, rows = 0, j0 = 0;
      float* sums = nullptr;
    } pend;  // the finished block still to be stored
    int parity = 0;
    amx_begin();
    for (int64_t j0 = 0; j0 < n; j0 += nc) {
      const int64_t blocks = std::min(nc, n - j0) / 32;
      for (int64_t band = b0; band < b1; ++band) {
        const int64_t rows = std::min<int64_t>(32, m - band * 32);
        const uint16_t* ab = a + band * 32 * k;
        if (rows < 32) {  // the last band, padded with zeros
          auto* t = static_cast<uint16_t*>(tail.data());
          std::copy(ab, ab + rows * k, t);
          std::fill(t + rows * k, t + 32 * k, uint16_t{0});
          ab = t;
        }
        // The next band in this thread's order, its whole rows only.
        const int64_t next = band + 1 < b1 ? band + 1 : j0 + nc < n ? b0 : -1;
        const int64_t pf_total = next >= 0 ? std::min<int64_t>(32, m - next * 32) : 0;
        const uint16_t* pf = next >= 0 ? a + next * 32 * k : a;
        for (int64_t k0 = 0; k0 < k; k0 += kc) {
          const int64_t ks = std::min(kc, k - k0) / 32;
          for (int64_t jb = 0; jb < blocks; ++jb) {
            const int64_t r0 = pf_total * jb / blocks, r1 = pf_total * (jb + 1) / blocks;
            const uint16_t* bj = pb + ((j0 / 16) + 2 * jb) * (k / 2) * 32 + (k0 / 2) * 32;
            // The last chunk's sums go to a slot, the others to the band's.
            const bool last = k0 + kc >= k;
            float* out = last ? slots + parity * 32 * 32 : cs + jb * 32;
            amx_block_2x2(ks, ab + k0, k, bj, bj + (k / 2) * 32, 32, 512,
                          k0 == 0 ? nullptr : cs + jb * 32, nc, out, last ? 32 : nc,
                          pf + r0 * k + k0, r1 - r0);
            if (!last) continue;
            parity ^= 1;
            if (pend.sums) store(pend.i0, pend.rows, pend.j0, pend.sums);
            pend = {band * 32, rows, j0 + jb * 32, out};
          }
        }
      }
    }
    if (pend.sums) store(pend.i0, pend.rows, pend.j0, pend.sums);
    amx_end();
  });
}

// A block of sums (rows 32 apart at s) into out's C [., n] at (i0, j0).
KILN_DPBF16 void store_block(const LinearOut& out, int64_t n, int64_t i0, int64_t rows, int64_t j0,
                             const float* s) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = (i0 + r) * n + j0;
    __m512 lo = _mm512_load_ps(s + r * 32), hi = _mm512_load_ps(s + r * 32 + 16);
    for (int t = 0; t < out.adds; ++t) {
      const float* x = out.add[t] + (out.whole[t] ? at : j0);
      lo = _mm512_add_ps(lo, _mm512_loadu_ps(x));
      hi = _mm512_add_ps(hi, _mm512_loadu_ps(x + 16));
    }
    if (out.bf16) {
      _mm512_storeu_si512(static_cast<uint16_t*>(out.c) + at, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    } else {
      _mm512_storeu_ps(static_cast<float*>(out.c) + at, lo);
      _mm512_storeu_ps(static_cast<float*>(out.c) + at + 16, hi);
    }
  }
}

}  // namespace

void gemm_ab(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b, bool tb,
             const EmitRows& emit) {
  gemm_ab_blocks(m, n, k, a, b, tb, [&](int64_t i0, int64_t rows, int64_t j0, float* s) {
    emit(i0, rows, j0, 32, s, 32);
  });
}

void gemm_ab(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b, bool tb,
             const LinearOut& out) {
  if (out.adds < 0 || out.adds > 4) fail("tiles", "gemm_ab takes 0 to 4 addends");
  gemm_ab_blocks(m, n, k, a, b, tb, [&](int64_t i0, int64_t rows, int64_t j0, const float* s) {
    store_block(out, n, i0, rows, j0, s);
  });
}

bool gemm_at_b_fits(int64_t m, int64_t n) {
  return unit() == Unit::amx && n % 32 == 0 && m > 0 && n > 0;
}

namespace {

// One thread's part of C = Aᵀ·B: C's rows [r0, r1) (r0 a multiple of 32, r1
// one or m) and columns [c0, c1) (multiples of 32), along k in chunks of
// kAtbChunk: B's columns of the part packed once a chunk, A's rows
// (transposed) a group of kAtbGroupRows at a time. The sums of all but the
// last chunk kept in a buffer of the part's (C itself where C is f32 and the
// part's rows are whole blocks); otherwise the last chunk's blocks go to one
// of two 4 KB slots in L1 and are written out (rounded for a bf16 C; the
// rows of C only) after the next block's tile work is issued.
void gemm_at_b_part(int64_t k, int64_t m, int64_t n, const uint16_t* a, const uint16_t* b, void* c,
                    bool bf16, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const LinearOut out{c, bf16};  // no addends
  const int64_t rows = (r1 - r0 + 31) / 32 * 32, cols = c1 - c0;
  const int64_t group = std::min(kAtbGroupRows, rows);
  const int64_t chunks = (k + kAtbChunk - 1) / kAtbChunk;
  const bool direct = !bf16 && r0 + rows <= m;
  const int64_t part_sums = direct || chunks == 1 ? 0 : rows * cols;
  Buffer packed_b(&cpu_allocator(), kAtbChunk * cols * 2, Device::cpu());
  Buffer packed_a(&cpu_allocator(), group * kAtbChunk * 2, Device::cpu());
  Buffer sums(&cpu_allocator(), (part_sums + 2 * 32 * 32) * sizeof(float), Device::cpu());
  auto* pb = static_cast<uint16_t*>(packed_b.data());
  auto* pa = static_cast<uint16_t*>(packed_a.data());
  float* slots = static_cast<float*>(sums.data()) + part_sums;
  // Block (i, j) of the part's sums: in C itself or in the buffer.
  float* cs = direct ? static_cast<float*>(c) + r0 * n + c0 : static_cast<float*>(sums.data());
  const int64_t ldc = direct ? n : cols;
  struct {
    int64_t i0 = 0, j0 = 0;
    const float* sums = nullptr;
  } pend;  // the finished block still to be written
  int parity = 0;
  amx_begin();
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t k0 = ch * kAtbChunk, kc = std::min(kAtbChunk, (k - k0 + 31) / 32 * 32);
    const bool last = ch + 1 == chunks;
    pack_pairs(b, k, n, k0, kc, c0, cols, pb);
    for (int64_t g0 = 0; g0 < rows; g0 += group) {
      const int64_t g1 = std::min(rows, g0 + group);
      // Along k outermost, so that A's rows are read left to right.
      for (int64_t s = 0; s < kc; s += 32)
        for (int64_t i = g0; i < g1; i += 32)
          pack_transposed(a, k, m, r0 + i, k0 + s, pa + (i - g0) * kc + s, kc);
      for (int64_t i = g0; i < g1; i += 32)
        for (int64_t j = 0; j < cols; j += 32) {
          float* at = cs + i * ldc + j;
          const bool slot = last && !direct;
          float* dst = slot ? slots + parity * 32 * 32 : at;
          amx_block_2x2(kc / 32, pa + (i - g0) * kc, kc, pb + 2 * j, pb + 2 * j + 32, 2 * cols,
                        32 * cols, ch == 0 ? nullptr : at, ldc, dst, slot ? 32 : ldc);
          if (!slot) continue;
          parity ^= 1;
          if (pend.sums)
            store_block(out, n, pend.i0, std::min<int64_t>(32, m - pend.i0), pend.j0, pend.sums);
          pend = {r0 + i, c0 + j, dst};
        }
    }
  }
  if (pend.sums)
    store_block(out, n, pend.i0, std::min<int64_t>(32, m - pend.i0), pend.j0, pend.sums);
  amx_end();
}

}  // namespace

void gemm_at_b(int64_t k, int64_t m, int64_t n, const uint16_t* a, const uint16_t* b, void* c,
               bool bf16) {
  if (!gemm_at_b_fits(m, n)) fail("tiles", "gemm_at_b needs AMX and n a multiple of 32");
  if (k <= 0) {
    if (bf16)
      std::fill_n(static_cast<uint16_t*>(c), m * n, uint16_t{0});
    else
      std::fill_n(static_cast<float*>(c), m * n, 0.0f);
    return;
  }
  // Each thread packs its own part's rows of A (transposed) and columns of B
  // (interleaved only), both read from memory: a third of the kernel's
  // time. With C's rows as the threads' parts, every thread packs B whole;
  // with its columns, A whole, and A's values cost more (32 rows read at
  // once against B's 2): C's columns where A is less than half as wide as
  // B. A and B are not swapped: in a training step A is the output's
  // gradient, just made, and B the layer's input, saved by the forward pass
  // and colder, which B's pattern reads faster. In ViT-S's bf16 step
  // (medians of 3 profiled runs) the four weight gradients take 14.7 ms a
  // layer, against 15.1 with the narrower operand made A by swapping them
  // (fc1's 4.48 against 4.83 ms) and 15.7 before C's columns were parts
  // and the bf16 rounding was done here (fc2's 4.85 against 5.54 ms; then
  // rounded and transposed after); bench/results/2026-12-07-weight-gradient-parts/.
  const bool by_columns = 2 * m < n;
  if (by_columns)
    parallel_for(n / 32, 2 * 32 * m * k, [&](int64_t j0, int64_t j1) {
      gemm_at_b_part(k, m, n, a, b, c, bf16, 0, m, j0 * 32, j1 * 32);
    });
  else
    parallel_for((m + 31) / 32, 2 * 32 * n * k, [&](int64_t b0, int64_t b1) {
      gemm_at_b_part(k, m, n, a, b, c, bf16, b0 * 32, std::min(m, b1 * 32), 0, n);
    });
}

void begin() {
  if (unit() == Unit::amx) amx_begin();
}

void end() {
  if (unit() == Unit::amx) amx_end();
}

void gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
          int64_t ldb, float* c, int64_t ldc, bool add) {
  switch (unit()) {
    case Unit::amx:
      return add ? amx_gemm<true>(m, n, k, a, lda, b, ldb, c, ldc)
                 : amx_gemm<false>(m, n, k, a, lda, b, ldb, c, ldc);
    case Unit::dpbf16:
      return add ? dp_gemm<true>(m, n, k, a, lda, b, ldb, c, ldc)
                 : dp_gemm<false>(m, n, k, a, lda, b, ldb, c, ldc);
    case Unit::none: break;
  }
  fail("tiles", "kiln's tile kernels do not run on this CPU (tile_kernels() is empty)");
}
#else
void begin() {
  fail("tiles", "kiln was built without its tile kernels");
}
void end() {}
void gemm(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, float*,
          int64_t, bool) {
  fail("tiles", "kiln was built without its tile kernels");
}
bool gemm_at_b_fits(int64_t, int64_t) {
  return false;
}
bool gemm_ab_fits(int64_t, int64_t, int64_t) {
  return false;
}
void gemm_ab(int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*, bool, const LinearOut&) {
  fail("tiles", "kiln was built without its tile kernels");
}
void gemm_ab(int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*, bool, const EmitRows&) {
  fail("tiles", "kiln was built without its tile kernels");
}
void gemm_at_b(int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*, void*, bool) {
  fail("tiles", "kiln was built without its tile kernels");
}
#endif
}  // namespace tiles
}  // namespace kiln::cpu
