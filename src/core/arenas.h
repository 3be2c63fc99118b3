// kiln core: the arenas of compiled executables (internal), shared. An
// executable that does not record its runs borrows an arena for each run and
// gives it back after it (compiler/executable.cpp), so that the programs of a
// process (a training step, its evaluation's batch shapes, every jitted
// function) hold one arena at a time between them rather than one each, and
// a program's first run writes to pages that an earlier run already touched.
#pragma once
#include <memory>

#include "kiln/allocator.h"

namespace kiln {

// The smallest free arena on `device` of `bytes` or more; a new one from the
// device's allocator where none is, the smaller free ones given back to it
// (a larger one serves their programs as well).
std::shared_ptr<Buffer> borrow_arena(size_t bytes, Device device);
void give_back_arena(std::shared_ptr<Buffer> arena);
// Gives the free arenas on `device` back to its allocator (cpu_allocator_trim).
void drop_free_arenas(Device device);

}  // namespace kiln
