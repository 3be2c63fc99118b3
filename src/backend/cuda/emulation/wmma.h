// kiln's CUDA emulator: nvcuda::wmma, the warp's matrix operations, for
// kernels compiled on the host (included by device.h).
//
// A fragment is spread over the 32 lanes of a warp as on the GPU: each lane
// holds num_elements = rows·cols/32 of its elements (lane l the elements l,
// l + 32, l + 64, ... of the fragment's matrix, row-major: one layout the
// hardware's unspecified one may be; kernels that assume another one are
// wrong on the GPU too). load, store and mma are warp collectives: every lane
// of the warp must reach the same operation with the same pointer and
// leading dimension. mma_sync gathers the operands of all lanes and computes
// each lane's elements of D = A·B + C with products of the operands as the
// tensor cores take them (bf16 and f16 exactly, tf32 with the 13 low bits of
// the mantissa dropped) summed in f32 in k order.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "backend/cuda/emulation/emulator.h"

namespace nvcuda::wmma {

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
namespace precision {
struct tf32;
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

// The element type a fragment holds for operand type T.
template <typename T>
struct Storage {
  using type = T;
};
template <>
struct Storage<precision::tf32> {
  using type = float;
};

// Operand value as the tensor cores multiply it.
inline float operand(float v, bool tf32) {
  if (!tf32) return v;
  uint32_t b;
  std::memcpy(&b, &v, 4);
  b &= 0xffffe000u;  // tf32 keeps 10 mantissa bits
  std::memcpy(&v, &b, 4);
  return v;
}
inline float operand(__nv_bfloat16 v, bool) {
  return __bfloat162float(v);
}
inline float operand(__half v, bool) {
  return __half2float(v);
}

template <typename E>
E from_float(float v) {
  if constexpr (std::is_same_v<E, __half>)
    return __float2half_rn(v);
  else if constexpr (std::is_same_v<E, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return v;
}

// What every lane of a load or store must pass alike.
struct MemoryOp {
  const void* p;
  unsigned ldm;
  int layout;
  bool operator==(const MemoryOp&) const = default;
};

[[noreturn]] inline void fail(const char* what) {
  ::kiln::emu::abort_launch(what);
}

// Checks that every lane passed the same pointer, ldm and layout, that the
// pointer is 256-bit aligned and ldm a multiple of 16 bytes.
inline void check_memory_op(const char* op, const void* p, unsigned ldm, int layout,
                            size_t element_bytes) {
  MemoryOp mine{p, ldm, layout}, all[32];
  unsigned arrived = 0;
  ::kiln::emu::warp_gather(op, 0xffffffffu, &mine, sizeof mine, all, &arrived);
  char what[256];
  for (int l = 0; l < 32; ++l) {
    if (!(arrived >> l & 1u)) {
      std::snprintf(what, sizeof what, "%s: lane %d of the warp did not take part", op, l);
      fail(what);
    }
    if (!(all[l] == mine)) {
      std::snprintf(what, sizeof what,
                    "%s: the lanes of the warp passed different arguments (pointer %p, ldm %u "
                    "against lane %d's %p, %u)",
                    op, mine.p, mine.ldm, l, all[l].p, all[l].ldm);
      fail(what);
    }
  }
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) {
    std::snprintf(what, sizeof what, "%s: pointer %p is not 256-bit aligned", op, p);
    fail(what);
  }
  if ((ldm * element_bytes) % 16 != 0) {
    std::snprintf(what, sizeof what, "%s: ldm %u (%zu-byte elements) is not a multiple of 16 bytes",
                  op, ldm, element_bytes);
    fail(what);
  }
}

}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
 public:
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  static_assert(rows * cols % 32 == 0, "a fragment spreads evenly over the warp");
  using element_type = T;
  using storage_element_type = typename detail::Storage<T>::type;
  static constexpr int num_elements = rows * cols / 32;
  storage_element_type x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename L>
void fill_fragment(fragment<Use, M, N, K, T, L>& f,
                   const typename fragment<Use, M, N, K, T, L>::storage_element_type& v) {
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = v;
}

namespace detail {

// Element j of the calling lane: (row, column) of the fragment's matrix.
template <int Cols>
inline void position(int j, int& r, int& c) {
  const int i = ::kiln::emu::detail::lane_id() + 32 * j;
  r = i / Cols;
  c = i % Cols;
}

template <typename F, typename E>
void load(F& f, const E* p, unsigned ldm, bool col_major, const char* op) {
  check_memory_op(op, p, ldm, col_major, sizeof(E));
  for (int j = 0; j < F::num_elements; ++j) {
    int r, c;
    position<F::cols>(j, r, c);
    f.x[j] = col_major ? p[static_cast<size_t>(c) * ldm + r] : p[static_cast<size_t>(r) * ldm + c];
  }
}

}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename L>
void load_matrix_sync(fragment<Use, M, N, K, T, L>& f,
                      const typename fragment<Use, M, N, K, T, L>::storage_element_type* p,
                      unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load names its layout");
  detail::load(f, p, ldm, std::is_same_v<L, col_major>, "wmma::load_matrix_sync");
}

template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm,
                      layout_t layout) {
  detail::load(f, p, ldm, layout == mem_col_major, "wmma::load_matrix_sync");
}

template <int M, int N, int K, typename T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm,
                       layout_t layout) {
  using F = fragment<accumulator, M, N, K, T>;
  detail::check_memory_op("wmma::store_matrix_sync", p, ldm, layout == mem_col_major, sizeof(T));
  for (int j = 0; j < F::num_elements; ++j) {
    int r, c;
    detail::position<F::cols>(j, r, c);
    if (layout == mem_col_major)
      p[static_cast<size_t>(c) * ldm + r] = f.x[j];
    else
      p[static_cast<size_t>(r) * ldm + c] = f.x[j];
  }
}

// D = A·B + C over the warp (D may be C).
template <int M, int N, int K, typename TA, typename LA, typename LB, typename TC, typename TD>
void mma_sync(fragment<accumulator, M, N, K, TD>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TA, LB>& b,
              const fragment<accumulator, M, N, K, TC>& c) {
  using FA = fragment<matrix_a, M, N, K, TA, LA>;
  using FB = fragment<matrix_b, M, N, K, TA, LB>;
  using FC = fragment<accumulator, M, N, K, TC>;
  using FD = fragment<accumulator, M, N, K, TD>;
  struct Operands {
    typename FA::storage_element_type a[FA::num_elements];
    typename FB::storage_element_type b[FB::num_elements];
    typename FC::storage_element_type c[FC::num_elements];
  };
  Operands mine;
  std::memcpy(mine.a, a.x, sizeof mine.a);
  std::memcpy(mine.b, b.x, sizeof mine.b);
  std::memcpy(mine.c, c.x, sizeof mine.c);
  Operands all[32];
  unsigned arrived = 0;
  ::kiln::emu::warp_gather("wmma::mma_sync", 0xffffffffu, &mine, sizeof mine, all, &arrived);
  if (arrived != 0xffffffffu) detail::fail("wmma::mma_sync: not every lane of the warp took part");
  constexpr bool tf32 = std::is_same_v<TA, precision::tf32>;
  // Lane l's element j is element l + 32·j of the matrix: element i is lane
  // i % 32's element i / 32.
  auto at_a = [&](int r, int k) {
    const int i = r * K + k;
    return detail::operand(all[i % 32].a[i / 32], tf32);
  };
  auto at_b = [&](int k, int n) {
    const int i = k * N + n;
    return detail::operand(all[i % 32].b[i / 32], tf32);
  };
  typename FD::storage_element_type out[FD::num_elements];
  for (int j = 0; j < FD::num_elements; ++j) {
    int r, n;
    detail::position<N>(j, r, n);
    float s = detail::operand(mine.c[j], false);
    for (int k = 0; k < K; ++k) s = std::fma(at_a(r, k), at_b(k, n), s);
    out[j] = detail::from_float<typename FD::storage_element_type>(s);
  }
  std::memcpy(d.x, out, sizeof out);
}

// Rounds to the nearest tf32 value (ties away from zero), as cvt.rna.tf32.f32.
inline float __float_to_tf32(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  if ((b & 0x7f800000u) != 0x7f800000u) b = (b + 0x1000u) & 0xffffe000u;
  std::memcpy(&v, &b, 4);
  return v;
}

}  // namespace nvcuda::wmma
