// kiln backends: the array views the kernels share (views.h).
#include "backend/views.h"

#include <algorithm>

namespace kiln {

bool reduce_view(const Shape& s, const std::vector<int>& axes, ReduceView& v) {
  v = ReduceView{};
  int first = -1, last = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool r = std::binary_search(axes.begin(), axes.end(), static_cast<int>(i));
    if (r && s[i] != 1) {
      if (first < 0) first = static_cast<int>(i);
      last = static_cast<int>(i);
    }
  }
  if (first < 0) {  // only size-1 axes reduced
    v.outer = numel(s);
    return true;
  }
  for (int i = first; i <= last; ++i)
    if (s[i] != 1 && !std::binary_search(axes.begin(), axes.end(), i)) return false;
  for (int i = 0; i < first; ++i) v.outer *= s[i];
  for (int i = first; i <= last; ++i) v.reduced *= s[i];
  for (size_t i = last + 1; i < s.size(); ++i) v.inner *= s[i];
  return true;
}

ReduceView axis_view(const Shape& s, int axis) {
  ReduceView v;
  for (int d = 0; d < axis; ++d) v.outer *= s[d];
  v.reduced = s[axis];
  for (size_t d = axis + 1; d < s.size(); ++d) v.inner *= s[d];
  return v;
}

}  // namespace kiln
