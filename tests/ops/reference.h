// Plain host references for the op tests: double precision, no tricks.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::testing {

struct Host {
  Shape shape;
  std::vector<double> v;
  int64_t size() const { return numel(shape); }
};

inline Host to_host(const Array& a) {
  return {a.shape(), a.to_vector<double>()};
}
inline Array from_host(const Host& h, DType dt) {
  Array a = Array::from_vector<double>(h.v, h.shape);
  return astype(a, dt);
}

inline std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = s[d] ? i % s[d] : 0;
    i = s[d] ? i / s[d] : 0;
  }
  return idx;
}
inline int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t i = 0;
  for (size_t d = 0; d < s.size(); ++d) i = i * s[d] + idx[d];
  return i;
}
// Index into a (possibly broadcast) operand from an output index.
inline int64_t broadcast_index(const std::vector<int64_t>& out_idx, const Shape& s) {
  size_t lead = out_idx.size() - s.size();
  int64_t i = 0;
  for (size_t d = 0; d < s.size(); ++d) i = i * s[d] + (s[d] == 1 ? 0 : out_idx[lead + d]);
  return i;
}

inline Host ref_map(const std::vector<Host>& in, const std::function<double(const double*)>& f) {
  Shape s = in[0].shape;
  for (auto& h : in) s = broadcast_shapes(s, h.shape, "ref");
  Host out{s, std::vector<double>(numel(s))};
  std::vector<double> args(in.size());
  for (int64_t i = 0; i < out.size(); ++i) {
    auto idx = unravel(i, s);
    for (size_t k = 0; k < in.size(); ++k) args[k] = in[k].v[broadcast_index(idx, in[k].shape)];
    out.v[i] = f(args.data());
  }
  return out;
}

enum class RefReduce { Sum, Max, Argmax };
inline Host ref_reduce(const Host& x, std::vector<int> axes, bool keepdims, RefReduce kind) {
  if (axes.empty())
    for (size_t i = 0; i < x.shape.size(); ++i) axes.push_back(static_cast<int>(i));
  for (auto& a : axes) a = a < 0 ? a + static_cast<int>(x.shape.size()) : a;
  Shape kept = x.shape;
  for (int a : axes) kept[a] = 1;
  Host out{kept, std::vector<double>(numel(kept), kind == RefReduce::Sum ? 0.0 : -INFINITY)};
  std::vector<double> arg(numel(kept), 0);
  for (int64_t i = 0; i < x.size(); ++i) {
    auto idx = unravel(i, x.shape);
    int64_t r = 0;
    for (int a : axes) r = r * x.shape[a] + idx[a];
    for (int a : axes) idx[a] = 0;
    int64_t o = ravel(idx, kept);
    if (kind == RefReduce::Sum) {
      out.v[o] += x.v[i];
    } else if (x.v[i] > out.v[o]) {
      out.v[o] = x.v[i];
      arg[o] = static_cast<double>(r);
    }
  }
  if (kind == RefReduce::Argmax) out.v = arg;
  if (!keepdims) {
    Shape s;
    for (size_t d = 0; d < x.shape.size(); ++d)
      if (std::find(axes.begin(), axes.end(), static_cast<int>(d)) == axes.end())
        s.push_back(x.shape[d]);
    out.shape = s;
  }
  return out;
}

inline Host ref_matmul(const Host& a, const Host& b, bool ta, bool tb) {
  size_t ra = a.shape.size(), rb = b.shape.size();
  int64_t m = a.shape[ra - (ta ? 1 : 2)], k = a.shape[ra - (ta ? 2 : 1)];
  int64_t n = b.shape[rb - (tb ? 2 : 1)];
  Shape batch = ra >= rb ? Shape(a.shape.begin(), a.shape.end() - 2)
                         : Shape(b.shape.begin(), b.shape.end() - 2);
  int64_t nb = numel(batch);
  int64_t sa = ra == 2 ? 0 : m * k, sb = rb == 2 ? 0 : k * n;
  Shape s = batch;
  s.push_back(m);
  s.push_back(n);
  Host out{s, std::vector<double>(numel(s))};
  for (int64_t bi = 0; bi < nb; ++bi)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p)
          acc += a.v[bi * sa + (ta ? p * m + i : i * k + p)] *
                 b.v[bi * sb + (tb ? j * k + p : p * n + j)];
        out.v[(bi * m + i) * n + j] = acc;
      }
  return out;
}

inline Host ref_transpose(const Host& x, const std::vector<int>& perm) {
  Shape s(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) s[i] = x.shape[perm[i]];
  Host out{s, std::vector<double>(x.size())};
  for (int64_t i = 0; i < out.size(); ++i) {
    auto idx = unravel(i, s);
    std::vector<int64_t> src(perm.size());
    for (size_t d = 0; d < perm.size(); ++d) src[perm[d]] = idx[d];
    out.v[i] = x.v[ravel(src, x.shape)];
  }
  return out;
}

// Softmax (log=false) or log-softmax along an axis.
inline Host ref_softmax(const Host& x, int axis, bool log) {
  int r = static_cast<int>(x.shape.size());
  axis = axis < 0 ? axis + r : axis;
  Host out = x;
  int64_t inner = 1;
  for (int d = axis + 1; d < r; ++d) inner *= x.shape[d];
  int64_t n = x.shape[axis], outer = x.size() / std::max<int64_t>(1, n * inner);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t k) { return (o * n + k) * inner + i; };
      double m = -INFINITY, s = 0;
      for (int64_t k = 0; k < n; ++k) m = std::max(m, x.v[at(k)]);
      for (int64_t k = 0; k < n; ++k) s += std::exp(x.v[at(k)] - m);
      for (int64_t k = 0; k < n; ++k)
        out.v[at(k)] = log ? x.v[at(k)] - m - std::log(s) : std::exp(x.v[at(k)] - m) / s;
    }
  return out;
}

inline Host ref_layer_norm(const Host& x, const Host* g, const Host* b, double eps) {
  Host out = x;
  int64_t c = x.shape.back(), rows = x.size() / c;
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t k = 0; k < c; ++k) mean += x.v[r * c + k];
    mean /= c;
    for (int64_t k = 0; k < c; ++k) var += (x.v[r * c + k] - mean) * (x.v[r * c + k] - mean);
    var /= c;
    for (int64_t k = 0; k < c; ++k) {
      double y = (x.v[r * c + k] - mean) / std::sqrt(var + eps);
      out.v[r * c + k] = g ? y * g->v[k] + b->v[k] : y;
    }
  }
  return out;
}

}  // namespace kiln::testing
