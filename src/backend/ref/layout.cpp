// kiln ref backend: layout kernels — Transpose, BroadcastTo, Concatenate,
// Slice, SliceGrad, Take, DynamicSlice and DynamicUpdateSlice move whole
// elements (bytes, so every dtype is exact), each output element found from
// its multi-index; ScatterAdd sums in f64 (int64 for integers); OneHot
// writes 0s and 1s.
#include <cstdint>
#include <cstring>

#include "backend/ref/ref_common.h"

namespace kiln::ref {
namespace {

// Element i of `src` into element o of `dst`, both of `bytes`-wide elements.
inline void move_element(void* dst, int64_t o, const void* src, int64_t i, size_t bytes) {
  std::memcpy(static_cast<char*>(dst) + o * bytes, static_cast<const char*>(src) + i * bytes,
              bytes);
}

// out[j] = in[j[perm^-1]]: output axis d is input axis perm[d].
void transpose_kernel(const KernelContext&, const Primitive& p,
                      const std::vector<Array>& in, ArrayNode& out) {
  const auto& perm = p.attrs<PermAttrs>().perm;
  const Shape& s = in[0].shape();
  const size_t es = size_of(out.dtype);
  void* y = alloc_output(out);
  for (int64_t o = 0; o < numel(out.shape); ++o) {
    std::vector<int64_t> j = unravel(o, out.shape), idx(s.size());
    for (size_t d = 0; d < perm.size(); ++d) idx[perm[d]] = j[d];
    move_element(y, o, in[0].raw(), ravel(idx, s), es);
  }
}

void broadcast_kernel(const KernelContext&, const Primitive&,
                      const std::vector<Array>& in, ArrayNode& out) {
  const size_t es = size_of(out.dtype);
  void* y = alloc_output(out);
  for (int64_t o = 0; o < numel(out.shape); ++o)
    move_element(y, o, in[0].raw(), broadcast_index(unravel(o, out.shape), in[0].shape()), es);
}

void concatenate_kernel(const KernelContext&, const Primitive& p,
                        const std::vector<Array>& in, ArrayNode& out) {
  const int ax = p.attrs<AxisAttrs>().axis;
  const size_t es = size_of(out.dtype);
  void* y = alloc_output(out);
  for (int64_t o = 0; o < numel(out.shape); ++o) {
    std::vector<int64_t> j = unravel(o, out.shape);
    size_t k = 0;  // the input that holds position j[ax] along the axis
    while (j[ax] >= in[k].shape()[ax]) j[ax] -= in[k++].shape()[ax];
    move_element(y, o, in[k].raw(), ravel(j, in[k].shape()), es);
  }
}

// Output element j is element start + j * step of the full (input) array.
void slice_kernel(const KernelContext&, const Primitive& p,
                  const std::vector<Array>& in, ArrayNode& out) {
  const auto& s = p.attrs<SliceAttrs>();
  const size_t es = size_of(out.dtype);
  void* y = alloc_output(out);
  for (int64_t o = 0; o < numel(out.shape); ++o) {
    std::vector<int64_t> j = unravel(o, out.shape);
    for (size_t d = 0; d < j.size(); ++d) j[d] = s.start[d] + j[d] * s.step[d];
    move_element(y, o, in[0].raw(), ravel(j, s.full), es);
  }
}

// The transpose of Slice: zeros of the full shape, input element j written at
// start + j * step.
void slice_grad_kernel(const KernelContext&, const Primitive& p,
                       const std::vector<Array>& in, ArrayNode& out) {
  const auto& s = p.attrs<SliceAttrs>();
  const size_t es = size_of(out.dtype);
  void* y = alloc_output(out);
  std::memset(y, 0, numel(out.shape) * es);
  const Shape& sliced = in[0].shape();
  for (int64_t i = 0; i < numel(sliced); ++i) {
    std::vector<int64_t> j = unravel(i, sliced);
    for (size_t d = 0; d < j.size(); ++d) j[d] = s.start[d] + j[d] * s.step[d];
    move_element(y, ravel(j, out.shape), in[0].raw(), i, es);
  }
}

// Window element j is element start + j of the full array (starts clamped
// so that the window fits).
void dynamic_slice_kernel(const KernelContext&, const Primitive&, const std::vector<Array>& in,
                          ArrayNode& out) {
  const size_t es = size_of(out.dtype);
  void* y = alloc_output(out);
  if (numel(out.shape) == 0) return;
  const std::vector<int64_t> start = window_starts(in[1], in[0].shape(), out.shape);
  for (int64_t o = 0; o < numel(out.shape); ++o) {
    std::vector<int64_t> j = unravel(o, out.shape);
    for (size_t d = 0; d < j.size(); ++d) j[d] += start[d];
    move_element(y, o, in[0].raw(), ravel(j, in[0].shape()), es);
  }
}

// x, update element j written at start + j. The output may share x's memory
// (in place) or, where the window is all of x, update's.
void dynamic_update_slice_kernel(const KernelContext&, const Primitive&,
                                 const std::vector<Array>& in, ArrayNode& out) {
  const Array &x = in[0], &u = in[1];
  const size_t es = size_of(out.dtype);
  void* y = alloc_output(out);
  if (u.size() == numel(out.shape)) {
    if (y != u.raw()) std::memcpy(y, u.raw(), numel(out.shape) * es);
    return;
  }
  if (y != x.raw()) std::memcpy(y, x.raw(), numel(out.shape) * es);
  if (u.size() == 0) return;
  const std::vector<int64_t> start = window_starts(in[2], x.shape(), u.shape());
  for (int64_t i = 0; i < u.size(); ++i) {
    std::vector<int64_t> j = unravel(i, u.shape());
    for (size_t d = 0; d < j.size(); ++d) j[d] += start[d];
    move_element(y, ravel(j, out.shape), u.raw(), i, es);
  }
}

// a viewed as [outer, dim, inner], indices as n values: the output is
// [outer, n, inner] with out[o, j, k] = a[o, index[j], k].
void take_kernel(const KernelContext&, const Primitive& p,
                 const std::vector<Array>& in, ArrayNode& out) {
  const int ax = p.attrs<AxisAttrs>().axis;
  const Array &a = in[0], &idx = in[1];
  const Shape& s = a.shape();
  int64_t outer = 1, inner = 1;
  const int64_t dim = s[ax];
  for (int d = 0; d < ax; ++d) outer *= s[d];
  for (size_t d = ax + 1; d < s.size(); ++d) inner *= s[d];
  const std::vector<int64_t> ids = read_indices(idx, dim, true, "take", "index");
  const int64_t n = static_cast<int64_t>(ids.size());
  const size_t es = size_of(out.dtype);
  void* y = alloc_output(out);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < inner; ++k)
        move_element(y, (o * n + j) * inner + k, a.raw(), (o * dim + ids[j]) * inner + k, es);
}

// The transpose of Take: zeros(shape), viewed as [outer, dim, inner], plus
// updates [outer, n, inner] added at out[o, index[j], k] (repeats add up).
void scatter_add_kernel(const KernelContext&, const Primitive& p,
                        const std::vector<Array>& in, ArrayNode& out) {
  const auto& s = p.attrs<ScatterAttrs>();
  const Array &idx = in[0], &upd = in[1];
  int64_t outer = 1, inner = 1;
  const int64_t dim = s.shape[s.axis];
  for (int d = 0; d < s.axis; ++d) outer *= s.shape[d];
  for (size_t d = s.axis + 1; d < s.shape.size(); ++d) inner *= s.shape[d];
  const std::vector<int64_t> ids = read_indices(idx, dim, true, "scatter_add", "index");
  const int64_t n = static_cast<int64_t>(ids.size());
  const DType dt = upd.dtype();
  if (dt == DType::bool_ || dt == DType::f16)
    fail(p.name(), std::string("no ref kernel for dtype ") + name_of(dt));
  const std::vector<double> u = load(upd);
  std::vector<double> y(numel(s.shape), 0.0);
  std::vector<int64_t> yi(is_integral(dt) ? y.size() : 0, 0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < inner; ++k) {
        const int64_t dst = (o * dim + ids[j]) * inner + k, src = (o * n + j) * inner + k;
        if (is_integral(dt))
          yi[dst] += static_cast<int64_t>(u[src]);
        else
          y[dst] += u[src];
      }
  for (size_t i = 0; i < yi.size(); ++i) y[i] = static_cast<double>(yi[i]);
  store(out, y);
}

// Row i is 1 at labels[i] and 0 elsewhere; a label outside [0, depth) gives
// a row of zeros (as in JAX).
void one_hot_kernel(const KernelContext&, const Primitive& p,
                    const std::vector<Array>& in, ArrayNode& out) {
  const int64_t depth = p.attrs<OneHotAttrs>().depth;
  if (!is_integral(in[0].dtype()))
    fail("one_hot", std::string("indices must be i32 or i64, got ") + name_of(in[0].dtype()));
  if (out.dtype == DType::f16)
    fail(p.name(), std::string("no ref kernel for dtype ") + name_of(out.dtype));
  const std::vector<double> labels = load(in[0]);
  std::vector<double> y(numel(out.shape), 0.0);
  for (size_t i = 0; i < labels.size(); ++i) {
    const int64_t l = static_cast<int64_t>(labels[i]);
    if (l >= 0 && l < depth) y[i * depth + l] = 1;
  }
  store(out, y);
}

}  // namespace

void register_layout(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Transpose)] = transpose_kernel;
  t.kernels[static_cast<int>(Op::BroadcastTo)] = broadcast_kernel;
  t.kernels[static_cast<int>(Op::Concatenate)] = concatenate_kernel;
  t.kernels[static_cast<int>(Op::Slice)] = slice_kernel;
  t.kernels[static_cast<int>(Op::DynamicSlice)] = dynamic_slice_kernel;
  t.kernels[static_cast<int>(Op::DynamicUpdateSlice)] = dynamic_update_slice_kernel;
  t.kernels[static_cast<int>(Op::SliceGrad)] = slice_grad_kernel;
  t.kernels[static_cast<int>(Op::Take)] = take_kernel;
  t.kernels[static_cast<int>(Op::ScatterAdd)] = scatter_add_kernel;
  t.kernels[static_cast<int>(Op::OneHot)] = one_hot_kernel;
}

}  // namespace kiln::ref
