// kiln train and kiln eval: loss and top-1 accuracy of a model on a data set,
// eager or with one compiled forward pass per batch shape (Evaluator).
#include "internal.h"
#include "kiln/distributed.h"

namespace kiln::train {
namespace {

// The model's forward pass as the loss and hit counts of one batch:
// (sum of per-sample losses, correct top-1 predictions, true classes among
// the 5 highest logits).
std::tuple<Array, Array, Array> batch_metrics(const nn::Model& model, const Params& p,
                                              const Params& state, const Array& x, const Array& y,
                                              nn::Layout layout, DType matmul_dtype) {
  Array logits =
      model.apply(p, state, x, {.layout = layout, .matmul_dtype = matmul_dtype, .inference = true})
          .logits;
  if (model.causal_lm()) {
    // Each position predicts the next token: T - 1 predictions per block (the
    // labels moved one to the left, the last position weighed 0: no copy of
    // the logits).
    const int64_t b = logits.shape()[0], t = logits.shape()[1];
    const Array next =
        astype(concatenate({slice(y, {0, 1}, {b, t}), zeros({b, 1}, y.dtype(), y.device())}, 1),
               DType::i32);
    const Array keep = concatenate(
        {ones({b, t - 1}, DType::f32, y.device()), zeros({b, 1}, DType::f32, y.device())}, 1);
    const Array ce = softmax_cross_entropy(logits, next);  // [B, T]
    Array hits = sum(astype(equal(argmax(logits, -1), next), DType::f32) * keep);
    // Top-5: fewer than 5 tokens score above the true one (its logit
    // gathered, not a log-softmax of all of them).
    const Array truth = take_along_axis(logits, reshape(next, {b, t, 1}), -1);
    const Array above = sum(astype(greater(logits, truth), DType::f32), {-1});
    Array top5 = sum(astype(less(above, scalar_like(above, 5.0)), DType::f32) * keep);
    return {sum(ce * keep), hits, top5};
  }
  Array loss = model.problem_for(y.dtype()) == nn::ProblemType::SingleLabel
                   ? sum(softmax_cross_entropy(logits, y))
                   : model.loss(logits, targets_for(model, y)) * static_cast<double>(y.shape()[0]);
  Array hits = sum(astype(equal(argmax(logits, -1), astype(y, DType::i64)), DType::f32));
  // Top-5: fewer than 5 classes score above the true one.
  Array truth = sum(logits * one_hot(y, logits.shape()[1], logits.dtype()), {-1}, true);
  Array above = sum(astype(greater(logits, truth), DType::f32), {-1});
  Array top5 = sum(astype(less(above, scalar_like(above, 5.0)), DType::f32));
  return {loss, hits, top5};
}

// Samples [begin, end) of a data set: a data-parallel rank's part of the
// held-out split.
class Part final : public data::Dataset {
 public:
  Part(const data::Dataset& all, int64_t begin, int64_t end)
      : all_(all), begin_(begin), end_(end) {}
  int64_t size() const override { return end_ - begin_; }
  Shape image_shape() const override { return all_.image_shape(); }
  DType sample_dtype() const override { return all_.sample_dtype(); }
  void get_tokens(int64_t index, int32_t* tokens) const override {
    all_.get_tokens(begin_ + index, tokens);
  }
  void get(int64_t index, float* image, int32_t* label) const override {
    all_.get(begin_ + index, image, label);
  }
  void get(int64_t index, int64_t epoch, float* image, int32_t* label) const override {
    all_.get(begin_ + index, epoch, image, label);
  }

 private:
  const data::Dataset& all_;
  int64_t begin_, end_;
};

// The model, checked before it is used.
std::shared_ptr<const nn::Model> classifier(std::shared_ptr<const nn::Model> model) {
  require_classifier(*model, "eval");
  return model;
}

}  // namespace

Evaluator::Evaluator(std::shared_ptr<const nn::Model> model, nn::Layout layout, bool compiled,
                     DType matmul_dtype)
    : model_(classifier(std::move(model))), layout_(layout), matmul_dtype_(matmul_dtype) {
  if (!compiled) return;
  // (parameters..., state..., images, labels) -> (loss sum, hits, top-5
  // hits); traced once per signature, that is per batch shape, with the
  // names of the call that traces.
  forward_.emplace(jit([this](const std::vector<Array>& args) {
    const size_t np = names_.size(), ns = state_names_.size();
    auto [loss, hits, top5] =
        batch_metrics(*model_, unflatten(names_, args), unflatten(state_names_, args, np),
                      args[np + ns], args[np + ns + 1], layout_, matmul_dtype_);
    return std::vector<Array>{loss, hits, top5};
  }));
}

EvalResult Evaluator::operator()(const Params& params, const Params& state,
                                 const data::Dataset& dataset, int64_t batch_size) {
  auto t0 = Clock::now();
  // In a data-parallel run each rank evaluates a contiguous part of the data
  // set, and the sums are added up over the ranks.
  const int64_t n = dataset.size(), ranks = dist::size(), rank = dist::rank();
  auto ds = std::make_shared<const Part>(dataset, n * rank / ranks, n * (rank + 1) / ranks);
  names_.clear();
  for (auto& [name, p] : params) names_.push_back(name);
  state_names_.clear();
  for (auto& [name, v] : state) state_names_.push_back(name);
  double loss = 0, hits = 0, top5 = 0, samples = 0, predicted = 0;
  const bool lm = model_->causal_lm();
  EvalResult r;
  // The batches go to the parameters' device.
  const Device device = params.empty() ? Device::cpu() : params.begin()->second.device();
  std::optional<data::Loader> loader;
  if (ds->size() > 0)
    loader.emplace(ds, data::LoaderOptions{.batch_size = batch_size,
                                           .drop_last = false,
                                           .workers = 1,
                                           .limit = (ds->size() + batch_size - 1) / batch_size});
  for (int64_t b = 0; loader && b < loader->batches_per_epoch(); ++b) {
    data::Batch batch = loader->next();
    batch.images = batch.images.to(device);
    batch.labels = batch.labels.to(device);
    Array l, h, t;
    if (forward_) {
      std::vector<Array> args = flatten(params);
      for (auto& v : flatten(state)) args.push_back(v);
      args.push_back(batch.images);
      args.push_back(batch.labels);
      auto out = (*forward_)(args);
      l = out[0], h = out[1], t = out[2];
    } else {
      std::tie(l, h, t) =
          batch_metrics(*model_, params, state, batch.images, batch.labels, layout_, matmul_dtype_);
    }
    loss += l.item<float>();
    hits += h.item<float>();
    top5 += t.item<float>();
    const Shape& s = batch.images.shape();
    samples += static_cast<double>(lm ? s[0] : batch.labels.size());
    predicted += static_cast<double>(lm ? s[0] * (s[1] - 1) : batch.labels.size());
  }
  if (ranks > 1) {
    std::vector<double> sums{loss, hits, top5, samples, predicted};
    dist::all_reduce_sum(sums);
    loss = sums[0], hits = sums[1], top5 = sums[2], samples = sums[3], predicted = sums[4];
  }
  r.samples = static_cast<int64_t>(samples);
  if (lm) r.tokens = static_cast<int64_t>(predicted);
  r.loss = loss / predicted;
  r.accuracy = hits / predicted;
  r.top5 = top5 / predicted;
  r.seconds = since(t0);
  return r;
}

uint64_t Evaluator::compiles() const {
  return forward_ ? forward_->cache_stats().compiles : 0;
}

EvalResult evaluate(std::shared_ptr<const nn::Model> model, const Params& params,
                    const Params& state, const data::Dataset& dataset, int64_t batch_size,
                    nn::Layout layout, bool compiled, DType matmul_dtype) {
  return Evaluator(std::move(model), layout, compiled, matmul_dtype)(params, state, dataset,
                                                                     batch_size);
}

}  // namespace kiln::train
