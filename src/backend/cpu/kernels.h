// kiln cpu backend: kernel registration, one function per kernel family.
#pragma once
#include "backend/cpu/cpu_common.h"

namespace kiln::cpu {

void register_elementwise(KernelTable& t);
void register_reduce(KernelTable& t);
void register_matmul(KernelTable& t);
void register_layout(KernelTable& t);
void register_nn(KernelTable& t);
void register_random(KernelTable& t);
void register_fused(KernelTable& t);

}  // namespace kiln::cpu
