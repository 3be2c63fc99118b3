// kiln cuda backend: the kernel that runs a GEMM epilogue's elementwise steps
// (each through scalar<op> in f32, exactly as the cpu's epilogue and eager
// kernels compute them) in place on the GEMM's f32 result, reading each
// binary step's operand whole, per column (Row) or as a scalar.
#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/epilogue.h"
#include "ops/op_facts.h"
#include "ops/scalar_math.h"

namespace kiln::cuda {
namespace {

// Steps per launch (a longer epilogue runs in several in-place passes: each
// step reads only the running f32 value, so the result is the same).
constexpr int kMaxSteps = 16;

struct Steps {
  int n = 0;
  Op op[kMaxSteps];
  FusedRead read[kMaxSteps];
  const float* x[kMaxSteps];
};

// scalar<op>(v, x) for a run-time fusable op (a unary op ignores x). A
// template so that the discarded branches of the ops without a scalar
// function are never instantiated.
template <typename A>
__device__ inline A apply_step(Op op, A v, A x) {
  switch (op) {
#define KILN_EPILOGUE_CASE(name, kind)                   \
  case Op::name:                                         \
    if constexpr (op_has(Op::name, kFusable)) {          \
      return scalar<Op::name>(v, x);                     \
    } else {                                             \
      break;                                             \
    }
    KILN_OPS(KILN_EPILOGUE_CASE)
#undef KILN_EPILOGUE_CASE
    default: break;
  }
  return v;
}

// Rows over grid y, columns over grid x (no division per element; a Row
// operand is read at the column index, coalesced).
__global__ void epilogue_kernel(float* y, int64_t rows, int64_t cols, Steps st) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float* row = y + r * cols;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
         c += static_cast<int64_t>(blockDim.x) * gridDim.x) {
      float v = row[c];
      for (int s = 0; s < st.n; ++s) {
        float x = 0.0f;
        if (const float* p = st.x[s]) {
          x = st.read[s] == FusedRead::Whole ? p[r * cols + c]
              : st.read[s] == FusedRead::Row ? p[c]
                                             : p[0];
        }
        v = apply_step(st.op[s], v, x);
      }
      row[c] = v;
    }
  }
}

}  // namespace

void run_epilogue_steps(float* y, int64_t rows, int64_t cols,
                        const std::vector<EpilogueRun>& steps, cudaStream_t s) {
  if (rows <= 0 || cols <= 0 || steps.empty()) return;
  for (const auto& e : steps)
    if (!op_has(e.op, kFusable))
      fail("MatmulEpilogue", std::string("cannot run ") + op_name(e.op) + " in a GEMM epilogue");
  // A warp-multiple of threads covering a row (up to 256), enough blocks in x
  // to cover the row once, every row (up to the grid's limit) in y.
  const int64_t warps = std::min<int64_t>((cols + 31) / 32, 8);
  const unsigned threads = static_cast<unsigned>(warps * 32);
  const unsigned bx = static_cast<unsigned>(std::min<int64_t>((cols + threads - 1) / threads, 1024));
  const unsigned by = static_cast<unsigned>(std::min<int64_t>(rows, 65535));
  for (size_t first = 0; first < steps.size(); first += kMaxSteps) {
    Steps st;
    st.n = static_cast<int>(std::min<size_t>(kMaxSteps, steps.size() - first));
    for (int i = 0; i < st.n; ++i) {
      st.op[i] = steps[first + i].op;
      st.read[i] = steps[first + i].read;
      st.x[i] = steps[first + i].x;
    }
    KILN_LAUNCH(dim3(bx, by), threads, 0, s, epilogue_kernel)(y, rows, cols, st);
    check_launch("matmul epilogue");
  }
}

}  // namespace kiln::cuda
