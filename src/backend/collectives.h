// kiln backends: the collectives of a data-parallel run on host memory (the
// cpu and ref devices): AllReduceStart packs its inputs into the bucket's
// buffer and queues the bucket on the communication thread; AllReduceWait
// waits for it and copies its slice out.
#pragma once
#include "ops/dispatch.h"

namespace kiln::dist {

void register_host_collectives(KernelTable& table);

}  // namespace kiln::dist
