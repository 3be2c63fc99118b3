// kiln cpu backend: kiln's own AMX kernels (Intel's tile matrix unit) for the
// small bf16 GEMMs that libraries run badly: those of the fused attention
// (T x T x D per head, where oneMKL spends a third of its time packing).
#pragma once
#include <cstdint>

namespace kiln::cpu {

// Whether kiln's AMX kernels run: oneDNN runs its bf16 GEMMs on AMX (so the
// CPU has AMX-BF16 and no ONEDNN_MAX_CPU_ISA cap stops below it), Linux
// grants the process the tile state (asked once), and no test turned them
// off with set_amx_kernels.
bool amx_kernels();
// Tests turn kiln's AMX kernels off (false) to check the other path on the
// same CPU, then back on.
void set_amx_kernels(bool on);

namespace amx {

// The calling thread's tile configuration for gemm (every tile 16 rows of 64
// bytes): call begin() before gemm on a thread and end() when done with it
// (it releases the tile state). Only where amx_kernels().
void begin();
void end();

// C = A · B in tiles of 16: C [16·mt rows][16·nt] f32 (ldc floats a row);
// A [16·mt][32·kt] bf16, row-major (lda elements a row); B in AMX's pair
// layout: row r holds, for each of the 16·nt columns n, B[2r][n] and
// B[2r + 1][n] (ldb elements a row, at least 32·nt). Rows and columns past
// the caller's sizes are the caller's padding: zeros along k.
void gemm(int64_t mt, int64_t nt, int64_t kt, const uint16_t* a, int64_t lda, const uint16_t* b,
          int64_t ldb, float* c, int64_t ldc);

}  // namespace amx
}  // namespace kiln::cpu
