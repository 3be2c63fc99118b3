// kiln cuda backend: run-time compilation of generated CUDA source with
// NVRTC, to a cubin for one GPU architecture. Needs no GPU (CI compiles every
// kernel the code generator emits for the ViT's training step with it), and
// no CUDA header in its interface.
#pragma once
#include <string>

namespace kiln::cuda {

struct Compiled {
  bool ok = false;
  std::string log;    // NVRTC's log with ptxas's report (-v)
  std::string cubin;  // the machine code, when ok
  int registers = 0;  // the most registers any kernel uses
  long spill_stores = 0, spill_loads = 0;  // bytes, over all kernels
};

// Compiles `source` for `arch` (e.g. "sm_90a") at -O3; `name` names the
// program in messages. In an emulation build this is the emulator's NVRTC,
// which compiles for the host (emulation/nvrtc.cpp).
Compiled nvrtc_compile(const std::string& source, const std::string& arch,
                       const std::string& name = "kiln_generated.cu");
// The GPU's NVRTC in every build: compiles for `arch` where no GPU is (the
// compile-only checks of the generated kernels).
Compiled nvrtc_compile_for_gpu(const std::string& source, const std::string& arch,
                               const std::string& name = "kiln_generated.cu");

// NVRTC's version, "13.0".
std::string nvrtc_version();

}  // namespace kiln::cuda
