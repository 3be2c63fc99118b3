// kiln ref backend: Conv, ConvGradInput and ConvGradWeight as the plainest
// loops over every output element and window tap, in f64; Pool and
// PoolGrad window by window.
#include <string>
#include <vector>

#include "backend/ref/ref_common.h"
#include "ops/conv_geometry.h"

namespace kiln::ref {
namespace {

void require_float(const Primitive& p, const Array& a) {
  if (!is_floating(a.dtype()) || a.dtype() == DType::f16)
    fail(p.name(), std::string("no ref kernel for dtype ") + name_of(a.dtype()));
}

void conv_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  require_float(p, in[0]);
  const auto& a = p.attrs<ConvAttrs>();
  std::vector<double> r(numel(out.shape), 0.0);
  if (p.op() == Op::Conv) {
    const ConvGeometry q = conv_geometry(a, in[0].shape(), in[1].shape(), p.name());
    const std::vector<double> x = load(in[0]), w = load(in[1]);
    for_each_tap(q, [&](int64_t xi, int64_t wi, int64_t yi) { r[yi] += x[xi] * w[wi]; });
  } else if (p.op() == Op::ConvGradInput) {
    const ConvGeometry q = conv_geometry(a, a.input, in[1].shape(), p.name());
    const std::vector<double> dy = load(in[0]), w = load(in[1]);
    for_each_tap(q, [&](int64_t xi, int64_t wi, int64_t yi) { r[xi] += dy[yi] * w[wi]; });
  } else {
    const ConvGeometry q = conv_geometry(a, in[0].shape(), a.weight, p.name());
    const std::vector<double> x = load(in[0]), dy = load(in[1]);
    for_each_tap(q, [&](int64_t xi, int64_t wi, int64_t yi) { r[wi] += x[xi] * dy[yi]; });
  }
  store(out, r);
}

// Pool(x) and PoolGrad(x, dy), window by window.
void pool_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                 ArrayNode& out) {
  require_float(p, in[0]);
  const auto& a = p.attrs<PoolAttrs>();
  const ConvGeometry q = pool_geometry(a, in[0].shape(), p.name());
  const bool max = a.kind == PoolKind::Max;
  const std::vector<double> x = load(in[0]);
  const std::vector<double> dy = p.op() == Op::PoolGrad ? load(in[1]) : std::vector<double>();
  std::vector<double> r(numel(out.shape), 0.0);
  for (int64_t b = 0; b < q.n; ++b)
    for (int64_t c = 0; c < q.c; ++c)
      for (int64_t y = 0; y < q.ho; ++y)
        for (int64_t xo = 0; xo < q.wo; ++xo) {
          int64_t arg = -1;
          const double v = pool_window(q, max, a.count_include_pad, x.data(), b, c, y, xo, &arg);
          const int64_t yi = q.y_index(b, c, y, xo);
          if (p.op() == Op::Pool) {
            r[yi] = v;
          } else if (max) {
            r[arg] += dy[yi];
          } else {
            const int64_t n = for_each_in_window(q, b, c, y, xo, [](int64_t) {});
            const double share = dy[yi] / (a.count_include_pad ? q.kh * q.kw : n);
            for_each_in_window(q, b, c, y, xo, [&](int64_t i) { r[i] += share; });
          }
        }
  store(out, r);
}

}  // namespace

void register_conv(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Pool)] = pool_kernel;
  t.kernels[static_cast<int>(Op::PoolGrad)] = pool_kernel;
  t.kernels[static_cast<int>(Op::Conv)] = conv_kernel;
  t.kernels[static_cast<int>(Op::ConvGradInput)] = conv_kernel;
  t.kernels[static_cast<int>(Op::ConvGradWeight)] = conv_kernel;
}

}  // namespace kiln::ref
