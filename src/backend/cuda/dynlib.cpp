// kiln cuda backend: loading cuBLASLt and NVRTC on first use (dynlib.h).
#include "backend/cuda/dynlib.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "kiln/error.h"

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

// The library's file name, tried on the loader's path (LD_LIBRARY_PATH,
// ld.so.cache), then in the toolkit kiln was built with.
void* open(Lib lib) {
  const std::string file = std::string(lib == Lib::cublaslt ? "libcublasLt.so." : "libnvrtc.so.") +
                           KILN_STR(KILN_CUDA_MAJOR);
  std::string errors;
  for (const std::string& path : {file, std::string(KILN_CUDA_LIBRARY_DIR) + "/" + file,
                                  "/usr/local/cuda/lib64/" + file}) {
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    if (const char* e = dlerror()) errors += std::string("\n  ") + e;
  }
  fail("cuda", "cannot load " + file + " (CUDA " + KILN_STR(KILN_CUDA_MAJOR) +
                   "'s " + (lib == Lib::cublaslt ? "cuBLASLt" : "NVRTC") +
                   "; put its folder on LD_LIBRARY_PATH):" + errors);
}

}  // namespace

void* symbol(Lib lib, const char* name) {
  static std::once_flag once[2];
  static void* handles[2] = {};
  const int i = static_cast<int>(lib);
  std::call_once(once[i], [&] { handles[i] = open(lib); });
  void* f = dlsym(handles[i], name);
  if (!f) fail("cuda", std::string("the CUDA library has no ") + name + ": " + dlerror());
  return f;
}

}  // namespace kiln::cuda::dyn
