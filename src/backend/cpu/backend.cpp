// kiln cpu backend: the kernel table, registered when the library loads.
#include "backend/cpu/kernels.h"
#include "backend/cpu/sgemm.h"
#include "kiln/ops.h"

namespace kiln {
namespace cpu {
namespace {

struct Registrar {
  Registrar() {
    static KernelTable table;
    register_elementwise(table);
    register_reduce(table);
    register_matmul(table);
    register_layout(table);
    register_nn(table);
    register_random(table);
    register_fused(table);
    register_attention(table);
    register_kernels(DeviceType::cpu, &table);
  }
} registrar;

}  // namespace
}  // namespace cpu

void set_num_threads(int n) {
  if (n < 1) fail("set_num_threads", "thread count must be positive, got " + std::to_string(n));
  omp_set_num_threads(n);
}
int num_threads() {
  return omp_get_max_threads();
}
std::string cpu_gemm_library() {
  return cpu::sgemm_library_name();
}
std::string cpu_gemm_library_reason() {
  return cpu::sgemm_library_reason();
}
std::string cpu_gemm_isa() {
  if (cpu::sgemm_runs_avx512()) return "AVX-512";
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "AVX2" : "SSE";
}
bool cpu_bf16_gemm_native() {
  return cpu::native_bf16_gemm();
}

}  // namespace kiln
