// kiln train: the training step of each mode, and the loss a model learns
// from the data sets' class labels.
#include "step.h"

#include <cmath>

#include "buckets.h"
#include "internal.h"
#include "kiln/distributed.h"

namespace kiln::train {

Array targets_for(const nn::Model& model, const Array& classes) {
  if (model.causal_lm()) return classes;  // the tokens: the loss shifts them
  const int64_t n = model.num_labels();
  switch (model.problem_for(classes.dtype())) {
    case nn::ProblemType::Regression:
      if (n == 1) return astype(classes, DType::f32);
      return one_hot(classes, n, DType::f32);
    case nn::ProblemType::MultiLabel: return one_hot(classes, n, DType::f32);
    default: return classes;
  }
}

bool in_head(const std::string& param) {
  for (const char* head : {"classifier.", "cls_classifier.", "distillation_classifier."})
    if (param.rfind(head, 0) == 0) return true;
  return false;
}

bool trains(const TrainConfig& cfg, const std::string& param) {
  return !cfg.freeze_backbone || in_head(param);
}

void require_classifier(const nn::Model& model, const std::string& origin) {
  if (model.num_labels() == 0 && !model.causal_lm())
    fail(origin,
         "the model has num_labels 0 (no classifier: its logits are its final features), "
         "but training and evaluation learn classes; use num_labels >= 1");
}

TrainStep::TrainStep(const TrainConfig& cfg, const nn::Model& model,
                     const optim::Optimizer& optimizer, const Params& params,
                     const Params& model_state, const optim::State& state)
    : cfg_(cfg),
      model_(model),
      optimizer_(optimizer),
      matmul_dtype_(matmul_dtype_for(cfg.precision)) {
  dropout_ = model.stochastic();
  all_reduce_ = dist::size() > 1 || cfg.all_reduce_always;
  for (auto& [name, p] : params) {
    names_.push_back(name);
    if (trains(cfg, name)) grad_names_.push_back(name);
  }
  for (auto& [name, b] : state.buffers) buffer_names_.push_back(name);
  for (auto& [name, v] : model_state) state_names_.push_back(name);
  if (cfg.mode == Mode::jit) {
    // The parameters, the optimizer state and the model's state are donated.
    std::vector<int> donate(names_.size() + buffer_names_.size() + state_names_.size());
    for (size_t i = 0; i < donate.size(); ++i) donate[i] = static_cast<int>(i);
    jitted_.emplace(
        jit([this](const std::vector<Array>& args) { return step_fn(args); }, {.donate = donate}));
  } else if (cfg.compile_model) {
    jitted_.emplace(jit([this](const std::vector<Array>& args) { return grad_fn(args); }));
  }
  if (cfg.accumulate > 1 && (cfg.mode == Mode::jit || cfg.compile_model))
    micro_.emplace(jit([this](const std::vector<Array>& args) { return micro_fn(args); }));
  if (cfg.accumulate > 1 && cfg.mode == Mode::jit) {
    std::vector<int> donate(names_.size() + buffer_names_.size());
    for (size_t i = 0; i < donate.size(); ++i) donate[i] = static_cast<int>(i);
    update_.emplace(jit([this](const std::vector<Array>& args) { return update_fn(args); },
                        {.donate = donate}));
  }
  lazy_compiles_before_ = lazy_cache_stats().compiles;
  lazy_replays_before_ = lazy_cache_stats().replays;
}

LossAndGrads TrainStep::loss_and_grads(const Params& p, const Params& model_state,
                                       const Array& images, const Array& labels, const Array& key,
                                       bool across_ranks, bool clip) const {
  // Training mode: dropout and drop path where the model has them, and
  // BatchNorm by the batch's statistics (its running ones updated).
  const nn::ModelOptions opt{.layout = cfg_.layout,
                             .train = true,
                             .drop = dropout_,
                             .key = key,
                             .matmul_dtype = matmul_dtype_,
                             .fused_attention = cfg_.fused_attention};
  // The loss of config.json's problem_type (softmax cross-entropy for
  // classes); the forward's new state is kept aside (not differentiated).
  Params next_state;
  auto loss_fn = [&](const Params& q, const Array& x, const Array& y, const nn::ModelOptions& o) {
    nn::ModelOutput out = model_.apply(q, model_state, x, o);
    next_state = std::move(out.state);
    // Mixed batches carry soft targets [B, classes] (smoothed already):
    // timm's SoftTargetCrossEntropy, the mean of −Σ y·log softmax.
    if (cfg_.mixup.enabled()) return mean(-sum(y * log_softmax(out.logits, -1), {-1}));
    return model_.loss(out.logits, targets_for(model_, y), cfg_.label_smoothing);
  };
  Array loss;
  Params grads;
  // --freeze-backbone: only the classifier is differentiated; the rest of
  // the parameters enter the loss as constants.
  Params trained, frozen;
  for (auto& [name, q] : p) (trains(cfg_, name) ? trained : frozen).emplace(name, q);
  auto loss_of = [&](const Params& q) {
    if (frozen.empty()) return loss_fn(q, images, labels, opt);
    Params all = frozen;
    for (auto& [name, v] : q) all.emplace(name, v);
    return loss_fn(all, images, labels, opt);
  };
  if (all_reduce_ && across_ranks) {
    // Data-parallel: each bucket of gradients starts its all-reduce as soon
    // as the backward has finished it; the loss joins the last bucket.
    GradBuckets buckets(cfg_.bucket_mb * 1e6);
    std::tie(loss, grads) = value_and_grad_params(
        loss_of, trained, [&](const std::string& name, const Array& g) { buckets.ready(name, g); });
    std::vector<Array> extras;
    std::tie(grads, extras) = buckets.finish({loss});
    loss = extras[0];
  } else {
    std::tie(loss, grads) = value_and_grad_params(loss_of, trained);
  }
  if (clip && cfg_.clip_norm > 0) grads = optim::clip_by_global_norm(grads, cfg_.clip_norm).first;
  // Eagerly, the new state's arrays still hold the differentiated forward's
  // graph (the running statistics read the batch's activations): kept, each
  // step's state would keep that step's activations alive, and through the
  // next step's state every step's. Computed values drop it (traced and lazy
  // ones have no value yet: their graphs end with the executable's run).
  for (auto& [name, v] : next_state) drop_graph(v);
  return {loss, grads, std::move(next_state)};
}

std::vector<Array> TrainStep::micro_fn(const std::vector<Array>& args) const {
  const size_t np = names_.size(), ns = state_names_.size();
  LossAndGrads r = loss_and_grads(unflatten(names_, args), unflatten(state_names_, args, np),
                                  args[np + ns], args[np + ns + 1], args[np + ns + 2], true, false);
  std::vector<Array> out{r.loss};
  for (auto& g : flatten(r.grads)) out.push_back(g);
  for (auto& v : flatten(r.model_state)) out.push_back(v);
  return out;
}

std::pair<Params, optim::State> TrainStep::update(const Params& params, const optim::State& state,
                                                  Params sums,
                                                  const std::vector<Array>& scalars) const {
  // The mean of the batches' gradients, clipped as one batch's would be.
  for (auto& [name, g] : sums) g = g * (1.0 / static_cast<double>(cfg_.accumulate));
  if (cfg_.clip_norm > 0) sums = optim::clip_by_global_norm(sums, cfg_.clip_norm).first;
  return optimizer_.apply(sums, state, params, scalars);
}

std::vector<Array> TrainStep::update_fn(const std::vector<Array>& args) const {
  const size_t np = names_.size(), nb = buffer_names_.size(), ng = grad_names_.size();
  std::vector<Array> scalars(args.begin() + np + nb + ng, args.end());
  auto [next, st] =
      update(unflatten(names_, args), optim::State{unflatten(buffer_names_, args, np), 0},
             unflatten(grad_names_, args, np + nb), scalars);
  std::vector<Array> out = flatten(next);
  for (auto& b : flatten(st.buffers)) out.push_back(b);
  return out;
}

Array TrainStep::accumulate(Params& params, Params& model_state, optim::State& state,
                            const std::vector<StepInputs>& micro) {
  Params sums;
  Array loss_sum;
  const Params state_before = model_state;
  for (const StepInputs& in : micro) {
    LossAndGrads r;
    if (micro_) {
      std::vector<Array> args = flatten(params);
      for (auto& v : flatten(model_state)) args.push_back(v);
      args.push_back(in.images);
      args.push_back(in.labels);
      args.push_back(in.key);
      auto out = (*micro_)(args);
      r.loss = out[0];
      r.grads = unflatten(grad_names_, out, 1);
      r.model_state = unflatten(state_names_, out, 1 + grad_names_.size());
    } else if (cfg_.mode == Mode::lazy) {
      {
        LazyScope lazy;
        r = loss_and_grads(params, model_state, in.images, in.labels, in.key, true, false);
      }
      std::vector<Array> pending = flatten(r.grads);
      for (auto& v : flatten(r.model_state)) pending.push_back(v);
      pending.push_back(r.loss);
      mark_step(pending);
    } else {
      r = loss_and_grads(params, model_state, in.images, in.labels, in.key, true, false);
    }
    model_state = std::move(r.model_state);
    if (sums.empty()) {
      sums = std::move(r.grads), loss_sum = r.loss;
    } else {
      for (auto& [name, g] : r.grads) sums.at(name) = sums.at(name) + g;
      loss_sum = loss_sum + r.loss;
    }
  }
  Array loss = loss_sum * (1.0 / static_cast<double>(micro.size()));
  if (!std::isfinite(loss.item<float>())) {  // nothing updated: the caller stops the run
    model_state = state_before;
    return loss;
  }
  const std::vector<Array>& scalars = micro.back().scalars;
  if (update_) {
    std::vector<Array> args = flatten(params);
    for (auto& b : flatten(state.buffers)) args.push_back(b);
    for (auto& g : flatten(sums)) args.push_back(g);
    for (auto& s : scalars) args.push_back(s);
    auto out = (*update_)(args);
    params = unflatten(names_, out);
    state = optim::State{unflatten(buffer_names_, out, names_.size()), state.step + 1};
  } else if (cfg_.mode == Mode::lazy) {
    {
      LazyScope lazy;
      std::tie(params, state) = update(params, state, std::move(sums), scalars);
    }
    std::vector<Array> pending = flatten(params);
    for (auto& b : flatten(state.buffers)) pending.push_back(b);
    mark_step(pending);
  } else {
    std::tie(params, state) = update(params, state, std::move(sums), scalars);
    eval(params);
    eval(state.buffers);
  }
  return loss;
}

std::vector<Array> TrainStep::step_fn(const std::vector<Array>& args) const {
  const size_t np = names_.size(), nb = buffer_names_.size(), ns = state_names_.size();
  Params p = unflatten(names_, args);
  optim::State st{unflatten(buffer_names_, args, np), 0};
  const Params ms = unflatten(state_names_, args, np + nb);
  const size_t at = np + nb + ns;
  LossAndGrads r = loss_and_grads(p, ms, args[at], args[at + 1], args[at + 2]);
  std::vector<Array> scalars(args.begin() + at + 3, args.end());
  auto [next, next_state] = optimizer_.apply(r.grads, st, p, scalars);
  Params next_ms = std::move(r.model_state);
  if (cfg_.mode == Mode::jit) {
    // The parameters and buffers are donated: on a non-finite loss the step
    // returns its inputs unchanged, so that the step can be re-run to find
    // the op where the NaN starts (one select per element, no copy).
    Array finite = less(abs(r.loss), scalar_like(r.loss, INFINITY));
    for (auto& [name, q] : next) q = where(finite, q, p.at(name));
    for (auto& [name, b] : next_state.buffers) b = where(finite, b, st.buffers.at(name));
    for (auto& [name, v] : next_ms) v = where(finite, v, ms.at(name));
  }
  std::vector<Array> out = flatten(next);
  for (auto& b : flatten(next_state.buffers)) out.push_back(b);
  for (auto& v : flatten(next_ms)) out.push_back(v);
  out.push_back(r.loss);
  return out;
}

std::vector<Array> TrainStep::grad_fn(const std::vector<Array>& args) const {
  const size_t np = names_.size(), ns = state_names_.size();
  LossAndGrads r = loss_and_grads(unflatten(names_, args), unflatten(state_names_, args, np),
                                  args[np + ns], args[np + ns + 1], args[np + ns + 2]);
  std::vector<Array> out{r.loss};
  for (auto& g : flatten(r.grads)) out.push_back(g);
  for (auto& v : flatten(r.model_state)) out.push_back(v);
  return out;
}

Array TrainStep::operator()(Params& params, Params& model_state, optim::State& state,
                            const StepInputs& in) {
  if (cfg_.mode != Mode::eager) return whole(params, model_state, state, in);
  return cfg_.compile_model ? eager_compiled(params, model_state, state, in)
                            : eager(params, model_state, state, in);
}

Array TrainStep::eager(Params& params, Params& model_state, optim::State& state,
                       const StepInputs& in) {
  LossAndGrads r = loss_and_grads(params, model_state, in.images, in.labels, in.key);
  std::tie(params, state) = optimizer_.apply(r.grads, state, params, in.scalars);
  model_state = std::move(r.model_state);
  eval(params);
  eval(state.buffers);
  eval(model_state);
  return r.loss;
}

Array TrainStep::eager_compiled(Params& params, Params& model_state, optim::State& state,
                                const StepInputs& in) {
  std::vector<Array> args = flatten(params);
  for (auto& v : flatten(model_state)) args.push_back(v);
  args.push_back(in.images);
  args.push_back(in.labels);
  args.push_back(in.key);
  auto out = (*jitted_)(args);
  std::tie(params, state) =
      optimizer_.apply(unflatten(grad_names_, out, 1), state, params, in.scalars);
  model_state = unflatten(state_names_, out, 1 + grad_names_.size());
  eval(params);
  eval(state.buffers);
  return out[0];
}

Array TrainStep::whole(Params& params, Params& model_state, optim::State& state,
                       const StepInputs& in) {
  std::vector<Array> args = flatten(params);
  for (auto& b : flatten(state.buffers)) args.push_back(b);
  for (auto& v : flatten(model_state)) args.push_back(v);
  args.push_back(in.images);
  args.push_back(in.labels);
  args.push_back(in.key);
  for (auto& s : in.scalars) args.push_back(s);
  std::vector<Array> out;
  if (cfg_.mode == Mode::jit) {
    out = (*jitted_)(args);
  } else {
    {
      LazyScope lazy;
      out = step_fn(args);
    }
    mark_step(out);  // the step barrier
  }
  const size_t np = names_.size(), nb = buffer_names_.size();
  params = unflatten(names_, out);
  state = optim::State{unflatten(buffer_names_, out, np), state.step + 1};
  model_state = unflatten(state_names_, out, np + nb);
  return out.back();
}

uint64_t TrainStep::replays() const {
  if (jitted_) return jitted_->cache_stats().replays;
  if (cfg_.mode == Mode::lazy) return lazy_cache_stats().replays - lazy_replays_before_;
  return 0;
}

uint64_t TrainStep::compiles() const {
  if (jitted_) return jitted_->cache_stats().compiles;
  if (cfg_.mode == Mode::lazy) return lazy_cache_stats().compiles - lazy_compiles_before_;
  return 0;
}

const CompileStats* TrainStep::last_compile() const {
  if (jitted_) return &jitted_->last_compile();
  if (cfg_.mode == Mode::lazy) return &lazy_last_compile();
  return nullptr;
}

}  // namespace kiln::train
