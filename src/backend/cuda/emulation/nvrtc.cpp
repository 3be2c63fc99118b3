// kiln's CUDA emulator: the NVRTC functions kiln's backend calls to compile
// the kernels it generates (fused.cpp), on the host: the program is compiled
// by the host's C++ compiler against the emulator's device header, with
// every load and store instrumented as the backend's own kernels are, into a
// shared object that cudaLibraryLoadData loads. For each kernel
// (`extern "C" __global__ void name(params)`) the emulator appends an entry
// kiln_emu_launch_<name> that launches it from cudaLaunchKernel's argument
// array. The "cubin" is the shared object's bytes.
#include <dlfcn.h>
#include <nvrtc.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/dynlib.h"
#include "backend/cuda/emulation/emulator.h"
#include "backend/cuda/emulation/libraries.h"

#ifndef KILN_EMU_CXX
#error \
    "KILN_EMU_CXX (the host compiler), KILN_EMU_SOURCE_DIR and KILN_EMU_CUDA_INCLUDE must be defined"
#endif

struct _nvrtcProgram {
  std::string source, name, log, binary;
};

namespace kiln::emu::nvrtc {
namespace {

namespace fs = std::filesystem;

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// libkiln's own path: the program links it, for the emulator's functions.
std::string libkiln_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&kiln::emu::sync_block), &info) && info.dli_fname)
    return info.dli_fname;
  return {};
}

// The entry that launches each kernel from an argument array, each argument
// read as its parameter's type.
std::string launch_entries(const std::string& source) {
  static const std::regex kernel(
      R"(extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\))");
  std::ostringstream os;
  for (auto it = std::sregex_iterator(source.begin(), source.end(), kernel);
       it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1], params = (*it)[2];
    std::vector<std::string> types;
    std::stringstream ps(params);
    std::string p;
    while (std::getline(ps, p, ',')) {
      // The parameter's type: the text before its name.
      const size_t end = p.find_last_not_of(" \t\n");
      if (end == std::string::npos) continue;
      size_t start = end;
      while (start > 0 &&
             (std::isalnum(static_cast<unsigned char>(p[start - 1])) || p[start - 1] == '_'))
        --start;
      types.push_back(p.substr(0, start));
    }
    os << "extern \"C\" void kiln_emu_launch_" << name
       << "(dim3 g, dim3 b, size_t s, cudaStream_t st, void** args) {\n  KILN_LAUNCH(g, b, s, st, "
       << name << ")(";
    for (size_t i = 0; i < types.size(); ++i)
      os << (i ? ", " : "") << "*static_cast<std::remove_cv_t<" << types[i] << ">*>(args[" << i
         << "])";
    os << ");\n}\n";
  }
  return os.str();
}

nvrtcResult compile(_nvrtcProgram& prog) {
  char dir_template[] = "/tmp/kiln-emulated-nvrtc.XXXXXX";
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      (tmp && *tmp ? std::string(tmp) : std::string("/tmp")) + "/kiln-emulated-nvrtc.XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  const char* made = mkdtemp(buf.data());
  if (!made) made = mkdtemp(dir_template);
  if (!made) {
    prog.log = "the emulated NVRTC cannot make a temporary folder";
    return NVRTC_ERROR_INTERNAL_ERROR;
  }
  const fs::path dir = made;
  const fs::path src = dir / "program.cpp", out = dir / "program.so", log = dir / "log.txt";
  {
    std::ofstream f(src);
    // NVRTC's dialect from here on: no standard headers in the program.
    f << "#define __CUDACC_RTC__ 1\n#line 1 \"" << prog.name << "\"\n"
      << prog.source << "\n#line 1 \"kiln-emulator-entries\"\n"
      << launch_entries(prog.source);
  }
  const std::string cmd = std::string(KILN_EMU_CXX) +
                          " -std=c++20 -O1 -fPIC -shared -x c++ -w -fsanitize=kernel-address"
                          " --param asan-instrumentation-with-call-threshold=0 --param asan-stack=0"
                          " --param asan-globals=0 -fno-tree-sra -Wno-unknown-pragmas -include "
                          "backend/cuda/emulation/device.h -I" +
                          quote(KILN_EMU_SOURCE_DIR) + " -I" + quote(KILN_EMU_CUDA_INCLUDE) + " " +
                          quote(src.string()) + " -o " + quote(out.string()) + " -x none " +
                          quote(libkiln_path()) + " > " + quote(log.string()) + " 2>&1";
  const int status = std::system(cmd.c_str());
  {
    std::ifstream f(log);
    std::ostringstream os;
    os << f.rdbuf();
    prog.log = os.str();
  }
  nvrtcResult r = NVRTC_SUCCESS;
  if (status != 0) {
    prog.log = "the host compiler failed (" + cmd + "):\n" + prog.log;
    r = NVRTC_ERROR_COMPILATION;
  } else {
    std::ifstream f(out, std::ios::binary);
    std::ostringstream os;
    os << f.rdbuf();
    prog.binary = os.str();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return r;
}

}  // namespace

nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name, int headers,
                               const char* const*, const char* const*) {
  if (headers != 0) return NVRTC_ERROR_INVALID_INPUT;
  *prog = new _nvrtcProgram{src, name ? name : "kiln_generated.cu", {}, {}};
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog) {
  delete *prog;
  *prog = nullptr;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int, const char* const*) {
  return compile(*prog);
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* n) {
  *n = prog->log.size() + 1;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* log) {
  std::memcpy(log, prog->log.c_str(), prog->log.size() + 1);
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t* n) {
  *n = prog->binary.size();
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char* cubin) {
  std::memcpy(cubin, prog->binary.data(), prog->binary.size());
  return NVRTC_SUCCESS;
}

const char* nvrtcGetErrorString(nvrtcResult r) {
  switch (r) {
    case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
    case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    default: return "NVRTC_ERROR_INTERNAL_ERROR";
  }
}

// "0.1": no NVRTC release, so that no cache mistakes a host program for a cubin.
nvrtcResult nvrtcVersion(int* major, int* minor) {
  *major = 0;
  *minor = 1;
  return NVRTC_SUCCESS;
}

}  // namespace kiln::emu::nvrtc

namespace kiln::emu {

void* nvrtc_symbol(const char* name) {
  using namespace nvrtc;
#define KILN_EMU_SYMBOL(fn)        \
  if (std::strcmp(name, #fn) == 0) \
    return reinterpret_cast<void*>(static_cast<decltype(&::fn)>(&fn));
  KILN_NVRTC_FUNCTIONS(KILN_EMU_SYMBOL)
#undef KILN_EMU_SYMBOL
  return nullptr;
}

}  // namespace kiln::emu
