// kiln train and kiln eval: loss and top-1 accuracy of a model on a data set,
// eager or with one compiled forward pass per batch shape (Evaluator).
#include "internal.h"

namespace kiln::train {
namespace {

// The model's forward pass as the loss and hit count of one batch:
// (sum of per-sample losses, number of correct top-1 predictions).
std::pair<Array, Array> batch_metrics(const nn::ViTForImageClassification& model, const Params& p,
                                      const Array& x, const Array& y, nn::Layout layout,
                                      DType matmul_dtype) {
  Array logits = model.apply(p, x, {.layout = layout, .matmul_dtype = matmul_dtype});
  const nn::ViTConfig& cfg = model.config();
  Array loss = cfg.problem_for(y.dtype()) == nn::ProblemType::SingleLabel
                   ? sum(softmax_cross_entropy(logits, y))
                   : model.loss(logits, targets_for(cfg, y)) * static_cast<double>(y.shape()[0]);
  Array hits = sum(astype(equal(argmax(logits, -1), astype(y, DType::i64)), DType::f32));
  return {loss, hits};
}

// The model's config, checked before the model is built from it.
const nn::ViTConfig& classifier(const nn::ViTConfig& cfg) {
  require_classifier(cfg, "eval");
  return cfg;
}

}  // namespace

Evaluator::Evaluator(const nn::ViTConfig& cfg, nn::Layout layout, bool compiled, DType matmul_dtype)
    : model_(classifier(cfg)), layout_(layout), matmul_dtype_(matmul_dtype) {
  if (!compiled) return;
  // (parameters..., images, labels) -> (loss sum, hits); traced once per
  // signature, that is per batch shape, with the names of the call that traces.
  forward_.emplace(jit([this](const std::vector<Array>& args) {
    const size_t np = names_.size();
    auto [loss, hits] = batch_metrics(model_, unflatten(names_, args), args[np], args[np + 1],
                                      layout_, matmul_dtype_);
    return std::vector<Array>{loss, hits};
  }));
}

EvalResult Evaluator::operator()(const Params& params, const data::Dataset& dataset,
                                 int64_t batch_size) {
  auto t0 = Clock::now();
  std::shared_ptr<const data::Dataset> ds(&dataset, [](const data::Dataset*) {});
  data::Loader loader(ds, {.batch_size = batch_size, .drop_last = false, .workers = 1});
  names_.clear();
  for (auto& [name, p] : params) names_.push_back(name);
  double loss = 0, hits = 0;
  EvalResult r;
  // The batches go to the parameters' device.
  const Device device = params.empty() ? Device::cpu() : params.begin()->second.device();
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    data::Batch batch = loader.next();
    batch.images = batch.images.to(device);
    batch.labels = batch.labels.to(device);
    Array l, h;
    if (forward_) {
      std::vector<Array> args = flatten(params);
      args.push_back(batch.images);
      args.push_back(batch.labels);
      auto out = (*forward_)(args);
      l = out[0], h = out[1];
    } else {
      std::tie(l, h) =
          batch_metrics(model_, params, batch.images, batch.labels, layout_, matmul_dtype_);
    }
    loss += l.item<float>();
    hits += h.item<float>();
    r.samples += batch.labels.size();
  }
  r.loss = loss / r.samples;
  r.accuracy = hits / r.samples;
  r.seconds = since(t0);
  return r;
}

uint64_t Evaluator::compiles() const {
  return forward_ ? forward_->cache_stats().compiles : 0;
}

EvalResult evaluate(const nn::ViTConfig& cfg, const Params& params, const data::Dataset& dataset,
                    int64_t batch_size, nn::Layout layout, bool compiled, DType matmul_dtype) {
  return Evaluator(cfg, layout, compiled, matmul_dtype)(params, dataset, batch_size);
}

}  // namespace kiln::train
