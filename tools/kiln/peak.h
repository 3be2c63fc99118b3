// kiln train's peak FLOP rate: the denominator of the model FLOP utilization
// it reports (part of the kiln-tools library, outside libkiln).
#pragma once

namespace kiln::tools {

// Measures the CPU's fp32 FMA throughput on all threads (GFLOP/s), with the
// vector ISA the GEMMs run on (cpu_gemm_isa()).
double measure_peak_gflops();

}  // namespace kiln::tools
