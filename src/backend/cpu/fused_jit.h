// kiln cpu backend: fused elementwise programs compiled to AVX-512 machine
// code (Xbyak) — each program register a zmm register, the inputs loaded
// (bf16 widened) 16 lanes at a time, one store of the result — in place of
// the interpreter's pass over an L1 chunk per instruction (fused.cpp), which
// kept bf16 BatchNorm passes at half the memory's speed. Exactly the
// interpreter's values: each instruction is the IEEE operation the scalar
// function computes, bf16 rounding the same integer sequence as
// narrow_bf16 (round to nearest even, NaN kept quiet).
#pragma once
#include <cstdint>
#include <vector>

#include "ops/primitive.h"

namespace kiln::cpu {

// out[i] for i < n from the inputs' pointers: ptrs[k] points at input k's
// value for position 0 of this run (a Scalar input at its one value); out
// is f32 or bf16 as the kernel was compiled.
using FusedFn = void (*)(const void* const* ptrs, void* out, int64_t n);

// The compiled kernel of `body` (cached per program, input dtypes and output
// dtype), or null where the generator has no code for one of its ops
// (transcendental ones stay in the interpreter, whose loops the compiler
// vectorizes exactly as the unfused kernels), it needs more registers than
// it keeps in zmm, the build or the CPU has no AVX-512, or KILN_FUSED=interpret.
// `bf16_in[k]`: input k is bf16 (else f32).
FusedFn fused_jit(const FusedAttrs& body, const std::vector<bool>& bf16_in, bool bf16_out);

// acc[c] += the program's value at column c of each of `rows` rows, for c <
// n, the rows in order: Whole inputs at ptrs[k] for row 0 and `stride`
// positions further each row; Row inputs (one value per column) and
// Scalars the same for every row. The column sums of FusedReduce, added in
// the order its C++ loops add them.
using FusedSumFn = void (*)(const void* const* ptrs, float* acc, int64_t n, int64_t rows,
                            int64_t stride);
FusedSumFn fused_jit_sum(const FusedAttrs& body, const std::vector<bool>& bf16_in);

// Whether fused_jit compiles programs (tests compare it with the interpreter).
bool fused_jit_enabled();
void set_fused_jit_enabled(bool on);

}  // namespace kiln::cpu
