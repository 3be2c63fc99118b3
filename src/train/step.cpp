// kiln train: the training step of each mode, and the loss a model learns
// from the data sets' class labels.
#include "step.h"

#include <cmath>

#include "buckets.h"
#include "internal.h"
#include "kiln/distributed.h"

namespace kiln::train {

Array targets_for(const nn::ViTConfig& cfg, const Array& classes) {
  switch (cfg.problem_for(classes.dtype())) {
    case nn::ProblemType::Regression:
      if (cfg.num_labels == 1) return astype(classes, DType::f32);
      return one_hot(classes, cfg.num_labels, DType::f32);
    case nn::ProblemType::MultiLabel: return one_hot(classes, cfg.num_labels, DType::f32);
    default: return classes;
  }
}

bool trains(const TrainConfig& cfg, const std::string& param) {
  return !cfg.freeze_backbone || param.rfind("classifier.", 0) == 0;
}

void require_classifier(const nn::ViTConfig& cfg, const std::string& origin) {
  if (cfg.num_labels == 0)
    fail(origin,
         "the model has num_labels 0 (no classifier: its logits are the final [CLS] features), "
         "but training and evaluation learn classes; use num_labels >= 1");
}

TrainStep::TrainStep(const TrainConfig& cfg, const nn::ViTForImageClassification& model,
                     const optim::Optimizer& optimizer, const Params& params,
                     const optim::State& state)
    : cfg_(cfg),
      model_(model),
      optimizer_(optimizer),
      matmul_dtype_(matmul_dtype_for(cfg.precision)) {
  const nn::ViTConfig& m = model.config();
  dropout_ = m.hidden_dropout_prob > 0 || m.attention_probs_dropout_prob > 0;
  all_reduce_ = dist::size() > 1 || cfg.all_reduce_always;
  for (auto& [name, p] : params) {
    names_.push_back(name);
    if (trains(cfg, name)) grad_names_.push_back(name);
  }
  for (auto& [name, b] : state.buffers) buffer_names_.push_back(name);
  if (cfg.mode == Mode::jit) {
    // The parameters and the optimizer state are donated.
    std::vector<int> donate(names_.size() + buffer_names_.size());
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

std::pair<Array, Params> TrainStep::loss_and_grads(const Params& p, const Array& images,
                                                   const Array& labels, const Array& key,
                                                   bool across_ranks, bool clip) const {
  nn::ApplyOptions opt{.layout = cfg_.layout,
                       .train = dropout_,
                       .dropout_key_array = key,
                       .matmul_dtype = matmul_dtype_,
                       .fused_attention = cfg_.fused_attention};
  // The loss of config.json's problem_type (softmax cross-entropy for classes).
  auto loss_fn = [&](const Params& q, const Array& x, const Array& y, const nn::ApplyOptions& o) {
    return model_.loss(model_.apply(q, x, o), targets_for(model_.config(), y),
                       cfg_.label_smoothing);
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
  return {loss, grads};
}

std::vector<Array> TrainStep::micro_fn(const std::vector<Array>& args) const {
  const size_t np = names_.size();
  auto [loss, grads] =
      loss_and_grads(unflatten(names_, args), args[np], args[np + 1], args[np + 2], true, false);
  std::vector<Array> out{loss};
  for (auto& g : flatten(grads)) out.push_back(g);
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

Array TrainStep::accumulate(Params& params, optim::State& state,
                            const std::vector<StepInputs>& micro) {
  Params sums;
  Array loss_sum;
  for (const StepInputs& in : micro) {
    Array loss;
    Params grads;
    if (micro_) {
      std::vector<Array> args = flatten(params);
      args.push_back(in.images);
      args.push_back(in.labels);
      args.push_back(in.key);
      auto out = (*micro_)(args);
      loss = out[0];
      grads = unflatten(grad_names_, out, 1);
    } else if (cfg_.mode == Mode::lazy) {
      {
        LazyScope lazy;
        std::tie(loss, grads) = loss_and_grads(params, in.images, in.labels, in.key, true, false);
      }
      std::vector<Array> pending = flatten(grads);
      pending.push_back(loss);
      mark_step(pending);
    } else {
      std::tie(loss, grads) = loss_and_grads(params, in.images, in.labels, in.key, true, false);
    }
    if (sums.empty()) {
      sums = std::move(grads), loss_sum = loss;
    } else {
      for (auto& [name, g] : grads) sums.at(name) = sums.at(name) + g;
      loss_sum = loss_sum + loss;
    }
  }
  Array loss = loss_sum * (1.0 / static_cast<double>(micro.size()));
  if (!std::isfinite(loss.item<float>())) return loss;  // nothing updated: the caller stops the run
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
  const size_t np = names_.size(), nb = buffer_names_.size();
  Params p = unflatten(names_, args);
  optim::State st{unflatten(buffer_names_, args, np), 0};
  const size_t at = np + nb;
  auto [loss, grads] = loss_and_grads(p, args[at], args[at + 1], args[at + 2]);
  std::vector<Array> scalars(args.begin() + at + 3, args.end());
  auto [next, next_state] = optimizer_.apply(grads, st, p, scalars);
  if (cfg_.mode == Mode::jit) {
    // The parameters and buffers are donated: on a non-finite loss the step
    // returns its inputs unchanged, so that the step can be re-run to find
    // the op where the NaN starts (one select per element, no copy).
    Array finite = less(abs(loss), scalar_like(loss, INFINITY));
    for (auto& [name, q] : next) q = where(finite, q, p.at(name));
    for (auto& [name, b] : next_state.buffers) b = where(finite, b, st.buffers.at(name));
  }
  std::vector<Array> out = flatten(next);
  for (auto& b : flatten(next_state.buffers)) out.push_back(b);
  out.push_back(loss);
  return out;
}

std::vector<Array> TrainStep::grad_fn(const std::vector<Array>& args) const {
  const size_t np = names_.size();
  auto [loss, grads] =
      loss_and_grads(unflatten(names_, args), args[np], args[np + 1], args[np + 2]);
  std::vector<Array> out{loss};
  for (auto& g : flatten(grads)) out.push_back(g);
  return out;
}

Array TrainStep::operator()(Params& params, optim::State& state, const StepInputs& in) {
  if (cfg_.mode != Mode::eager) return whole(params, state, in);
  return cfg_.compile_model ? eager_compiled(params, state, in) : eager(params, state, in);
}

Array TrainStep::eager(Params& params, optim::State& state, const StepInputs& in) {
  auto [loss, grads] = loss_and_grads(params, in.images, in.labels, in.key);
  std::tie(params, state) = optimizer_.apply(grads, state, params, in.scalars);
  eval(params);
  eval(state.buffers);
  return loss;
}

Array TrainStep::eager_compiled(Params& params, optim::State& state, const StepInputs& in) {
  std::vector<Array> args = flatten(params);
  args.push_back(in.images);
  args.push_back(in.labels);
  args.push_back(in.key);
  auto out = (*jitted_)(args);
  std::tie(params, state) =
      optimizer_.apply(unflatten(grad_names_, out, 1), state, params, in.scalars);
  eval(params);
  eval(state.buffers);
  return out[0];
}

Array TrainStep::whole(Params& params, optim::State& state, const StepInputs& in) {
  std::vector<Array> args = flatten(params);
  for (auto& b : flatten(state.buffers)) args.push_back(b);
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
  params = unflatten(names_, out);
  state = optim::State{unflatten(buffer_names_, out, names_.size()), state.step + 1};
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
