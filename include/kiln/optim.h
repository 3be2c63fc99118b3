// kiln — optimizers as pure functions of (grads, state, params), like optax.
#pragma once
#include "kiln/transforms.h"

namespace kiln::optim {

// Optimizer state: named buffers (e.g. "momentum/<param>") and a step count.
struct State {
  Params buffers;
  int64_t step = 0;
};

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// torch.optim.SGD, step for step:
//   g = grad + weight_decay * p
//   b = g (first step), else momentum * b + (1 - dampening) * g
//   g = nesterov ? g + momentum * b : b
//   p = p - lr * g
class SGD {
 public:
  explicit SGD(SGDOptions opt);
  const SGDOptions& options() const { return opt_; }
  State init(const Params& params) const;
  // Returns the new parameters and state; inputs are not modified.
  std::pair<Params, State> update(const Params& grads, const State& state,
                                  const Params& params) const;

 private:
  SGDOptions opt_;
};

inline SGD sgd(SGDOptions opt) {
  return SGD(opt);
}

}  // namespace kiln::optim
