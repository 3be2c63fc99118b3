// kiln — evaluation and function transformations.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/array.h"

namespace kiln {

// A parameter tree: HuggingFace-style names to arrays, ordered by name.
using Params = std::map<std::string, Array>;

// Materializes the arrays (and whatever they depend on).
void eval(const std::vector<Array>& arrays);
void eval(const Params& params);

// Within a LazyScope operations record instead of running; eval() (or reading
// data) runs what is pending. Scopes nest; they are per thread.
class LazyScope {
 public:
  LazyScope();
  ~LazyScope();
  LazyScope(const LazyScope&) = delete;
  LazyScope& operator=(const LazyScope&) = delete;

 private:
  bool previous_;
};
bool is_lazy();

// Within a CheckFiniteScope every kernel checks its floating-point output and
// throws kiln::Error naming the op (and its input shapes) when the output
// holds a NaN or an infinity. For finding where a NaN starts; slow.
class CheckFiniteScope {
 public:
  CheckFiniteScope();
  ~CheckFiniteScope();
  CheckFiniteScope(const CheckFiniteScope&) = delete;
  CheckFiniteScope& operator=(const CheckFiniteScope&) = delete;

 private:
  bool previous_;
};

// Reverse mode. Calls f on the primals, and returns f's outputs and the
// cotangents of the primals for the given output cotangents. The backward pass
// is built from the primitives' VJP rules as a graph of primitives, so it runs
// eagerly, lazily or under jit like any other code.
using VectorFn = std::function<std::vector<Array>(const std::vector<Array>&)>;
std::pair<std::vector<Array>, std::vector<Array>> vjp(const VectorFn& f,
                                                      const std::vector<Array>& primals,
                                                      const std::vector<Array>& cotangents);

// Value and gradient of a scalar function of a parameter tree (or of one
// array, or of a vector of arrays) with respect to that first argument; the
// other arguments are passed through and not differentiated.
//
// `on_ready`, when given, is told each gradient as soon as the backward has
// finished it (every op that reads the parameter has been differentiated),
// in the order the backward finishes them, before the others are computed:
// the hook DistributedDataParallel uses to start averaging a bucket of
// gradients while the backward goes on (src/train/buckets.h). The gradients
// returned are the same arrays.
using GradReady = std::function<void(const std::string& name, const Array& grad)>;
std::pair<Array, Params> value_and_grad_params(const std::function<Array(const Params&)>& f,
                                               const Params& params,
                                               const GradReady& on_ready = {});
std::pair<Array, std::vector<Array>> value_and_grad_vector(
    const std::function<Array(const std::vector<Array>&)>& f, const std::vector<Array>& primals,
    const std::function<void(size_t primal, const Array& grad)>& on_ready = {});

template <typename F>
auto value_and_grad(F f) {
  return [f](const auto& first, const auto&... rest) {
    using First = std::decay_t<decltype(first)>;
    if constexpr (std::is_same_v<First, Params>) {
      return value_and_grad_params([&](const Params& p) { return f(p, rest...); }, first);
    } else if constexpr (std::is_same_v<First, Array>) {
      auto [v, g] = value_and_grad_vector(
          [&](const std::vector<Array>& p) { return f(p[0], rest...); }, {first});
      return std::pair<Array, Array>{v, g[0]};
    } else {
      return value_and_grad_vector([&](const std::vector<Array>& p) { return f(p, rest...); },
                                   first);
    }
  };
}

template <typename F>
auto grad(F f) {
  return [f](const auto& first, const auto&... rest) {
    return value_and_grad(f)(first, rest...).second;
  };
}

}  // namespace kiln
