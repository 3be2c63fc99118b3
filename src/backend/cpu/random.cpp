// kiln cpu backend: random draws. Element i depends only on (key, i).
#include "kiln/random.h"
#include "backend/cpu/kernels.h"
#include "ops/draws.h"

namespace kiln::cpu {
namespace {

void random_kernel(const KernelContext&, const Primitive& p,
                   const std::vector<Array>& in, ArrayNode& out) {
  const auto& a = p.attrs<RandomAttrs>();
  const random::DrawSpec spec =
      random::draw_spec(a, in.empty() ? nullptr : in[0].data<int32_t>());
  int64_t n = numel(out.shape);
  int64_t blocks = (n + 1) / 2;
  void* y = alloc_output(out);
  auto store = [&](int64_t i, double v) {
    switch (out.dtype) {
      case DType::f32: static_cast<float*>(y)[i] = static_cast<float>(v); break;
      case DType::f64: static_cast<double*>(y)[i] = v; break;
      case DType::bf16: static_cast<bf16*>(y)[i] = bf16(static_cast<float>(v)); break;
      case DType::bool_: static_cast<bool*>(y)[i] = v != 0; break;
      case DType::i32: static_cast<int32_t*>(y)[i] = static_cast<int32_t>(v); break;
      default: break;
    }
  };
  parallel_for(blocks, 16, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      double v[2];
      random::draw_block(spec, static_cast<uint64_t>(j), v);
      store(2 * j, v[0]);
      if (2 * j + 1 < n) store(2 * j + 1, v[1]);
    }
  });
}

}  // namespace

void register_random(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Random)] = random_kernel;
}

}  // namespace kiln::cpu
