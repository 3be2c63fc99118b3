// kiln train's peak FLOP rate: the denominator of the model FLOP utilization
// it reports (part of the kiln-tools library, outside libkiln).
#pragma once
#include <string>

namespace kiln::tools {

// Measures the CPU's peak rate on all threads (GFLOP/s) on the unit the
// GEMMs run on: for f32, fp32 FMAs of cpu_gemm_isa(); for bf16 (mixed
// precision), cpu_bf16_gemm_unit()'s: AMX tiles, AVX512-BF16 dot products,
// or the f32 FMAs where bf16 runs at the f32 rate.
double measure_peak_gflops(bool bf16 = false);
// What measure_peak_gflops(bf16) measures, e.g. "an AMX bf16 tile loop" or
// "an fp32 AVX-512 FMA loop".
std::string peak_description(bool bf16 = false);

}  // namespace kiln::tools
