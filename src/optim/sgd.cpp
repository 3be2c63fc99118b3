// kiln optim: SGD and AdamW with PyTorch's semantics, schedules, clipping.
#include <algorithm>
#include <cmath>

#include "kiln/ops.h"
#include "kiln/optim.h"

namespace kiln::optim {
namespace {

double scale_of(const std::map<std::string, double>& scales, const std::string& name) {
  auto it = scales.find(name);
  return it == scales.end() ? 1.0 : it->second;
}

const Array& grad_for(const Params& grads, const std::string& name, const char* who) {
  auto it = grads.find(name);
  if (it == grads.end()) fail(who, "no gradient for parameter '" + name + "'");
  return it->second;
}

const Array& buffer(const State& s, const std::string& key, const char* who) {
  auto it = s.buffers.find(key);
  if (it == s.buffers.end())
    fail(who, "optimizer state has no buffer '" + key + "' (state made by another optimizer?)");
  return it->second;
}

}  // namespace

bool no_weight_decay(const std::string& name) {
  auto ends = [&](const std::string& t) {
    return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
  };
  return ends(".bias") || name.find("layernorm") != std::string::npos ||
         ends("position_embeddings") || ends("cls_token");
}

std::pair<Params, State> Optimizer::update(const Params& grads, const State& state,
                                           const Params& params, double lr_factor) const {
  // The step's scalars (learning rate, bias corrections) on the parameters'
  // device.
  const Device device = params.empty() ? Device::cpu() : params.begin()->second.device();
  std::vector<Array> s;
  for (double v : scalars(state.step + 1, lr() * lr_factor))
    s.push_back(full({}, static_cast<float>(v), DType::f32, device));
  return apply(grads, state, params, s);
}

SGD::SGD(SGDOptions opt) : opt_(opt) {
  if (!(opt.lr >= 0)) fail("sgd", "lr must be non-negative, got " + std::to_string(opt.lr));
  if (!(opt.momentum >= 0)) fail("sgd", "momentum must be non-negative");
  if (!(opt.weight_decay >= 0)) fail("sgd", "weight_decay must be non-negative");
  if (opt.nesterov && (opt.momentum <= 0 || opt.dampening != 0))
    fail("sgd", "nesterov requires a momentum and zero dampening");
}

State SGD::init(const Params& params) const {
  State s;
  if (opt_.momentum != 0)
    for (auto& [name, p] : params) s.buffers.emplace("momentum/" + name, zeros_like(p));
  return s;
}

std::vector<double> SGD::scalars(int64_t step, double lr) const {
  // lr, and the weights of the old momentum buffer and of the gradient in the
  // new one (0 and 1 on the first step: the zero buffer becomes g exactly).
  if (step == 1) return {lr, 0.0, 1.0};
  return {lr, opt_.momentum, 1.0 - opt_.dampening};
}

std::pair<Params, State> SGD::apply(const Params& grads, const State& state, const Params& params,
                                    const std::vector<Array>& s) const {
  if (s.size() != 3) fail("sgd", "expected 3 step scalars, got " + std::to_string(s.size()));
  Params out;
  State next{{}, state.step + 1};
  for (auto& [name, p] : params) {
    Array g = astype(grad_for(grads, name, "sgd"), p.dtype());
    if (opt_.weight_decay != 0 && !(opt_.exempt_from_decay && no_weight_decay(name)))
      g = g + p * opt_.weight_decay;
    if (opt_.momentum != 0) {
      std::string key = "momentum/" + name;
      Array buf = buffer(state, key, "sgd") * s[1] + g * s[2];
      next.buffers.emplace(key, buf);
      g = opt_.nesterov ? g + buf * opt_.momentum : buf;
    }
    const double c = scale_of(opt_.lr_scale, name);
    out.emplace(name, c == 1.0 ? p - g * s[0] : p - g * (s[0] * c));
  }
  return {out, next};
}

AdamW::AdamW(AdamWOptions opt) : opt_(opt) {
  if (!(opt.lr >= 0)) fail("adamw", "lr must be non-negative, got " + std::to_string(opt.lr));
  if (!(opt.beta1 >= 0 && opt.beta1 < 1) || !(opt.beta2 >= 0 && opt.beta2 < 1))
    fail("adamw", "betas must lie in [0, 1)");
  if (!(opt.eps > 0)) fail("adamw", "eps must be positive");
  if (!(opt.weight_decay >= 0)) fail("adamw", "weight_decay must be non-negative");
}

State AdamW::init(const Params& params) const {
  State s;
  for (auto& [name, p] : params) {
    s.buffers.emplace("exp_avg/" + name, zeros_like(p));
    s.buffers.emplace("exp_avg_sq/" + name, zeros_like(p));
  }
  return s;
}

std::vector<double> AdamW::scalars(int64_t step, double lr) const {
  double t = static_cast<double>(step);
  double bc1 = 1.0 - std::pow(opt_.beta1, t), bc2 = 1.0 - std::pow(opt_.beta2, t);
  return {1.0 - lr * opt_.weight_decay, lr / bc1, std::sqrt(bc2)};
}

std::pair<Params, State> AdamW::apply(const Params& grads, const State& state, const Params& params,
                                      const std::vector<Array>& s) const {
  if (s.size() != 3) fail("adamw", "expected 3 step scalars, got " + std::to_string(s.size()));
  Params out;
  State next{{}, state.step + 1};
  for (auto& [name, p] : params) {
    Array g = astype(grad_for(grads, name, "adamw"), p.dtype());
    std::string km = "exp_avg/" + name, kv = "exp_avg_sq/" + name;
    Array m = buffer(state, km, "adamw") * opt_.beta1 + g * (1.0 - opt_.beta1);
    Array v = buffer(state, kv, "adamw") * opt_.beta2 + g * g * (1.0 - opt_.beta2);
    Array denom = sqrt(v) / s[2] + opt_.eps;
    const bool decay = !(opt_.exempt_from_decay && no_weight_decay(name));
    const double c = scale_of(opt_.lr_scale, name);
    if (c == 1.0) {
      out.emplace(name, (decay ? p * s[0] : p) - m / denom * s[1]);
    } else {  // s[0] = 1 - lr·wd becomes 1 - c·lr·wd
      out.emplace(name, (decay ? p * (1.0 - (1.0 - s[0]) * c) : p) - m / denom * (s[1] * c));
    }
    next.buffers.emplace(km, m);
    next.buffers.emplace(kv, v);
  }
  return {out, next};
}

void Schedule::validate() const {
  if (kind != "constant" && kind != "cosine" && kind != "linear")
    fail("schedule", "'" + kind + "', expected constant, cosine or linear");
  if (warmup < 0) fail("schedule", "warmup must be >= 0, got " + std::to_string(warmup));
  if (kind != "constant" && total <= warmup)
    fail("schedule", kind + " decay needs total steps (" + std::to_string(total) +
                         ") above the warm-up (" + std::to_string(warmup) + ")");
}

double Schedule::factor(int64_t k) const {
  if (kind == "linear") {  // transformers' get_linear_schedule_with_warmup
    if (k < warmup)
      return static_cast<double>(k) / static_cast<double>(std::max<int64_t>(1, warmup));
    return std::max(0.0, static_cast<double>(total - k) /
                             static_cast<double>(std::max<int64_t>(1, total - warmup)));
  }
  if (k < warmup) return static_cast<double>(k + 1) / static_cast<double>(warmup);
  if (kind == "constant") return 1.0;
  double progress = static_cast<double>(k - warmup) / static_cast<double>(total - warmup);
  return 0.5 * (1.0 + std::cos(M_PI * std::min(progress, 1.0)));
}

WithEma::WithEma(std::unique_ptr<Optimizer> inner, double decay)
    : inner_(std::move(inner)), decay_(decay) {
  if (!(decay > 0 && decay < 1))
    fail("ema", "decay must lie in (0, 1), got " + std::to_string(decay));
}

State WithEma::init(const Params& params) const {
  State s = inner_->init(params);
  for (auto& [name, p] : params) s.buffers.emplace("ema/" + name, p * 1.0);  // a copy
  return s;
}

std::pair<Params, State> WithEma::apply(const Params& grads, const State& state,
                                        const Params& params,
                                        const std::vector<Array>& scalars) const {
  State inner_state{{}, state.step};
  for (auto& [key, b] : state.buffers)
    if (key.rfind("ema/", 0) != 0) inner_state.buffers.emplace(key, b);
  auto [out, next] = inner_->apply(grads, inner_state, params, scalars);
  for (auto& [name, p] : out)
    next.buffers.emplace("ema/" + name,
                         buffer(state, "ema/" + name, "ema") * decay_ + p * (1.0 - decay_));
  return {out, next};
}

Params ema_params(const State& state) {
  Params out;
  for (auto& [key, b] : state.buffers)
    if (key.rfind("ema/", 0) == 0) out.emplace(key.substr(4), b);
  return out;
}

Masked::Masked(std::unique_ptr<Optimizer> inner, std::function<bool(const std::string&)> trainable)
    : inner_(std::move(inner)), trainable_(std::move(trainable)) {}

Params Masked::subset(const Params& params) const {
  Params out;
  for (auto& [name, p] : params)
    if (trainable_(name)) out.emplace(name, p);
  return out;
}

std::pair<Params, State> Masked::apply(const Params& grads, const State& state,
                                       const Params& params,
                                       const std::vector<Array>& scalars) const {
  auto [out, next] = inner_->apply(grads, state, subset(params), scalars);
  for (auto& [name, p] : params)
    if (!trainable_(name)) out.emplace(name, p);
  return {out, next};
}

std::pair<Params, Array> clip_by_global_norm(const Params& grads, double max_norm) {
  if (!(max_norm > 0)) fail("clip", "max_norm must be positive, got " + std::to_string(max_norm));
  if (grads.empty()) fail("clip", "no gradients");
  Array total;
  for (auto& [name, g] : grads) {
    Array sq = sum(square(astype(g, DType::f32)));
    total = total.valid() ? total + sq : sq;
  }
  Array norm = sqrt(total);
  Array coef = minimum(scalar_like(norm, max_norm) / (norm + 1e-6), scalar_like(norm, 1.0));
  Params out;
  for (auto& [name, g] : grads) out.emplace(name, g * astype(coef, g.dtype()));
  return {out, norm};
}

}  // namespace kiln::optim
