// kiln — optimizers as pure functions of (grads, state, params), like optax.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "kiln/transforms.h"

namespace kiln::optim {

// Optimizer state: named buffers (e.g. "momentum/<param>") and a step count.
struct State {
  Params buffers;
  int64_t step = 0;
};

// An optimizer. What changes from step to step (the scheduled learning rate,
// bias corrections) enters update() as scalar arrays computed on the host by
// scalars(), so that a compiled training step takes them as arguments and
// never recompiles.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  virtual State init(const Params& params) const = 0;
  // The per-step scalars of step `step` (1-based) at learning rate `lr`.
  virtual std::vector<double> scalars(int64_t step, double lr) const = 0;
  virtual double lr() const = 0;
  // One step; `scalars` holds f32 scalar arrays of scalars(state.step + 1, ...).
  virtual std::pair<Params, State> apply(const Params& grads, const State& state,
                                         const Params& params,
                                         const std::vector<Array>& scalars) const = 0;
  // One step at lr() * lr_factor (scalars made here).
  std::pair<Params, State> update(const Params& grads, const State& state, const Params& params,
                                  double lr_factor = 1.0) const;
};

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool exempt_from_decay = false;  // no weight decay where no_weight_decay(name)
  // Per-parameter learning-rate multipliers (layer-wise decay: the lr of a
  // torch param group with lr_scale); a parameter not named here has 1.
  std::map<std::string, double> lr_scale;
};

// torch.optim.SGD, step for step:
//   g = grad + weight_decay * p
//   b = g (first step), else momentum * b + (1 - dampening) * g
//   g = nesterov ? g + momentum * b : b
//   p = p - lr * g
// The momentum buffer exists from init() (zeros) so that the state has the
// same structure at every step; the first step sets it to g as torch does.
class SGD final : public Optimizer {
 public:
  explicit SGD(SGDOptions opt);
  const SGDOptions& options() const { return opt_; }
  std::string name() const override { return "sgd"; }
  State init(const Params& params) const override;
  std::vector<double> scalars(int64_t step, double lr) const override;
  double lr() const override { return opt_.lr; }
  std::pair<Params, State> apply(const Params& grads, const State& state, const Params& params,
                                 const std::vector<Array>& scalars) const override;

 private:
  SGDOptions opt_;
};

inline SGD sgd(SGDOptions opt) {
  return SGD(opt);
}

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool exempt_from_decay = false;  // no weight decay where no_weight_decay(name)
  // Per-parameter learning-rate multipliers (see SGDOptions::lr_scale); the
  // decoupled weight decay follows the scaled lr, as in a torch param group.
  std::map<std::string, double> lr_scale;
};

// The parameters exempt from weight decay, by their transformers names:
// biases and LayerNorm weights (HF's Trainer), the position embeddings and
// the [CLS] token (timm's ViT, whose other exemptions, the 1-D parameters,
// are the same biases and norms).
bool no_weight_decay(const std::string& name);

// torch.optim.AdamW (decoupled weight decay), step for step:
//   p = p * (1 - lr * weight_decay)
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g²
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
class AdamW final : public Optimizer {
 public:
  explicit AdamW(AdamWOptions opt);
  const AdamWOptions& options() const { return opt_; }
  std::string name() const override { return "adamw"; }
  State init(const Params& params) const override;
  std::vector<double> scalars(int64_t step, double lr) const override;
  double lr() const override { return opt_.lr; }
  std::pair<Params, State> apply(const Params& grads, const State& state, const Params& params,
                                 const std::vector<Array>& scalars) const override;

 private:
  AdamWOptions opt_;
};

// `inner`, and an exponential moving average of the parameters kept in the
// state beside its own (timm's ModelEmaV2): after each step
// ema = decay · ema + (1 − decay) · params, in buffers "ema/<param>" that
// start as a copy of the parameters and are saved and resumed with the rest.
class WithEma final : public Optimizer {
 public:
  WithEma(std::unique_ptr<Optimizer> inner, double decay);
  std::string name() const override { return inner_->name(); }
  State init(const Params& params) const override;
  std::vector<double> scalars(int64_t step, double lr) const override {
    return inner_->scalars(step, lr);
  }
  double lr() const override { return inner_->lr(); }
  std::pair<Params, State> apply(const Params& grads, const State& state, const Params& params,
                                 const std::vector<Array>& scalars) const override;
  double decay() const { return decay_; }

 private:
  std::unique_ptr<Optimizer> inner_;
  double decay_;
};
// The averages of a WithEma state, by parameter name (empty without them).
Params ema_params(const State& state);

// `inner` on the parameters `trainable` accepts (its state holds only
// theirs); the others pass through unchanged and need no gradient (linear
// probing: a frozen backbone).
class Masked final : public Optimizer {
 public:
  Masked(std::unique_ptr<Optimizer> inner, std::function<bool(const std::string&)> trainable);
  std::string name() const override { return inner_->name(); }
  State init(const Params& params) const override { return inner_->init(subset(params)); }
  std::vector<double> scalars(int64_t step, double lr) const override {
    return inner_->scalars(step, lr);
  }
  double lr() const override { return inner_->lr(); }
  std::pair<Params, State> apply(const Params& grads, const State& state, const Params& params,
                                 const std::vector<Array>& scalars) const override;
  Params subset(const Params& params) const;  // the trainable ones

 private:
  std::unique_ptr<Optimizer> inner_;
  std::function<bool(const std::string&)> trainable_;
};

// Learning-rate multiplier at optimizer step k (0-based) of `total`: linear
// warm-up over the first `warmup` steps ((k + 1) / warmup), then cosine decay
// to 0 at k = total (0.5 * (1 + cos(pi * (k - warmup) / (total - warmup)))).
// kind "constant" is 1 throughout. Same as a torch LambdaLR with that lambda.
// kind "linear" is transformers' get_linear_schedule_with_warmup (the HF
// Trainer's default), exactly: k / warmup during the warm-up (0 at the first
// step), then (total - k) / (total - warmup), down to 0.
struct Schedule {
  std::string kind = "constant";  // constant | cosine | linear
  int64_t warmup = 0;
  int64_t total = 0;
  double factor(int64_t k) const;
  void validate() const;
};

// torch.nn.utils.clip_grad_norm_: the global L2 norm of all gradients and the
// gradients scaled by min(1, max_norm / (norm + 1e-6)).
std::pair<Params, Array> clip_by_global_norm(const Params& grads, double max_norm);

}  // namespace kiln::optim
