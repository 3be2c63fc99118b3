// kiln cuda backend: NVRTC compilation of generated kernels (see nvrtc.h).
#include "backend/cuda/nvrtc.h"

#include "backend/cuda/dynlib.h"

#include <algorithm>
#include <sstream>
#include <vector>

namespace kiln::cuda {

namespace {

// ptxas -v reports per kernel: "Used N registers" and "X bytes spill stores,
// Y bytes spill loads".
void read_ptxas_report(Compiled& c) {
  std::istringstream is(c.log);
  std::string line;
  while (std::getline(is, line)) {
    if (auto p = line.find("Used "); p != std::string::npos && line.find("registers") != std::string::npos)
      c.registers = std::max(c.registers, std::atoi(line.c_str() + p + 5));
    if (auto p = line.find("bytes spill stores"); p != std::string::npos) {
      // "... 0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads"
      auto number_before = [&](size_t end) {
        size_t b = line.rfind(',', end);
        b = b == std::string::npos ? 0 : b + 1;
        return std::atol(line.c_str() + b);
      };
      c.spill_stores += number_before(p);
      if (auto q = line.find("bytes spill loads"); q != std::string::npos)
        c.spill_loads += number_before(q);
    }
  }
}

// The NVRTC functions a compile calls: the backend's (the emulator's in an
// emulation build) or the GPU's.
template <typename F>
using Fn = const dyn::Lazy<F>&;
struct Nvrtc {
  Fn<decltype(::nvrtcCreateProgram)> create;
  Fn<decltype(::nvrtcCompileProgram)> compile;
  Fn<decltype(::nvrtcGetProgramLogSize)> log_size;
  Fn<decltype(::nvrtcGetProgramLog)> log;
  Fn<decltype(::nvrtcGetErrorString)> error_string;
  Fn<decltype(::nvrtcGetCUBINSize)> cubin_size;
  Fn<decltype(::nvrtcGetCUBIN)> cubin;
  Fn<decltype(::nvrtcDestroyProgram)> destroy;
};

Compiled compile_with(const Nvrtc& api, const std::string& source, const std::string& arch,
                      const std::string& name) {
  Compiled c;
  nvrtcProgram prog = nullptr;
  if (api.create(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr) != NVRTC_SUCCESS) {
    c.log = "nvrtcCreateProgram failed";
    return c;
  }
  const std::string arch_opt = "-arch=" + arch;
  const std::vector<const char*> opts = {arch_opt.c_str(), "-std=c++17", "--ptxas-options=-v",
                                         "-lineinfo"};
  const nvrtcResult r = api.compile(prog, static_cast<int>(opts.size()), opts.data());
  size_t n = 0;
  if (api.log_size(prog, &n) == NVRTC_SUCCESS && n > 1) {
    c.log.resize(n);
    api.log(prog, c.log.data());
    c.log.resize(n - 1);  // the terminating NUL
  }
  if (r != NVRTC_SUCCESS) {
    c.log = std::string(api.error_string(r)) + "\n" + c.log;
  } else if (api.cubin_size(prog, &n) == NVRTC_SUCCESS && n > 0) {
    c.cubin.resize(n);
    c.ok = api.cubin(prog, c.cubin.data()) == NVRTC_SUCCESS;
  }
  api.destroy(&prog);
  read_ptxas_report(c);
  return c;
}

}  // namespace

Compiled nvrtc_compile(const std::string& source, const std::string& arch,
                       const std::string& name) {
  static const Nvrtc api{dyn::nvrtcCreateProgram,     dyn::nvrtcCompileProgram,
                         dyn::nvrtcGetProgramLogSize, dyn::nvrtcGetProgramLog,
                         dyn::nvrtcGetErrorString,    dyn::nvrtcGetCUBINSize,
                         dyn::nvrtcGetCUBIN,          dyn::nvrtcDestroyProgram};
  return compile_with(api, source, arch, name);
}

Compiled nvrtc_compile_for_gpu(const std::string& source, const std::string& arch,
                               const std::string& name) {
  static const Nvrtc api{dyn::gpu::nvrtcCreateProgram,     dyn::gpu::nvrtcCompileProgram,
                         dyn::gpu::nvrtcGetProgramLogSize, dyn::gpu::nvrtcGetProgramLog,
                         dyn::gpu::nvrtcGetErrorString,    dyn::gpu::nvrtcGetCUBINSize,
                         dyn::gpu::nvrtcGetCUBIN,          dyn::gpu::nvrtcDestroyProgram};
  return compile_with(api, source, arch, name);
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  dyn::nvrtcVersion(&major, &minor);
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace kiln::cuda
