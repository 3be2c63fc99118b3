// kiln backends: how every backend's kernels view an array around the axes
// an op works along (host code, shared by the cpu, ref and cuda backends).
#pragma once
#include <cstdint>
#include <vector>

#include "kiln/shape.h"

namespace kiln {

// An array as [outer, reduced, inner] (row-major), around a group of axes.
struct ReduceView {
  int64_t outer = 1, reduced = 1, inner = 1;
};

// The view for reducing `axes` (sorted) of shape s, size-1 axes merged with
// their neighbours; false when the reduced axes of size other than 1 do not
// form one contiguous group.
bool reduce_view(const Shape& s, const std::vector<int>& axes, ReduceView& v);

// The view around one axis (a scan's or a sort's): reduced is its length.
ReduceView axis_view(const Shape& s, int axis);

}  // namespace kiln
