// kiln cpu backend: layout kernels (transpose, broadcast, concatenate, slice,
// take/scatter, one_hot, dynamic_slice and dynamic_update_slice). Reshape and stop_gradient alias
// their input.
#include "backend/cpu/kernels.h"

namespace kiln::cpu {
namespace {

// Copies elements of `elem` bytes along a strided view: operand 0 is the
// destination, operand 1 the source.
template <typename T>
void strided_copy(T* dst, const T* src, const StridedView& v) {
  for_each_strided<2>(v, 1, [&](const int64_t* off, int64_t n, const int64_t* s) {
    T* d = dst + off[0];
    const T* x = src + off[1];
    if (s[0] == 1 && s[1] == 1) {
      std::memcpy(d, x, n * sizeof(T));
    } else {
      for (int64_t i = 0; i < n; ++i) d[i * s[0]] = x[i * s[1]];
    }
  });
}

template <typename F>
void by_size(size_t bytes, const char* op, F&& f) {
  switch (bytes) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
  }
  fail(op, "unsupported element size");
}

void transpose_kernel(const KernelContext&, const Primitive& p,
                      const std::vector<Array>& in, ArrayNode& out) {
  const auto& perm = p.attrs<PermAttrs>().perm;
  auto in_strides = contiguous_strides(in[0].shape());
  StridedView v;
  v.shape = out.shape;
  v.strides.push_back(contiguous_strides(out.shape));
  std::vector<int64_t> src(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) src[i] = in_strides[perm[i]];
  v.strides.push_back(src);
  v = collapse(std::move(v));
  void* y = alloc_output(out);
  by_size(size_of(out.dtype), p.name(), [&](auto t) {
    using T = decltype(t);
    T* dst = static_cast<T*>(y);
    const T* x = static_cast<const T*>(in[0].raw());
    // Swapping the two innermost axes: by tiles (transpose_tiles).
    size_t r = v.shape.size();
    if (r >= 2 && v.strides[1][r - 1] == v.shape[r - 2] && v.strides[1][r - 2] == 1 &&
        v.shape[r - 1] >= 16 && v.shape[r - 2] >= 16) {
      int64_t rows = v.shape[r - 2], cols = v.shape[r - 1];
      int64_t outer = 1;
      for (size_t d = 0; d + 2 < r; ++d) outer *= v.shape[d];
      bool plain_outer = true;  // outer axes contiguous in both
      for (size_t d = 0; d + 2 < r; ++d) plain_outer &= v.strides[0][d] == v.strides[1][d];
      if (plain_outer && (r == 2 || v.strides[0][r - 3] == rows * cols))
        return transpose_tiles(x, outer, rows, cols, dst);
    }
    strided_copy(dst, x, v);
  });
}

void broadcast_kernel(const KernelContext&, const Primitive& p,
                      const std::vector<Array>& in, ArrayNode& out) {
  void* y = alloc_output(out);
  auto v = make_broadcast_view(out.shape, {in[0].shape()});
  by_size(size_of(out.dtype), p.name(), [&](auto t) {
    using T = decltype(t);
    strided_copy(static_cast<T*>(y), static_cast<const T*>(in[0].raw()), v);
  });
}

void concatenate_kernel(const KernelContext&, const Primitive& p,
                        const std::vector<Array>& in, ArrayNode& out) {
  int ax = p.attrs<AxisAttrs>().axis;
  size_t es = size_of(out.dtype);
  int64_t outer = 1, inner = es;
  for (int i = 0; i < ax; ++i) outer *= out.shape[i];
  for (size_t i = ax + 1; i < out.shape.size(); ++i) inner *= out.shape[i];
  char* y = static_cast<char*>(alloc_output(out));
  const int64_t row = out.shape[ax] * inner;
  // The output's bytes split evenly over the threads, each range copied from
  // the inputs' pieces it covers: a concatenation along the first axis (one
  // row: the qkv weights, three [384, 384] into [1152, 384]) is split too,
  // rather than copied by one thread.
  parallel_for(outer * row, 1, [&](int64_t b, int64_t e) {
    while (b < e) {
      const int64_t o = b / row;
      int64_t pos = b % row, start = 0;
      for (const auto& x : in) {
        const int64_t chunk = x.shape()[ax] * inner;
        if (pos < start + chunk) {
          const int64_t n = std::min(e - b, start + chunk - pos);
          std::memcpy(y + b, static_cast<const char*>(x.raw()) + o * chunk + (pos - start), n);
          b += n;
          pos += n;
          if (b == e) break;
        }
        start += chunk;
      }
    }
  });
}

StridedView slice_view(const SliceAttrs& s, const Shape& out) {
  auto full = contiguous_strides(s.full);
  StridedView v;
  v.shape = out;
  v.strides.push_back(contiguous_strides(out));
  std::vector<int64_t> src(out.size());
  for (size_t i = 0; i < out.size(); ++i) src[i] = full[i] * s.step[i];
  v.strides.push_back(src);
  return v;  // not collapsed: the caller adds the start offset first
}

int64_t slice_offset(const SliceAttrs& s) {
  auto full = contiguous_strides(s.full);
  int64_t off = 0;
  for (size_t i = 0; i < full.size(); ++i) off += s.start[i] * full[i];
  return off;
}

void slice_kernel(const KernelContext&, const Primitive& p,
                  const std::vector<Array>& in, ArrayNode& out) {
  const auto& s = p.attrs<SliceAttrs>();
  void* y = alloc_output(out);
  auto v = collapse(slice_view(s, out.shape));
  by_size(size_of(out.dtype), p.name(), [&](auto t) {
    using T = decltype(t);
    strided_copy(static_cast<T*>(y), static_cast<const T*>(in[0].raw()) + slice_offset(s), v);
  });
}

void slice_grad_kernel(const KernelContext&, const Primitive& p,
                       const std::vector<Array>& in, ArrayNode& out) {
  const auto& s = p.attrs<SliceAttrs>();
  void* y = alloc_output(out);
  std::memset(y, 0, numel(out.shape) * size_of(out.dtype));
  StridedView v = slice_view(s, in[0].shape());
  std::swap(v.strides[0], v.strides[1]);  // destination is the full array now
  v = collapse(std::move(v));
  by_size(size_of(out.dtype), p.name(), [&](auto t) {
    using T = decltype(t);
    strided_copy(static_cast<T*>(y) + slice_offset(s), static_cast<const T*>(in[0].raw()), v);
  });
}

// The window of a DynamicSlice or DynamicUpdateSlice as a unit-step slice of
// `full` at the (clamped) starts read from `starts`.
SliceAttrs window_of(const Array& starts, const Shape& full, const Shape& window) {
  SliceAttrs s{window_starts(starts, full, window), {}, Shape(full.size(), 1), full};
  s.stop = s.start;
  for (size_t i = 0; i < full.size(); ++i) s.stop[i] += window[i];
  return s;
}

void dynamic_slice_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                          ArrayNode& out) {
  void* y = alloc_output(out);
  if (numel(out.shape) == 0) return;
  const SliceAttrs s = window_of(in[1], in[0].shape(), out.shape);
  auto v = collapse(slice_view(s, out.shape));
  by_size(size_of(out.dtype), p.name(), [&](auto t) {
    using T = decltype(t);
    strided_copy(static_cast<T*>(y), static_cast<const T*>(in[0].raw()) + slice_offset(s), v);
  });
}

// x, with update written over the window. The output may be x's memory (the
// op runs in place) or, where the window is all of x, update's.
void dynamic_update_slice_kernel(const KernelContext&, const Primitive& p,
                                 const std::vector<Array>& in, ArrayNode& out) {
  const Array &x = in[0], &u = in[1];
  void* y = alloc_output(out);
  const size_t bytes = numel(out.shape) * size_of(out.dtype);
  if (u.size() == numel(out.shape)) {
    if (y != u.raw()) std::memcpy(y, u.raw(), bytes);
    return;
  }
  if (y != x.raw()) std::memcpy(y, x.raw(), bytes);
  if (u.size() == 0) return;
  const SliceAttrs s = window_of(in[2], x.shape(), u.shape());
  StridedView v = slice_view(s, u.shape());
  std::swap(v.strides[0], v.strides[1]);  // the destination is the full array
  v = collapse(std::move(v));
  by_size(size_of(out.dtype), p.name(), [&](auto t) {
    using T = decltype(t);
    strided_copy(static_cast<T*>(y) + slice_offset(s), static_cast<const T*>(u.raw()), v);
  });
}

void take_kernel(const KernelContext&, const Primitive& p,
                 const std::vector<Array>& in, ArrayNode& out) {
  int ax = p.attrs<AxisAttrs>().axis;
  const Array &a = in[0], &idx = in[1];
  int64_t outer = 1, inner = size_of(a.dtype()), dim = a.shape()[ax];
  for (int i = 0; i < ax; ++i) outer *= a.shape()[i];
  for (size_t i = ax + 1; i < a.ndim(); ++i) inner *= a.shape()[i];
  std::vector<int64_t> ids = read_indices(idx, dim, true, "take", "index");
  int64_t n = static_cast<int64_t>(ids.size());
  char* y = static_cast<char*>(alloc_output(out));
  const char* x = static_cast<const char*>(a.raw());
  parallel_for(outer * n, inner, [&](int64_t b, int64_t e) {
    for (int64_t job = b; job < e; ++job) {
      int64_t o = job / n, j = job % n;
      std::memcpy(y + job * inner, x + (o * dim + ids[j]) * inner, inner);
    }
  });
}

void scatter_add_kernel(const KernelContext&, const Primitive& p,
                        const std::vector<Array>& in, ArrayNode& out) {
  const auto& s = p.attrs<ScatterAttrs>();
  const Array &idx = in[0], &upd = in[1];
  int64_t outer = 1, inner = 1, dim = s.shape[s.axis];
  for (int i = 0; i < s.axis; ++i) outer *= s.shape[i];
  for (size_t i = s.axis + 1; i < s.shape.size(); ++i) inner *= s.shape[i];
  std::vector<int64_t> ids = read_indices(idx, dim, true, "scatter_add", "index");
  int64_t n = static_cast<int64_t>(ids.size());
  dispatch_numeric(upd.dtype(), p.name(), [&](auto t) {
    using T = decltype(t);
    T* y = static_cast<T*>(alloc_output(out));
    const T* u = upd.data<T>();
    std::fill_n(y, numel(s.shape), st<T>(0));
    // Parallel over outer and inner; the index loop stays serial per element
    // so that repeated indices accumulate without races.
    parallel_for(outer, n * inner, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o)
        for (int64_t j = 0; j < n; ++j) {
          T* dst = y + (o * dim + ids[j]) * inner;
          const T* src = u + (o * n + j) * inner;
          for (int64_t i = 0; i < inner; ++i) dst[i] = st<T>(ld(dst[i]) + ld(src[i]));
        }
    });
  });
}

void one_hot_kernel(const KernelContext&, const Primitive& p,
                    const std::vector<Array>& in, ArrayNode& out) {
  const auto& a = p.attrs<OneHotAttrs>();
  std::vector<int64_t> labels(in[0].size());
  dispatch_int(in[0].dtype(), "one_hot", [&](auto t) {
    const auto* l = in[0].data<decltype(t)>();
    std::copy(l, l + labels.size(), labels.begin());
  });
  dispatch_all(out.dtype, p.name(), [&](auto t) {
    using T = decltype(t);
    T* y = static_cast<T*>(alloc_output(out));
    std::fill_n(y, numel(out.shape), st<T>(0));
    // Labels outside [0, depth) give an all-zero row, as in JAX.
    for (size_t i = 0; i < labels.size(); ++i)
      if (labels[i] >= 0 && labels[i] < a.depth) y[i * a.depth + labels[i]] = st<T>(1);
  });
}

}  // namespace

void register_layout(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Transpose)] = transpose_kernel;
  t.kernels[static_cast<int>(Op::BroadcastTo)] = broadcast_kernel;
  t.kernels[static_cast<int>(Op::Concatenate)] = concatenate_kernel;
  t.kernels[static_cast<int>(Op::Slice)] = slice_kernel;
  t.kernels[static_cast<int>(Op::SliceGrad)] = slice_grad_kernel;
  t.kernels[static_cast<int>(Op::Take)] = take_kernel;
  t.kernels[static_cast<int>(Op::ScatterAdd)] = scatter_add_kernel;
  t.kernels[static_cast<int>(Op::OneHot)] = one_hot_kernel;
  t.kernels[static_cast<int>(Op::DynamicSlice)] = dynamic_slice_kernel;
  t.kernels[static_cast<int>(Op::DynamicUpdateSlice)] = dynamic_update_slice_kernel;
}

}  // namespace kiln::cpu
