// kiln cuda backend: the Random primitive — the same counter-based
// Threefry-2x32 draws as the cpu backend (ops/threefry.h, shared with the
// host): element i depends only on the key and i, so one key gives the same
// numbers on both. A key held in an i32[2] array stays on the device: each
// thread block derives the draw key from its bits.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_common.cuh"
#include "kiln/random.h"
#include "ops/threefry.h"

namespace kiln::cuda {
namespace {

// Block j of the draw gives elements 2j and 2j + 1. With key_bits (device
// memory) the draw key is derived from those bits (folded as fold/fold_data
// say) instead of the one in spec.
template <typename T>
__global__ void draw(T* y, int64_t n, random::DrawSpec spec, const int32_t* key_bits, bool fold,
                     uint32_t fold_data) {
  random::DrawSpec s = spec;
  if (key_bits) {
    KILN_SHARED(uint32_t, key, [2]);
    if (threadIdx.x == 0) {
      uint32_t k[2];
      threefry::key_of_bits(key_bits, k);
      threefry::draw_key(k, fold, fold_data, key);
    }
    __syncthreads();
    s.key[0] = key[0];
    s.key[1] = key[1];
  }
  const int64_t blocks = (n + 1) / 2;
  KILN_GRID_LOOP(j, blocks) {
    double v[2];
    threefry::draw_block(s, static_cast<uint64_t>(j), v);
    y[2 * j] = convert<T>(v[0]);
    if (2 * j + 1 < n) y[2 * j + 1] = convert<T>(v[1]);
  }
}

void random_kernel(const KernelContext& ctx, const Primitive& p, const std::vector<Array>& in,
                   ArrayNode& out) {
  cudaStream_t s = begin(ctx);
  const auto& a = p.attrs<RandomAttrs>();
  if (!in.empty() && (in[0].dtype() != DType::i32 || in[0].size() != 2))
    fail(p.name(), "a key array must be i32 of shape (2), as random::key_array makes");
  // Without a key array the whole spec is made here; with one, only the
  // parameters (truncated normal's erf of the bounds), and the kernel
  // derives the key from the array on the device.
  const random::DrawSpec spec =
      in.empty() ? random::draw_spec(a, nullptr) : threefry::draw_params(a.kind, a.a, a.b);
  const int32_t* key_bits = in.empty() ? nullptr : ptr<int32_t>(in[0]);
  const int64_t n = numel(out.shape);
  auto launch = [&](auto t) {
    using T = decltype(t);
    T* y = out_ptr<T>(out);
    if (n == 0) return;
    const int64_t blocks = (n + 1) / 2;
    KILN_LAUNCH(blocks_for(blocks), 256, 0, s, draw<T>)(y, n, spec, key_bits, a.fold, a.fold_data);
    check_launch("random");
  };
  switch (out.dtype) {
    case DType::f32: return launch(float{});
    case DType::f64: return launch(double{});
    case DType::bf16: return launch(__nv_bfloat16{});
    case DType::bool_: return launch(bool{});
    case DType::i32: return launch(int32_t{});
    default:
      fail(p.name(), std::string("draws f32, f64, bf16, bool or i32, not ") + name_of(out.dtype));
  }
}

}  // namespace

void register_random(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Random)] = random_kernel;
}

}  // namespace kiln::cuda
