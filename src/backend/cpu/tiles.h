// kiln cpu backend: kiln's own bf16 tile kernels for the GEMMs that
// libraries run badly: those of the fused attention (T x T x D per head,
// where oneMKL spends a third of its time packing on AMX and runs at a third
// of oneDNN's rate on AVX512-BF16), and on AMX a linear's three GEMMs in a
// training step (gemm_ab, gemm_at_b). Two units run them: AMX (Intel's tile
// matrix unit) and AVX512-BF16's dot products (vdpbf16ps; AMD Zen 4 and
// Intel Cooper Lake have them without AMX), on the same operand layouts.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace kiln::cpu {

// The unit kiln's tile kernels run on: "AMX" where oneDNN runs its bf16
// GEMMs on AMX and Linux grants the process the tile state (asked once),
// "AVX512-BF16" where oneDNN runs them on AVX512-BF16, or "" (none: no bf16
// unit, an ONEDNN_MAX_CPU_ISA cap below it, or a test turned them off).
std::string tile_kernels();
// Tests turn kiln's tile kernels off (false) to check the other path on the
// same CPU, then back on.
void set_tile_kernels(bool on);

namespace tiles {

// The calling thread's set-up for gemm: call begin() before gemm on a thread
// and end() when done with it (on AMX they load the tile configuration and
// release the tile state). Only where tile_kernels() is not "".
void begin();
void end();

// C [m, n] = A [m, k] · B [k, n]: C f32 (ldc floats a row), A bf16
// row-major (lda elements a row), B in the pair layout of AMX and vdpbf16ps
// (row r holds, for each column j, B[2r][j] and B[2r + 1][j]; ldb elements a
// row). The buffers are the caller's, padded to whole AMX tiles: m and n
// rounded up to 16, k to 32, with zeros along k past k (in A's columns and
// B's rows); C's padding rows and columns may be written. add: C += A · B
// (C's padding rows and columns are then read as well).
void gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
          int64_t ldb, float* c, int64_t ldc, bool add = false);

// C [m, n] = Aᵀ·B for A [k, m] and B [k, n], bf16 row-major: a weight
// gradient, k the batch's rows. C row-major, f32 or (bf16) rounded once to
// bf16 (to nearest even, subnormals flushed to zero, as vcvtne2ps2bf16
// does). On AMX, over the threads, each a range of C's rows or of its
// columns; every value summed along k in the same order whatever the thread
// count. Only where tile_kernels() is "AMX" and n is a multiple of 32
// (gemm_at_b_fits); m is any (a language model's vocabulary: A's columns
// past m read as zeros, C's rows past m never written).
bool gemm_at_b_fits(int64_t m, int64_t n);
void gemm_at_b(int64_t k, int64_t m, int64_t n, const uint16_t* a, const uint16_t* b, void* c,
               bool bf16);

// C [m, n] = A [m, k] · B for a linear's forward or input-gradient GEMM:
// A bf16 row-major (the batch's rows), B a weight, [k, n] row-major or, where
// tb, stored as Bᵀ [n, k]. On AMX, over the threads, each a range of 32-row
// bands of C; every value summed along k in the same order whatever the
// thread count. Only where tile_kernels() is "AMX" and n and k are multiples
// of 32 (gemm_ab_fits).
bool gemm_ab_fits(int64_t m, int64_t n, int64_t k);
// C written by the kernel, with a linear's common epilogue: C = A·B plus up
// to four f32 addends, each a row of n added to every row (a bias) or,
// where whole, an [m, n] row-major (a residual); C row-major, f32 or
// rounded to bf16 (to nearest even, subnormals flushed to zero, as
// vcvtne2ps2bf16 does).
struct LinearOut {
  void* c = nullptr;
  bool bf16 = false;
  int adds = 0;
  const float* add[4] = {};
  bool whole[4] = {};
};
void gemm_ab(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b, bool tb,
             const LinearOut& out);
// C not written by the kernel: emit(i0, rows, j0, cols, c, ldc) gets the f32
// sums of C's rows [i0, i0 + rows) and columns [j0, j0 + cols), rows ldc
// apart in a buffer of the thread's (which emit may change), once each, on
// the thread that computed them.
using EmitRows =
    std::function<void(int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* c, int64_t ldc)>;
void gemm_ab(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b, bool tb,
             const EmitRows& emit);

}  // namespace tiles
}  // namespace kiln::cpu
