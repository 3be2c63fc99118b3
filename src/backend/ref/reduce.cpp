// kiln ref backend: reductions — Sum (f64 accumulation for floats, int64 for
// integers), Max (NaN propagates; -inf for an all -inf slice) and
// Argmax (i32 output; first maximum wins, a NaN beats any number) — over any
// set of axes, by one pass over the input in row-major order; Cumsum and
// Argsort along one axis.
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/ref/ref_common.h"

namespace kiln::ref {
namespace {

// The output position of every input element: its multi-index without the
// reduced axes (keepdims only inserts 1s, which leave the flat order alone).
std::vector<int64_t> output_positions(const Shape& s, const std::vector<int>& axes) {
  std::vector<bool> reduced(s.size(), false);
  for (int a : axes) reduced[a] = true;
  Shape kept;
  for (size_t d = 0; d < s.size(); ++d)
    if (!reduced[d]) kept.push_back(s[d]);
  std::vector<int64_t> pos(numel(s));
  for (int64_t i = 0; i < static_cast<int64_t>(pos.size()); ++i) {
    std::vector<int64_t> idx = unravel(i, s), k;
    for (size_t d = 0; d < s.size(); ++d)
      if (!reduced[d]) k.push_back(idx[d]);
    pos[i] = ravel(k, kept);
  }
  return pos;
}

// The identity of Max: -inf for floats (a slice of -infs gives -inf), the
// lowest value for integers.
double max_identity(DType dt) {
  switch (dt) {
    case DType::f64:
    case DType::f32:
    case DType::bf16: return -std::numeric_limits<double>::infinity();
    case DType::i32: return std::numeric_limits<int32_t>::lowest();
    case DType::i64: return static_cast<double>(std::numeric_limits<int64_t>::lowest());
    default: return 0;
  }
}

void reduce_kernel(const KernelContext&, const Primitive& p,
                   const std::vector<Array>& in, ArrayNode& out) {
  const auto& attrs = p.attrs<ReduceAttrs>();
  const Array& x = in[0];
  const DType dt = x.dtype();
  if (dt == DType::bool_ || dt == DType::f16)
    fail(p.name(), std::string("no ref kernel for dtype ") + name_of(dt));
  const std::vector<double> v = load(x);
  const std::vector<int64_t> pos = output_positions(x.shape(), attrs.axes);
  const int64_t n = numel(out.shape);
  std::vector<double> y(n);
  switch (p.op()) {
    case Op::Sum:
      if (is_integral(dt)) {
        std::vector<int64_t> acc(n, 0);
        for (size_t i = 0; i < v.size(); ++i) acc[pos[i]] += static_cast<int64_t>(v[i]);
        for (int64_t o = 0; o < n; ++o) y[o] = static_cast<double>(acc[o]);
      } else {
        for (size_t i = 0; i < v.size(); ++i) y[pos[i]] += v[i];
      }
      break;
    case Op::Max:
      std::fill(y.begin(), y.end(), max_identity(dt));
      for (size_t i = 0; i < v.size(); ++i)  // NaN propagates
        if (v[i] > y[pos[i]] || std::isnan(v[i])) y[pos[i]] = v[i];
      break;
    case Op::Argmax: {
      // The input is visited in row-major order, so each output position
      // sees its slice in increasing index along the reduced axis.
      std::vector<double> best(n);
      std::vector<int64_t> count(n, 0);
      for (size_t i = 0; i < v.size(); ++i) {
        const int64_t o = pos[i];
        const int64_t r = count[o]++;
        if (r == 0 || v[i] > best[o] || (std::isnan(v[i]) && !std::isnan(best[o]))) {
          best[o] = v[i];
          y[o] = static_cast<double>(r);
        }
      }
      break;
    }
    default: fail(p.name(), "not a reduction");
  }
  store(out, y);
}

// Cumsum: running sums along the axis in f64 (int64 for integers), rounded
// to the dtype only as they are stored.
void cumsum_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                   ArrayNode& out) {
  const auto& a = p.attrs<ScanAttrs>();
  const Shape& s = in[0].shape();
  const bool integral = is_integral(in[0].dtype());
  const std::vector<double> v = load(in[0]);
  std::vector<double> y(v.size());
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    std::vector<int64_t> idx = unravel(i, s);
    const int64_t at = idx[a.axis];
    double total = 0;
    int64_t itotal = 0;
    for (int64_t k = 0; k < s[a.axis]; ++k) {
      if (a.reverse ? k < at : k > at) continue;
      idx[a.axis] = k;
      const double x = v[ravel(idx, s)];
      total += x;
      itotal += static_cast<int64_t>(x);
    }
    y[i] = integral ? static_cast<double>(itotal) : total;
  }
  store(out, y);
}

// Argsort by ranks, not by sorting: element k of a line goes to position
// #{j : x_j sorts before x_k, or equals it and j < k}, in f64 (sorts_before,
// ops/scalar_math.h). Quadratic in the line's length, as a reference may be.
void argsort_kernel(const KernelContext&, const Primitive& p, const std::vector<Array>& in,
                    ArrayNode& out) {
  const auto& a = p.attrs<SortAttrs>();
  const DType dt = in[0].dtype();
  if (dt == DType::bool_ || dt == DType::f16)
    fail(p.name(), std::string("no ref kernel for dtype ") + name_of(dt));
  const Shape& s = in[0].shape();
  const std::vector<double> v = load(in[0]);
  std::vector<double> y(v.size());
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    std::vector<int64_t> idx = unravel(i, s);
    const int64_t at = idx[a.axis];
    int64_t rank = 0;
    for (int64_t k = 0; k < s[a.axis]; ++k) {
      idx[a.axis] = k;
      const double x = v[ravel(idx, s)];
      if (sorts_before(x, v[i], a.descending) || (k < at && !sorts_before(v[i], x, a.descending)))
        ++rank;
    }
    idx[a.axis] = rank;
    y[ravel(idx, s)] = static_cast<double>(at);
  }
  store(out, y);
}

}  // namespace

void register_reduce(KernelTable& t) {
  for (Op op : {Op::Sum, Op::Max, Op::Argmax}) t.kernels[static_cast<int>(op)] = reduce_kernel;
  t.kernels[static_cast<int>(Op::Cumsum)] = cumsum_kernel;
  t.kernels[static_cast<int>(Op::Argsort)] = argsort_kernel;
}

}  // namespace kiln::ref
