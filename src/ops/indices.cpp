// kiln ops: the index reader the backends share (ops/indices.h).
#include "ops/indices.h"

#include <algorithm>
#include <string>

namespace kiln {
namespace {

template <typename T>
void read_as_int64(const T* ix, int64_t n, int64_t dim, bool wrap, const char* op,
                   const char* what, int64_t* out) {
  const int64_t lo = wrap ? -dim : 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t v = ix[j];
    if (v < lo || v >= dim)
      fail(op, std::string(what) + " " + std::to_string(v) + " at position " + std::to_string(j) +
                   " is outside [" + std::to_string(lo) + ", " + std::to_string(dim) + ")");
    out[j] = v < 0 ? v + dim : v;
  }
}

}  // namespace

std::vector<int64_t> window_starts(const Array& starts, const Shape& full, const Shape& window) {
  std::vector<int64_t> out(full.size());
  for (size_t i = 0; i < full.size(); ++i) {
    const int64_t v =
        starts.dtype() == DType::i32 ? starts.data<int32_t>()[i] : starts.data<int64_t>()[i];
    out[i] = std::clamp<int64_t>(v, 0, full[i] - window[i]);
  }
  return out;
}

std::vector<int64_t> read_indices(const Array& idx, int64_t dim, bool wrap, const char* op,
                                  const char* what) {
  std::vector<int64_t> out(idx.size());
  switch (idx.dtype()) {
    case DType::i32:
      read_as_int64(idx.data<int32_t>(), idx.size(), dim, wrap, op, what, out.data());
      break;
    case DType::i64:
      read_as_int64(idx.data<int64_t>(), idx.size(), dim, wrap, op, what, out.data());
      break;
    default: fail(op, std::string("indices must be i32 or i64, got ") + name_of(idx.dtype()));
  }
  return out;
}

}  // namespace kiln
