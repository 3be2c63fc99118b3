// kiln's CUDA emulator, the device side: CUDA's built-ins for kernels
// compiled by the host's C++ compiler (the KILN_CUDA_EMULATION build force-
// includes this header before every source of src/backend/cuda/, and before
// each program the emulated NVRTC compiles). What it provides:
//
//   threadIdx, blockIdx, blockDim, gridDim, warpSize;
//   __syncthreads, __syncwarp, the shuffles (__shfl_sync, _up, _down, _xor,
//   with their masks and widths), the votes (__ballot_sync, __any_sync,
//   __all_sync) and the atomics, through the emulator (emulator.h);
//   shared memory through KILN_SHARED and KILN_DYNAMIC_SHARED (a bare
//   __shared__ is a compile error here: the emulator must place the variable
//   to check accesses to it), kernel launches through KILN_LAUNCH;
//   nvcuda::wmma (wmma.h); cuda_bf16's arithmetic is the toolkit's host code.
//
// Kernels and their device functions are otherwise plain C++ here.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "backend/cuda/emulation/emulator.h"

#define KILN_CUDA_EMULATION 1

// host_defines.h makes these empty for a host compiler already; a bare
// __shared__ would declare an ordinary local.
#undef __shared__
// clang-format off
#define __shared__ _Pragma("GCC error \"declare shared memory with KILN_SHARED or KILN_DYNAMIC_SHARED\"")
// clang-format on
#undef __launch_bounds__
#define __launch_bounds__(...)

#define threadIdx (::kiln::emu::tls_view->thread_idx)
#define blockIdx (::kiln::emu::tls_view->block_idx)
#define blockDim (::kiln::emu::tls_view->block_dim)
#define gridDim (::kiln::emu::tls_view->grid_dim)
inline constexpr int warpSize = 32;

namespace kiln::emu::detail {

// The calling thread's lane: its linear index in the block, modulo 32.
inline int lane_id() {
  const ThreadView* v = tls_view;
  const unsigned t =
      v->thread_idx.x + v->block_dim.x * (v->thread_idx.y + v->block_dim.y * v->thread_idx.z);
  return static_cast<int>(t % 32);
}

[[noreturn]] inline void bad_width(const char* op, int width) {
  char what[160];
  std::snprintf(what, sizeof what, "%s with width %d (a power of two from 1 to 32 expected)", op,
                width);
  abort_launch(what);
}

// Lane `src`'s var among the lanes of `mask` (src == the caller's lane: its
// own value, as where the source lies outside the caller's segment).
template <typename T>
T shuffle(const char* op, unsigned mask, T var, int src, int width) {
  static_assert(std::is_trivially_copyable_v<T>, "a shuffled value must be trivially copyable");
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) bad_width(op, width);
  alignas(T) unsigned char all[32 * sizeof(T)];
  unsigned arrived = 0;
  warp_gather(op, mask, &var, sizeof(T), all, &arrived);
  if (src == lane_id()) return var;
  if (!(arrived >> src & 1u)) {
    char what[200];
    std::snprintf(what, sizeof what,
                  "%s (mask 0x%08x) reads lane %d, which is not in the mask or has exited: its "
                  "value is undefined",
                  op, mask, src);
    abort_launch(what);
  }
  T r;
  std::memcpy(&r, all + src * sizeof(T), sizeof(T));
  return r;
}

}  // namespace kiln::emu::detail

inline void __syncthreads() {
  ::kiln::emu::sync_block();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::kiln::emu::sync_warp(mask);
}

// The shuffles, as CUDA defines their source lane: within segments of
// `width` lanes; a source in a later segment (up, down, xor) gives the
// caller's own value.
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  const int lane = ::kiln::emu::detail::lane_id(), base = lane & ~(width - 1);
  return ::kiln::emu::detail::shuffle("__shfl_sync", mask, var, base + (src_lane & (width - 1)),
                                      width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const int lane = ::kiln::emu::detail::lane_id(), base = lane & ~(width - 1);
  const int src = lane - static_cast<int>(delta);
  return ::kiln::emu::detail::shuffle("__shfl_up_sync", mask, var, src < base ? lane : src, width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const int lane = ::kiln::emu::detail::lane_id(), base = lane & ~(width - 1);
  const int src = lane + static_cast<int>(delta);
  return ::kiln::emu::detail::shuffle("__shfl_down_sync", mask, var,
                                      src >= base + width ? lane : src, width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  const int lane = ::kiln::emu::detail::lane_id(), base = lane & ~(width - 1);
  const int src = lane ^ lane_mask;
  return ::kiln::emu::detail::shuffle("__shfl_xor_sync", mask, var,
                                      src >= base + width ? lane : src, width);
}

// The votes: over the lanes of `mask` that have not exited.
inline unsigned kiln_emu_vote(const char* op, unsigned mask, int predicate) {
  int all[32] = {};
  const int p = predicate != 0;
  unsigned arrived = 0;
  ::kiln::emu::warp_gather(op, mask, &p, sizeof p, all, &arrived);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l)
    if ((arrived >> l & 1u) && all[l]) r |= 1u << l;
  return r;
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return kiln_emu_vote("__ballot_sync", mask, predicate);
}
inline int __any_sync(unsigned mask, int predicate) {
  return kiln_emu_vote("__any_sync", mask, predicate) != 0;
}
inline int __all_sync(unsigned mask, int predicate) {
  unsigned arrived = 0;
  int all[32] = {};
  const int p = predicate != 0;
  ::kiln::emu::warp_gather("__all_sync", mask, &p, sizeof p, all, &arrived);
  for (int l = 0; l < 32; ++l)
    if ((arrived >> l & 1u) && !all[l]) return 0;
  return 1;
}

// The atomics kiln's kernels use, and their near relatives.
inline int atomicAdd(int* p, int v) {
  return ::kiln::emu::atomic_add(p, v);
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return ::kiln::emu::atomic_add(p, v);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return ::kiln::emu::atomic_add(p, v);
}
inline float atomicAdd(float* p, float v) {
  return ::kiln::emu::atomic_add(p, v);
}
inline double atomicAdd(double* p, double v) {
  return ::kiln::emu::atomic_add(p, v);
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
  return ::kiln::emu::atomic_add(p, v);
}
inline __half atomicAdd(__half* p, __half v) {
  return ::kiln::emu::atomic_add(p, v);
}
inline int atomicMax(int* p, int v) {
  return ::kiln::emu::atomic_max(p, v);
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  return ::kiln::emu::atomic_max(p, v);
}
inline int atomicMin(int* p, int v) {
  return ::kiln::emu::atomic_min(p, v);
}
inline unsigned atomicMin(unsigned* p, unsigned v) {
  return ::kiln::emu::atomic_min(p, v);
}
inline int atomicExch(int* p, int v) {
  return ::kiln::emu::atomic_exch(p, v);
}
inline unsigned atomicExch(unsigned* p, unsigned v) {
  return ::kiln::emu::atomic_exch(p, v);
}
inline float atomicExch(float* p, float v) {
  return ::kiln::emu::atomic_exch(p, v);
}
inline int atomicCAS(int* p, int c, int v) {
  return ::kiln::emu::atomic_cas(p, c, v);
}
inline unsigned atomicCAS(unsigned* p, unsigned c, unsigned v) {
  return ::kiln::emu::atomic_cas(p, c, v);
}
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long c,
                                    unsigned long long v) {
  return ::kiln::emu::atomic_cas(p, c, v);
}

// Bit casts and the fast-math intrinsics (computed exactly here).
inline float __int_as_float(int v) {
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}
inline int __float_as_int(float v) {
  int i;
  std::memcpy(&i, &v, 4);
  return i;
}
inline float __uint_as_float(unsigned v) {
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}
inline unsigned __float_as_uint(float v) {
  unsigned i;
  std::memcpy(&i, &v, 4);
  return i;
}
inline float __expf(float x) {
  return std::exp(x);
}
inline float __logf(float x) {
  return std::log(x);
}
inline float __fdividef(float a, float b) {
  return a / b;
}
inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
inline double rsqrt(double x) {
  return 1.0 / std::sqrt(x);
}
inline float __saturatef(float x) {
  return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x);
}
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
[[noreturn]] inline void __trap() {
  ::kiln::emu::abort_launch("__trap()");
}

// Shared memory. KILN_SHARED(float, tile, [32][33]) is CUDA's
// `__shared__ float tile[32][33];`, here a reference into the block's shared
// memory; KILN_DYNAMIC_SHARED(unsigned char, smem, 128) is
// `extern __shared__ __align__(128) unsigned char smem[];`, here a pointer.
#define KILN_SHARED(type, name, dims)                                           \
  static constexpr ::kiln::emu::SharedSite kiln_shared_site_##name{#name};      \
  auto& name = *static_cast<type(*) dims>(                                      \
      ::kiln::emu::shared_variable(&kiln_shared_site_##name, sizeof(type dims), \
                                   alignof(type dims) < 16 ? 16 : alignof(type dims)))
#define KILN_DYNAMIC_SHARED(type, name, align) \
  type* name = static_cast<type*>(::kiln::emu::dynamic_shared())

namespace kiln::emu {

// A launch's arguments, copied at the launch as CUDA copies them, and the
// kernel they are passed to.
template <typename F, typename... A>
struct Closure {
  F f;
  std::tuple<A...> args;
  static void run(const void* self) {
    const Closure& c = *static_cast<const Closure*>(self);
    std::apply(c.f, c.args);
  }
};

template <typename F>
struct Launcher {
  const char* name;
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
  F f;
  template <typename... A>
  void operator()(const A&... args) const {
    using C = Closure<F, std::decay_t<A>...>;
    launch(name, grid, block, shared, stream,
           std::make_shared<const C>(C{f, std::tuple<std::decay_t<A>...>(args...)}), &C::run);
  }
};

template <typename F>
Launcher<F> launcher(const char* name, dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                     F f) {
  return {name, grid, block, shared, stream, std::move(f)};
}

}  // namespace kiln::emu

// KILN_LAUNCH(grid, block, shared bytes, stream, kernel)(args...) is CUDA's
// kernel<<<grid, block, shared bytes, stream>>>(args...).
#define KILN_LAUNCH(grid, block, shared, stream, ...)              \
  ::kiln::emu::launcher(#__VA_ARGS__, grid, block, shared, stream, \
                        [=](auto... kiln_args) { __VA_ARGS__(kiln_args...); })

#include "backend/cuda/emulation/wmma.h"
