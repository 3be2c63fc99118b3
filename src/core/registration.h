// kiln core: how backends plug in (internal): their allocators, and the one
// call that registers the built-in backends' kernels and allocators.
#pragma once
#include "kiln/allocator.h"

namespace kiln {

// The allocator of each device type; backends register theirs (one for the
// type, or one per device index).
void register_allocator(DeviceType type, Allocator* alloc);
void register_device_allocators(DeviceType type, Allocator* (*for_device)(Device));
// Registers the built-in backends' kernels and allocators, once (defined by
// the backends layer; allocator_for and the kernel dispatch call it first).
void register_builtin_backends();

}  // namespace kiln
