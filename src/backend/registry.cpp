// kiln backends: the built-in backends (cpu, ref), registered explicitly —
// once, before the first kernel, allocator or capability lookup — rather than
// by static initializers, which a static link may drop.
#include <mutex>

#include "kiln/allocator.h"
#include "ops/dispatch.h"

namespace kiln {
namespace cpu {
void register_backend();
}
namespace ref {
void register_backend();
}

void register_builtin_backends() {
  static std::once_flag once;
  std::call_once(once, [] {
    cpu::register_backend();
    ref::register_backend();
  });
}

}  // namespace kiln
