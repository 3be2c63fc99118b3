// kiln optim: SGD with PyTorch's semantics.
#include "kiln/optim.h"

#include "kiln/ops.h"

namespace kiln::optim {

SGD::SGD(SGDOptions opt) : opt_(opt) {
  if (!(opt.lr >= 0)) fail("sgd", "lr must be non-negative, got " + std::to_string(opt.lr));
  if (!(opt.momentum >= 0)) fail("sgd", "momentum must be non-negative");
  if (!(opt.weight_decay >= 0)) fail("sgd", "weight_decay must be non-negative");
  if (opt.nesterov && (opt.momentum <= 0 || opt.dampening != 0))
    fail("sgd", "nesterov requires a momentum and zero dampening");
}

State SGD::init(const Params&) const {
  return State{};
}

std::pair<Params, State> SGD::update(const Params& grads, const State& state,
                                     const Params& params) const {
  Params out;
  State next{{}, state.step + 1};
  for (auto& [name, p] : params) {
    auto it = grads.find(name);
    if (it == grads.end()) fail("sgd", "no gradient for parameter '" + name + "'");
    Array g = astype(it->second, p.dtype());
    if (opt_.weight_decay != 0) g = g + p * opt_.weight_decay;
    if (opt_.momentum != 0) {
      std::string key = "momentum/" + name;
      auto b = state.buffers.find(key);
      Array buf =
          b == state.buffers.end()
              ? g
              : b->second * opt_.momentum + (opt_.dampening == 0 ? g : g * (1.0 - opt_.dampening));
      next.buffers.emplace(key, buf);
      g = opt_.nesterov ? g + buf * opt_.momentum : buf;
    }
    out.emplace(name, p - g * opt_.lr);
  }
  return {out, next};
}

}  // namespace kiln::optim
