// kiln backends: the CUDA code generator (see cuda_codegen.h). A program's
// registers become named f32 locals; each instruction is a call of
// kiln::scalar<kiln::Op::X>, the function the CPU's kernels call.
#include "backend/cuda_codegen.h"

#include <sstream>

#include "kiln/error.h"
#include "ops/op_facts.h"

namespace kiln::codegen {
namespace {

const char* kArgs = R"(
struct KilnArgs {
  const float* in[32];
  long long row[32];
  float* out;
  long long n, outer, reduced, inner;
  float* part;  // column sums in chunks: chunks x outer x inner partial sums
  long long chunk_rows, chunks;
};
)";

bool program_ok(const FusedAttrs& f) {
  const int regs = static_cast<int>(f.reads.size() + f.program.size());
  for (size_t i = 0; i < f.program.size(); ++i) {
    const FusedInstr& ins = f.program[i];
    const int self = static_cast<int>(f.reads.size() + i);
    if (!op_has(ins.op, kFusable) || ins.a < 0 || ins.a >= self || ins.b >= self || ins.b >= regs)
      return false;
    if ((op_kind(ins.op) == OpKind::Unary) != (ins.b < 0)) return false;
    if (ins.round_bf16) return false;  // the generated kernels compute in f32 only
  }
  return !f.program.empty() || f.reads.size() == 1;
}

// The statements that compute `f`'s registers into locals r<prefix>0...; the
// inputs are read by `read(k)` (an expression). Returns the name of the last
// register.
template <typename Read>
std::string emit_program(std::ostringstream& os, const FusedAttrs& f, const std::string& prefix,
                         Read read) {
  const size_t ni = f.reads.size();
  auto reg = [&](int k) { return "r" + prefix + std::to_string(k); };
  for (size_t k = 0; k < ni; ++k) os << "  const float " << reg(static_cast<int>(k)) << " = " << read(k) << ";\n";
  for (size_t i = 0; i < f.program.size(); ++i) {
    const FusedInstr& ins = f.program[i];
    os << "  const float " << reg(static_cast<int>(ni + i)) << " = kiln::scalar<kiln::Op::"
       << op_name(ins.op) << ">(" << reg(ins.a);
    if (ins.b >= 0) os << ", " << reg(ins.b);
    os << ");\n";
  }
  return reg(static_cast<int>(ni + f.program.size()) - 1);
}

// How input slot `slot` (a.in[slot]) is read at flat position `pos`.
std::string read_expr(FusedRead r, int slot, const std::string& pos) {
  const std::string s = std::to_string(slot);
  switch (r) {
    case FusedRead::Whole: return "a.in[" + s + "][" + pos + "]";
    case FusedRead::Scalar: return "a.in[" + s + "][0]";
    case FusedRead::Row: return "a.in[" + s + "][" + pos + " % a.row[" + s + "]]";
  }
  return "";
}

void emit_body(std::ostringstream& os, const FusedAttrs& body) {
  os << "KILN_HD inline float kiln_body(const KilnArgs& a, long long i) {\n";
  const std::string last = emit_program(os, body, "", [&](size_t k) {
    return read_expr(body.reads[k], static_cast<int>(k), "i");
  });
  os << "  return " << last << ";\n}\n";
}

}  // namespace

std::string prelude() {
  std::ostringstream os;
  os << "// kiln: generated CUDA source (backend/cuda_codegen.cpp)\n"
     << "#ifdef __CUDACC_RTC__\nnamespace kiln {\nenum class Op : unsigned char {";
  for (int i = 0; i < kOpCount; ++i) os << (i ? ", " : " ") << op_name(static_cast<Op>(i));
  os << " };\n}  // namespace kiln\n"
     // Shared memory as the backend's kernels declare it (kernel_macros.cuh);
     // kiln's CUDA emulator defines it before the program.
     << "#ifndef KILN_SHARED\n#define KILN_SHARED(type, name, dims) __shared__ type name "
        "dims\n#endif\n"
     << "#endif\n";
  std::string math = scalar_math_text();
  const std::string once = "#pragma once\n";
  if (auto p = math.find(once); p != std::string::npos) math.erase(p, once.size());
  os << math << kArgs;
  return os.str();
}

bool can_generate(const FusedAttrs& f) {
  return f.reads.size() <= static_cast<size_t>(kMaxInputs) && program_ok(f);
}

bool can_generate(const FusedReduceAttrs& f) {
  const bool epi = !f.epilogue.program.empty();
  const size_t inputs = f.body.reads.size() + (epi ? f.epilogue.reads.size() - 1 : 0);
  if (inputs > static_cast<size_t>(kMaxInputs) || !program_ok(f.body)) return false;
  if (f.reduce.axes.empty()) return false;
  for (size_t i = 1; i < f.reduce.axes.size(); ++i)
    if (f.reduce.axes[i] != f.reduce.axes[i - 1] + 1) return false;
  if (!epi) return true;
  return program_ok(f.epilogue) && f.epilogue_sum >= 0 &&
         f.epilogue_sum < static_cast<int>(f.epilogue.reads.size());
}

Source fused_elementwise(const FusedAttrs& f) {
  if (!can_generate(f)) fail("FusedElementwise", "the CUDA code generator cannot run this program");
  std::ostringstream os;
  os << prelude();
  emit_body(os, f);
  os << R"(#ifdef __CUDACC_RTC__
extern "C" __global__ void __launch_bounds__(256) kiln_fused(const KilnArgs a) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride)
    a.out[i] = kiln_body(a, i);
}
#endif
)";
  return {os.str(), {"kiln_fused"}};
}

Source fused_reduce(const FusedReduceAttrs& f) {
  if (!can_generate(f)) fail("FusedReduce", "the CUDA code generator cannot run this program");
  std::ostringstream os;
  os << prelude();
  emit_body(os, f.body);
  const bool epi = !f.epilogue.program.empty();
  if (epi) {
    // The epilogue's inputs other than the sum follow the body's.
    os << "KILN_HD inline float kiln_epilogue(const KilnArgs& a, float s, long long o) {\n";
    const int first = static_cast<int>(f.body.reads.size());
    const std::string last = emit_program(os, f.epilogue, "e", [&](size_t k) -> std::string {
      const int kk = static_cast<int>(k);
      if (kk == f.epilogue_sum) return "s";
      const int slot = first + kk - (kk > f.epilogue_sum ? 1 : 0);
      return read_expr(f.epilogue.reads[k], slot, "o");
    });
    os << "  return " << last << ";\n}\n";
  } else {
    os << "KILN_HD inline float kiln_epilogue(const KilnArgs&, float s, long long) { return s; }\n";
  }
  // Rows: a warp per output, lanes stride along the row and the partial sums
  // meet through shuffles. Columns: a thread per output walks the summed axes
  // (consecutive threads read consecutive inner positions) where there are
  // outputs enough to fill the GPU; else (a bias gradient: 768 sums of 6304
  // rows) the rows are split in chunks, a block of 32 columns x 8 row lanes
  // per (tile, chunk) writes partial sums, and a second kernel adds each
  // output's chunks in order and runs the epilogue (no atomics: the same
  // sums on every run).
  os << R"(#ifdef __CUDACC_RTC__
extern "C" __global__ void __launch_bounds__(256) kiln_fused_rows(const KilnArgs a) {
  const int lane = threadIdx.x & 31;
  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long o = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; o < a.outer;
       o += warps) {
    float acc = 0.0f;
    for (long long r = lane; r < a.reduced; r += 32) acc += kiln_body(a, o * a.reduced + r);
    for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, d);
    if (lane == 0) a.out[o] = kiln_epilogue(a, acc, o);
  }
}
extern "C" __global__ void __launch_bounds__(256) kiln_fused_cols(const KilnArgs a) {
  const long long total = a.outer * a.inner;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
    const long long o = t / a.inner, j = t - o * a.inner;
    float acc = 0.0f;
    for (long long r = 0; r < a.reduced; ++r) acc += kiln_body(a, (o * a.reduced + r) * a.inner + j);
    a.out[t] = kiln_epilogue(a, acc, t);
  }
}
extern "C" __global__ void __launch_bounds__(256) kiln_fused_cols_part(const KilnArgs a) {
  KILN_SHARED(float, sums, [8][33]);
  const int lane = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const long long tiles_per_row = (a.inner + 31) / 32, tiles = a.outer * tiles_per_row;
  const long long tile = blockIdx.x % tiles, chunk = blockIdx.x / tiles;
  const long long o = tile / tiles_per_row, j = (tile % tiles_per_row) * 32 + lane;
  const long long r0 = chunk * a.chunk_rows;
  const long long r1 = r0 + a.chunk_rows < a.reduced ? r0 + a.chunk_rows : a.reduced;
  float acc = 0.0f;
  if (j < a.inner)
    for (long long r = r0 + ty; r < r1; r += 8) acc += kiln_body(a, (o * a.reduced + r) * a.inner + j);
  sums[ty][lane] = acc;
  __syncthreads();
  if (ty == 0 && j < a.inner) {
    float s = 0.0f;
    for (int k = 0; k < 8; ++k) s += sums[k][lane];
    a.part[chunk * (a.outer * a.inner) + o * a.inner + j] = s;
  }
}
extern "C" __global__ void __launch_bounds__(256) kiln_fused_cols_finish(const KilnArgs a) {
  const long long total = a.outer * a.inner;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
    float s = 0.0f;
    for (long long c = 0; c < a.chunks; ++c) s += a.part[c * total + t];
    a.out[t] = kiln_epilogue(a, s, t);
  }
}
#endif
)";
  return {os.str(),
          {"kiln_fused_rows", "kiln_fused_cols", "kiln_fused_cols_part", "kiln_fused_cols_finish"}};
}

}  // namespace kiln::codegen
