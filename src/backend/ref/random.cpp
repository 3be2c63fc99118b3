// kiln ref backend: Random — the same counter-based draws as the cpu backend
// (random::draw_spec and random::draw_block: element i depends only on the
// key and i), so that one key gives the same numbers on both.
#include <cstdint>

#include "backend/ref/ref_common.h"
#include "kiln/random.h"
#include "ops/draws.h"

namespace kiln::ref {
namespace {

void random_kernel(const KernelContext&, const Primitive& p,
                   const std::vector<Array>& in, ArrayNode& out) {
  const random::DrawSpec spec = random::draw_spec(
      p.attrs<RandomAttrs>(), in.empty() ? nullptr : in[0].data<int32_t>());
  const int64_t n = numel(out.shape);
  std::vector<double> y(n);
  for (int64_t j = 0; 2 * j < n; ++j) {  // block j gives elements 2j and 2j + 1
    double v[2];
    random::draw_block(spec, static_cast<uint64_t>(j), v);
    y[2 * j] = v[0];
    if (2 * j + 1 < n) y[2 * j + 1] = v[1];
  }
  store(out, y);
}

}  // namespace

void register_random(KernelTable& t) {
  t.kernels[static_cast<int>(Op::Random)] = random_kernel;
}

}  // namespace kiln::ref
