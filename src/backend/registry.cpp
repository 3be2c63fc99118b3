// kiln backends: the built-in backends (cpu, ref, and cuda where kiln was
// built with the CUDA toolkit), registered explicitly — once, before the
// first kernel, allocator or capability lookup — rather than by static
// initializers, which a static link may drop; and the device queries that
// depend on which backends were built.
#include <mutex>

#include "core/registration.h"
#include "kiln/allocator.h"
#include "kiln/device.h"
#include "ops/dispatch.h"

namespace kiln {
namespace cpu {
void register_backend();
}
namespace ref {
void register_backend();
}
#ifdef KILN_HAVE_CUDA
namespace cuda {
void register_backend();
int device_count();
std::string unavailable_reason();
std::string device_name(int index);
AllocatorStats memory_stats(int index);
}  // namespace cuda
#endif

void register_builtin_backends() {
  static std::once_flag once;
  std::call_once(once, [] {
    cpu::register_backend();
    ref::register_backend();
#ifdef KILN_HAVE_CUDA
    cuda::register_backend();
#endif
  });
}

int cuda_device_count() {
#ifdef KILN_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::string cuda_unavailable_reason() {
#ifdef KILN_HAVE_CUDA
  return cuda::unavailable_reason();
#else
  return "kiln was built without the CUDA backend (no CUDA toolkit was found at build time)";
#endif
}

std::string device_name(Device device) {
#ifdef KILN_HAVE_CUDA
  if (device.type == DeviceType::cuda) return cuda::device_name(device.index);
#endif
  return device.str();
}

AllocatorStats device_memory_stats(Device device) {
  if (device.type == DeviceType::cpu) return cpu_allocator_stats();
#ifdef KILN_HAVE_CUDA
  if (device.type == DeviceType::cuda) return cuda::memory_stats(device.index);
#endif
  return {};
}

}  // namespace kiln
