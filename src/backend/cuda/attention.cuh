// kiln cuda backend: what the fused attention's kernels share — the
// arguments of a launch, the block's dynamic shared memory and the launch
// itself — between the SIMT kernels (attention.cu: f32, f64 and bf16, computed
// in f32 or f64) and the bf16 tensor-core ones (attention_tc.cu).
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_common.cuh"

namespace kiln::cuda::attn {

// What one launch reads and writes, in storage type S (computed in T =
// acc_t<S>). qkv [B, T, 3, H, D]; dout [B, T, H, D]; out [B, T, H, D]
// (forward) or dqkv [B, T, 3, H, D]; stats: per query row (index
// (b·H + h)·T + t) the softmax's max m (0 where it is -inf), 1/l and
// rowsum(P ⊙ dP), `rows` = B·H·T apart.
template <typename S>
struct AttnArgs {
  using T = acc_t<S>;
  const S* qkv;
  const S* dout;
  S* out;
  T* stats;
  int64_t rows;
  int tokens, heads, dim;
  T scale;
};

// The dynamic shared memory of a block.
template <typename T>
__device__ __forceinline__ T* dyn_smem() {
  KILN_DYNAMIC_SHARED(unsigned char, attention_smem, 128);  // WMMA: 32 bytes
  return reinterpret_cast<T*>(attention_smem);
}

// f(S{}) for the attention kernels' storage types: f32, f64 and bf16.
template <typename F>
void visit_dtype(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::bf16: return f(__nv_bfloat16{});
    default: fail(op, std::string("needs f32, f64 or bf16 inputs, got ") + name_of(dt));
  }
}

// Launches kernel fn (`name`) of op `who` over grid (B·H, tiles) with
// `smem` bytes of dynamic shared memory (beside `static_smem` of its own),
// raising the kernel's limit on this device where it needs more than the
// default 48 KiB or than an earlier launch raised it to (sdpa.cu's sizes
// grow with the sequence). (Also sdpa.cu's.)
template <typename A>
void launch_kernel(void (*fn)(A), const KernelContext& ctx, cudaStream_t s, int64_t bh,
                   int64_t tiles, int threads, size_t smem, const A& args, const char* who,
                   const char* name, size_t static_smem = 0) {
  if (bh > 0x7fffffffLL || tiles > 65535)
    fail(who, "too many heads or tokens for one launch (B·H = " + std::to_string(bh) + ", " +
                  std::to_string(tiles) + " tiles)");
  const int dev = ctx.device.index;
  if (smem + static_smem > device_info(dev).shared_per_block_optin)
    fail(who, "needs " + std::to_string(smem + static_smem) +
                  " bytes of shared memory per block, the device has " +
                  std::to_string(device_info(dev).shared_per_block_optin));
  if (smem > 48 * 1024) {
    static std::mutex mu;
    static std::map<std::pair<const void*, int>, size_t> raised;
    std::lock_guard<std::mutex> lock(mu);
    size_t& limit = raised[std::make_pair(reinterpret_cast<const void*>(fn), dev)];
    if (smem > limit) {
      KILN_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(fn),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
      limit = smem;
    }
  }
  KILN_LAUNCH(dim3(static_cast<unsigned>(bh), static_cast<unsigned>(tiles)), threads, smem, s, fn)
  (args);
  check_launch(name);
}
template <typename S>
void launch(void (*fn)(AttnArgs<S>), const KernelContext& ctx, cudaStream_t s, int64_t bh,
            int64_t tiles, int threads, size_t smem, const AttnArgs<S>& args, const char* who,
            const char* name) {
  launch_kernel(fn, ctx, s, bh, tiles, threads, smem, args, who, name);
}

template <typename S>
AttnArgs<S> args_of(const Array& qkv, const Primitive& p) {
  using T = acc_t<S>;
  const Shape& sh = qkv.shape();
  AttnArgs<S> a{};
  a.qkv = ptr<S>(qkv);
  a.rows = sh[0] * sh[1] * sh[3];
  a.tokens = static_cast<int>(sh[1]);
  a.heads = static_cast<int>(sh[3]);
  a.dim = static_cast<int>(sh[4]);
  a.scale = static_cast<T>(p.attrs<AttentionAttrs>().scale);
  return a;
}

// The bf16 kernels on tensor cores (WMMA 16x16x16 bf16 tiles, f32 sums;
// attention_tc.cu), for head dims up to 128. Opt-in until they have run on a
// GPU: KILN_CUDA_BF16_ATTENTION=tensor-cores takes them, "simt" (or unset)
// the f32-arithmetic kernels; read at each launch, so that a test can
// compare both in one process. `who` names the op in an error.
bool tensor_core_attention(int64_t head_dim, const char* who);
// out [B, T, H, D] = attention of a.qkv (a.out set), over B·H = `bh`.
void attention_fwd_tc(const KernelContext& ctx, cudaStream_t s, AttnArgs<__nv_bfloat16> a,
                      int64_t bh, const char* who);
// dqkv [B, T, 3, H, D] (a.out) from a.qkv and a.dout, with a.stats holding
// 3·B·H·T floats of scratch.
void attention_grad_tc(const KernelContext& ctx, cudaStream_t s, AttnArgs<__nv_bfloat16> a,
                       int64_t bh, const char* who);

}  // namespace kiln::cuda::attn
