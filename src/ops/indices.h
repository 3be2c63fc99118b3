// kiln ops: reading the integer indices of an indexing primitive (take,
// scatter_add, softmax cross-entropy's labels) with the same checks and
// errors on every backend whose memory the host can read.
#pragma once
#include <cstdint>
#include <vector>

#include "kiln/array.h"

namespace kiln {

// Integer indices (i32 or i64, in host-visible memory) as int64. Each must
// lie in [-dim, dim) when negative ones wrap (NumPy's rule; returned
// wrapped), else in [0, dim); otherwise fail(op, ...) names the value and
// its position.
std::vector<int64_t> read_indices(const Array& idx, int64_t dim, bool wrap, const char* op,
                                  const char* what);

// DynamicSlice's and DynamicUpdateSlice's window: integer starts [ndim] (in
// host-visible memory), each clamped to [0, full - window] so that the
// window fits (JAX's rule).
std::vector<int64_t> window_starts(const Array& starts, const Shape& full, const Shape& window);

}  // namespace kiln
