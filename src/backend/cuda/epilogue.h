// kiln cuda backend: the elementwise steps of a GEMM epilogue that run after
// cuBLASLt's GEMM (those its own epilogues cannot run), shared by matmul.cpp
// (host code) and epilogue.cu (the kernel).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ops/primitive.h"

namespace kiln::cuda {

// One step: y = op(y, x), x read from `x` as `read` says (Whole: element i
// of the output's shape, Row: one value per output column, Scalar: x[0]);
// x is null for a unary op.
struct EpilogueRun {
  Op op;
  FusedRead read;
  const float* x;
};

// Applies `steps` in order, in place, to the f32 matrix y [rows, cols]
// (row-major) with scalar<op> in f32, queued on stream s. Every op must be
// fusable (kFusable in ops/op_facts.h).
void run_epilogue_steps(float* y, int64_t rows, int64_t cols,
                        const std::vector<EpilogueRun>& steps, cudaStream_t s);

}  // namespace kiln::cuda
