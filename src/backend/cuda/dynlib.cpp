// kiln cuda backend: loading cuBLASLt, cuDNN, NVRTC and NCCL on first use (dynlib.h).
#include "backend/cuda/dynlib.h"

#include <dlfcn.h>

#include <iterator>
#include <mutex>
#include <string>

#include "kiln/error.h"
#ifdef KILN_CUDA_EMULATION
#include "backend/cuda/emulation/libraries.h"
#endif

namespace kiln::cuda::dyn {
namespace {

#ifndef KILN_CUDA_MAJOR
#error "KILN_CUDA_MAJOR (the CUDA toolkit's major version) must be defined by the build"
#endif
#ifndef KILN_CUDA_LIBRARY_DIR
#define KILN_CUDA_LIBRARY_DIR "/usr/local/cuda/lib64"
#endif
#define KILN_STR2(x) #x
#define KILN_STR(x) KILN_STR2(x)

// Each library's soname (cuBLASLt's and NVRTC's carry the CUDA toolkit's
// major version, NCCL's and cuDNN's their own) and what it is, in the order of Lib.
struct Library {
  const char* file;
  const char* what;
};
constexpr Library kLibraries[] = {
    {"libcublasLt.so." KILN_STR(KILN_CUDA_MAJOR), "CUDA " KILN_STR(KILN_CUDA_MAJOR) "'s cuBLASLt"},
    {"libnvrtc.so." KILN_STR(KILN_CUDA_MAJOR), "CUDA " KILN_STR(KILN_CUDA_MAJOR) "'s NVRTC"},
    {"libnccl.so." KILN_STR(NCCL_MAJOR), "NCCL, the collectives of a run of several ranks on GPUs"},
    {"libnvrtc.so." KILN_STR(KILN_CUDA_MAJOR), "CUDA " KILN_STR(KILN_CUDA_MAJOR) "'s NVRTC"},
#if KILN_HAVE_CUDNN
    {"libcudnn.so." KILN_STR(CUDNN_MAJOR),
     "cuDNN " KILN_STR(CUDNN_MAJOR) ", the convolutions on GPUs"},
#else
    {"libcudnn.so", "cuDNN, absent from this build"},
#endif
};
const Library& library(Lib lib) {
  return kLibraries[static_cast<int>(lib)];
}

// The library's file name, tried on the loader's path (LD_LIBRARY_PATH,
// ld.so.cache), then in the toolkit kiln was built with.
void* open(Lib lib) {
  const std::string file = library(lib).file;
  std::string errors;
  for (const std::string& path : {file, std::string(KILN_CUDA_LIBRARY_DIR) + "/" + file,
                                  "/usr/local/cuda/lib64/" + file}) {
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    if (const char* e = dlerror()) errors += std::string("\n  ") + e;
  }
  fail("cuda", "cannot load " + file + " (" + library(lib).what +
                   "; put its folder on LD_LIBRARY_PATH):" + errors);
}

}  // namespace

void* symbol(Lib lib, const char* name) {
#ifdef KILN_CUDA_EMULATION
  if (lib != Lib::nvrtc_gpu) {
    void* f = lib == Lib::cublaslt ? emu::cublaslt_symbol(name)
              : lib == Lib::nvrtc  ? emu::nvrtc_symbol(name)
              : lib == Lib::cudnn  ? emu::cudnn_symbol(name)
                                   : emu::nccl_symbol(name);
    if (!f) fail("cuda", std::string("the CUDA emulator has no ") + name);
    return f;
  }
#endif
  static std::once_flag once[std::size(kLibraries)];
  static void* handles[std::size(kLibraries)] = {};
  const int i = static_cast<int>(lib);
  std::call_once(once[i], [&] { handles[i] = open(lib); });
  void* f = dlsym(handles[i], name);
  if (!f) fail("cuda", std::string(library(lib).file) + " has no " + name + ": " + dlerror());
  return f;
}

}  // namespace kiln::cuda::dyn
