// kiln cpu backend: Copy (values arriving from another host-visible device)
// and Fill (creation: constants and ranges).
#include "backend/cpu/kernels.h"

namespace kiln::cpu {
namespace {

void copy_kernel(const KernelContext&, const Primitive& p,
                 const std::vector<Array>& in, ArrayNode& out) {
  if (!in[0].device().host_visible())
    fail("copy", "from " + in[0].device().str() + " to " + out.device.str() +
                     ": the cpu backend reads host memory only");
  const char* src = static_cast<const char*>(in[0].raw());
  char* dst = static_cast<char*>(alloc_output(out));
  const int64_t bytes = static_cast<int64_t>(in[0].nbytes());
  parallel_for(bytes, 1, [&](int64_t b, int64_t e) { std::memcpy(dst + b, src + b, e - b); });
}

void fill_kernel(const KernelContext&, const Primitive& p,
                 const std::vector<Array>&, ArrayNode& out) {
  const auto& a = p.attrs<FillAttrs>();
  void* y = alloc_output(out);
  dispatch_all(out.dtype, "fill", [&](auto t) {
    using T = decltype(t);
    T* o = static_cast<T*>(y);
    parallel_for(numel(out.shape), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const double v = a.start + static_cast<double>(i) * a.step;
        if constexpr (std::is_same_v<T, bool>)
          o[i] = v != 0.0;
        else if constexpr (std::is_same_v<T, bf16>)
          o[i] = bf16(static_cast<float>(v));
        else
          o[i] = static_cast<T>(v);
      }
    });
  });
}

}  // namespace

void register_transfer(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Copy)] = copy_kernel;
  t.kernels[static_cast<int>(Op::Fill)] = fill_kernel;
}

}  // namespace kiln::cpu
