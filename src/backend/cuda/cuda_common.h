// kiln cuda backend: what its host code and kernels share — error checks that
// become kiln errors, each device's stream, launch sizes, and the element
// types of kiln's dtypes on the device. Included by src/backend/cuda/ only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/allocator.h"
#include "kiln/array.h"
#include "kiln/error.h"
#include "ops/dispatch.h"
#include "ops/primitive.h"

namespace kiln::cuda {

// Fails (a kiln Error naming `what`) when e is not cudaSuccess.
void check(cudaError_t e, const char* what);
#define KILN_CUDA_CHECK(expr) ::kiln::cuda::check((expr), #expr)

// Makes device `index` current on this thread (and initializes it on first
// use); fails with a clear message where it does not exist or no driver is
// present.
void use_device(int index);
// The stream every op on device `index` is queued on, in order.
cudaStream_t stream(int index);
// The device's stream for a kernel (after use_device(ctx.device.index)).
cudaStream_t begin(const KernelContext& ctx);
// Fails where the last launch on this thread was refused (bad configuration).
void check_launch(const char* kernel);

struct DeviceInfo {
  std::string name;
  int multiprocessors = 0;
  int major = 0, minor = 0;
  size_t shared_per_block_optin = 0;
  size_t total_memory = 0;
};
const DeviceInfo& device_info(int index);

// Blocks of `threads` for a grid-stride loop over n elements (at most a few
// waves: the loop covers the rest).
inline unsigned blocks_for(int64_t n, int threads = 256) {
  int64_t b = (n + threads - 1) / threads;
  if (b > 65535LL * 8) b = 65535LL * 8;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

// Element type on the device of each dtype (f16 has no kernels).
template <typename F>
void visit_dtype(DType dt, const char* who, F&& f);

// The memory behind an array on this backend.
template <typename T>
const T* ptr(const Array& a) {
  return static_cast<const T*>(a.raw());
}
template <typename T>
T* out_ptr(ArrayNode& out) {
  return static_cast<T*>(alloc_output(out));
}

// Registration of each kernel family (one file each).
void register_transfer(KernelTable& t);
void register_elementwise(KernelTable& t);
void register_reduce(KernelTable& t);
void register_matmul(KernelTable& t);
void register_layout(KernelTable& t);
void register_nn(KernelTable& t);
void register_conv(KernelTable& t);
void register_random(KernelTable& t);
void register_collectives(KernelTable& t);
void register_fused(KernelTable& t);
void register_attention(KernelTable& t);
void register_sdpa(KernelTable& t);  // sdpa.cu
// What the backend runs beyond having a kernel (matmul.cpp: GEMM epilogues;
// fused.cpp: generated programs).
bool supports_epilogue(const EpilogueAttrs& e, const std::vector<DType>& inputs, DType out);
bool supports_fused(const Primitive& p);

template <typename F>
void visit_dtype(DType dt, const char* who, F&& f) {
  switch (dt) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::bf16: return f(__nv_bfloat16{});
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    case DType::bool_: return f(bool{});
    case DType::f16: break;
  }
  fail(who, std::string("dtype ") + name_of(dt) + " has no kernels on the cuda backend");
}

}  // namespace kiln::cuda
