// kiln cuda backend: what its kernels share on the device — conversions
// between kiln's element types (bf16 rounded to nearest even, as the CPU's
// bf16 does; bool is v != 0), the accumulation type of each element type,
// grid-stride loops, and strided index arithmetic over several operands.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/kernel_macros.cuh"
#include "kiln/error.h"

namespace kiln::cuda {

// The type a value of T is computed in: f32 for bf16 and f32, f64 for f64,
// the type itself for integers and bool.
template <typename T>
struct Acc {
  using type = T;
};
template <>
struct Acc<__nv_bfloat16> {
  using type = float;
};
template <typename T>
using acc_t = typename Acc<T>::type;

// Value v of type From as a To (C++'s static_cast, with bf16 through f32).
template <typename To, typename From>
__host__ __device__ inline To convert(From v) {
  if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return convert<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

template <typename T>
__device__ inline acc_t<T> load(const T* p, int64_t i) {
  return convert<acc_t<T>>(p[i]);
}

// for (i = first this thread takes; i < n; i += every thread of the grid)
#define KILN_GRID_LOOP(i, n)                                                             \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Up to this many dimensions in a strided or broadcast index.
constexpr int kMaxDims = 8;

// Index arithmetic passed by value to a kernel: the output's shape and, for
// each operand, its element stride along each output axis (0 where it is
// broadcast).
struct Strides {
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
};

// The operand offset of output element i.
__device__ inline int64_t offset_of(int64_t i, const Strides& s) {
  int64_t off = 0;
  for (int d = s.rank - 1; d >= 0; --d) {
    const int64_t q = i / s.shape[d];
    off += (i - q * s.shape[d]) * s.stride[d];
    i = q;
  }
  return off;
}

// ---- index arithmetic over several operands at once ----
// The iteration shape of a kernel and each of its K operands' element strides
// along each axis (0 where the operand is broadcast), after collapse_strides:
// at most kMaxDims axes, none of size 1, adjacent axes merged where every
// operand is contiguous across them.
template <int K>
struct MultiStrides {
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[K][kMaxDims] = {};
};

// The offset of element i of the iteration shape in each operand, computed in
// index type I (uint32_t where every offset fits, see fits_u32; int64_t
// otherwise). The leading axis needs no division.
template <typename I, int K>
__device__ inline void offsets_of(I i, const MultiStrides<K>& s, I (&off)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] = 0;
  for (int d = s.rank - 1; d > 0; --d) {
    const I n = static_cast<I>(s.shape[d]);
    const I q = i / n, r = i - q * n;
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] += r * static_cast<I>(s.stride[k][d]);
    i = q;
  }
  if (s.rank > 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] += i * static_cast<I>(s.stride[k][0]);
  }
}

// MultiStrides of `shape` for operands with the given strides (one vector of
// shape.size() strides each): drops size-1 axes and merges axis d into the
// one before it where every operand has stride[d-1] == stride[d] * shape[d].
// Fails (naming `who`) where more than kMaxDims axes remain.
template <int K>
MultiStrides<K> collapse_strides(const std::vector<int64_t>& shape,
                                 const std::array<std::vector<int64_t>, K>& strides,
                                 const char* who) {
  MultiStrides<K> m;
  int r = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = r > 0;
    for (int k = 0; merge && k < K; ++k)
      merge = m.stride[k][r - 1] == strides[k][d] * shape[d];
    if (merge) {
      m.shape[r - 1] *= shape[d];
      for (int k = 0; k < K; ++k) m.stride[k][r - 1] = strides[k][d];
      continue;
    }
    if (r == kMaxDims)
      fail(who, "more than " + std::to_string(kMaxDims) +
                    " axes after merging contiguous ones; not supported on the cuda backend");
    m.shape[r] = shape[d];
    for (int k = 0; k < K; ++k) m.stride[k][r] = strides[k][d];
    ++r;
  }
  m.rank = r;
  return m;
}

// Whether the element count and every operand offset of m stay below 2^31, so
// that uint32_t index arithmetic (cheaper in offsets_of) cannot wrap, a
// grid-stride step included.
template <int K>
bool fits_u32(const MultiStrides<K>& m) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  int64_t n = 1;
  for (int d = 0; d < m.rank; ++d) n *= m.shape[d];
  if (n >= kLimit) return false;
  for (int k = 0; k < K; ++k) {
    int64_t extent = 1;
    for (int d = 0; d < m.rank; ++d) extent += (m.shape[d] - 1) * m.stride[k][d];
    if (extent >= kLimit) return false;
  }
  return true;
}

// The contiguous (row-major) element strides of `shape`, and the strides
// with which an operand of shape `s` is read at each axis of the broadcast
// shape `out` (NumPy's rule: 0 along its size-1 and missing leading axes).
inline std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size());
  int64_t acc = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    st[d] = acc;
    acc *= shape[d];
  }
  return st;
}
inline std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& out,
                                              const std::vector<int64_t>& s) {
  std::vector<int64_t> st(out.size(), 0);
  const std::vector<int64_t> cs = row_major_strides(s);
  const size_t lead = out.size() - s.size();
  for (size_t i = 0; i < s.size(); ++i) st[lead + i] = s[i] == 1 ? 0 : cs[i];
  return st;
}

}  // namespace kiln::cuda
