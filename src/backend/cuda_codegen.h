// kiln backends: the CUDA code generator — the source of the kernel that runs
// a fused program (FusedElementwise, FusedReduce) on a GPU, generated from the
// same fused-op description the CPU runs, with the same scalar math
// (ops/scalar_math.h is its prelude). Plain C++ with no CUDA dependency, so
// that every build can generate and check the sources; the CUDA backend
// compiles them with NVRTC (backend/cuda/fused.cpp).
#pragma once
#include <string>
#include <vector>

#include "ops/primitive.h"

namespace kiln {
// The text of ops/scalar_math.h (generated into the build by CMake).
const char* scalar_math_text();
}  // namespace kiln

namespace kiln::codegen {

// The most node inputs a generated kernel takes (its arguments are one
// struct passed by value: the input pointers and row lengths).
inline constexpr int kMaxInputs = 32;

// One generated program: its source and the kernels in it.
struct Source {
  std::string text;
  // FusedElementwise: "kiln_fused". FusedReduce: "kiln_fused_rows" (sums
  // along contiguous rows), "kiln_fused_cols" (sums over a middle or leading
  // axis group, one thread per output), and "kiln_fused_cols_part" +
  // "kiln_fused_cols_finish" (the same in row chunks, then their sums).
  std::vector<std::string> kernels;
};

// What every generated kernel starts with: the Op enum (under NVRTC, which
// has no kiln headers), the scalar math, and the argument struct
//   struct KilnArgs { const float* in[kMaxInputs]; long long row[kMaxInputs];
//                     float* out; long long n, outer, reduced, inner;
//                     float* part; long long chunk_rows, chunks; };
// (row[k]: the element count of a Row-read input).
std::string prelude();

// Whether a program can be generated: every instruction a fusable scalar op,
// at most kMaxInputs node inputs.
bool can_generate(const FusedAttrs& f);
bool can_generate(const FusedReduceAttrs& f);

// The source of a program. Besides the kernels, each defines the host- and
// device-callable element functions they run, so that the same text compiled
// by a host compiler computes the same values on the CPU (tests do):
//   float kiln_body(const KilnArgs& a, long long i)        — element i
//   float kiln_epilogue(const KilnArgs& a, float s, long long o)  — FusedReduce
//     with an epilogue: output o from its sum s
Source fused_elementwise(const FusedAttrs& f);
Source fused_reduce(const FusedReduceAttrs& f);

}  // namespace kiln::codegen
