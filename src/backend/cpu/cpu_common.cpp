// kiln cpu backend: helpers shared by the kernels (strided views).
#include "backend/cpu/cpu_common.h"

namespace kiln::cpu {

StridedView make_broadcast_view(const Shape& out, const std::vector<Shape>& inputs) {
  StridedView v;
  v.shape = out;
  v.strides.push_back(contiguous_strides(out));
  for (const auto& s : inputs) {
    std::vector<int64_t> st(out.size(), 0);
    auto cs = contiguous_strides(s);
    size_t lead = out.size() - s.size();
    for (size_t i = 0; i < s.size(); ++i) st[lead + i] = s[i] == 1 ? 0 : cs[i];
    v.strides.push_back(std::move(st));
  }
  return collapse(std::move(v));
}

StridedView collapse(StridedView v) {
  StridedView c;
  c.strides.resize(v.strides.size());
  for (size_t d = 0; d < v.shape.size(); ++d) {
    if (v.shape[d] == 1) continue;
    bool merge = !c.shape.empty();
    for (size_t k = 0; merge && k < v.strides.size(); ++k)
      merge = c.strides[k].back() == v.strides[k][d] * v.shape[d];
    if (merge) {
      c.shape.back() *= v.shape[d];
      for (size_t k = 0; k < v.strides.size(); ++k) c.strides[k].back() = v.strides[k][d];
    } else {
      c.shape.push_back(v.shape[d]);
      for (size_t k = 0; k < v.strides.size(); ++k) c.strides[k].push_back(v.strides[k][d]);
    }
  }
  return c;
}

}  // namespace kiln::cpu
