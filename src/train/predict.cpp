// kiln predict: a model's top labels for image files, batched, decoded on
// worker threads, compiled once per batch shape.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "internal.h"

namespace kiln::train {

std::string score_function(const nn::Model& model) {
  // transformers' ImageClassificationPipeline.postprocess, but regression
  // gives the output itself (the pipeline takes its sigmoid when num_labels is 1).
  if (model.problem_type() == nn::ProblemType::Regression) return "none";
  if (model.problem_type() == nn::ProblemType::MultiLabel || model.num_labels() == 1)
    return "sigmoid";
  return "softmax";
}

int64_t predict(const nn::Model& model, const Params& params, const Params& state,
                const data::ImageFiles& images, const PredictOptions& opt,
                const std::function<void(const Prediction&)>& on_result) {
  require_classifier(model, "predict");
  if (opt.batch_size <= 0)
    fail("predict", "batch size must be positive, got " + std::to_string(opt.batch_size));
  if (opt.top_k <= 0) fail("predict", "--top-k must be positive, got " + std::to_string(opt.top_k));
  const nn::ModelOptions apply{
      .layout = nn::Layout::NCHW, .matmul_dtype = opt.matmul_dtype, .inference = true};
  // The compiled forward pass closes over the parameters: constants, so
  // their casts and concatenations run once, when it compiles.
  std::optional<Jitted> forward;
  if (opt.compiled)
    forward.emplace(jit([&](const std::vector<Array>& args) {
      return std::vector<Array>{model.apply(params, state, args[0], apply).logits};
    }));
  const Device device = params.empty() ? Device::cpu() : params.begin()->second.device();
  const std::string fn = score_function(model);
  const std::vector<std::string> names = model.label_names();
  const int64_t k = std::min(opt.top_k, model.num_labels()), n = images.size();
  int64_t failed = 0;
  if (n == 0) return 0;
  auto shared = std::shared_ptr<const data::ImageFiles>(&images, [](const data::ImageFiles*) {});
  // One pass: each file is decoded once, by one worker, before its batch is
  // taken (and its error read).
  data::Loader loader(shared, {.batch_size = opt.batch_size,
                               .drop_last = false,
                               .workers = opt.workers,
                               .limit = (n + opt.batch_size - 1) / opt.batch_size});
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    data::Batch batch = loader.next();
    Array logits;
    if (forward) {
      logits = (*forward)({batch.images.to(device)})[0];
    } else {
      logits = model.apply(params, state, batch.images.to(device), apply).logits;
    }
    const std::vector<float> out = astype(logits, DType::f32).to(Device::cpu()).to_vector<float>();
    const std::vector<int32_t> ok = batch.labels.to_vector<int32_t>();
    const int64_t L = model.num_logits(), rows = batch.labels.size();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t index = b * opt.batch_size + r;
      Prediction p{images.file(index), {}, images.error(index)};
      if (ok[r] < 0) {
        ++failed;
        on_result(p);
        continue;
      }
      std::vector<double> score(out.begin() + r * L, out.begin() + (r + 1) * L);
      if (!std::all_of(score.begin(), score.end(), [](double v) { return std::isfinite(v); })) {
        p.error = p.file + ": the model's outputs for it are not finite (NaN or infinite)";
        ++failed;
        on_result(p);
        continue;
      }
      if (fn == "softmax") {
        const double m = *std::max_element(score.begin(), score.end());
        double sum = 0;
        for (double& v : score) sum += (v = std::exp(v - m));
        for (double& v : score) v /= sum;
      } else if (fn == "sigmoid") {
        for (double& v : score) v = 1 / (1 + std::exp(-v));
      }
      std::vector<int64_t> order(score.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t c) { return score[a] > score[c]; });
      for (int64_t i = 0; i < std::min<int64_t>(k, L); ++i)
        p.top.emplace_back(names[order[i]], score[order[i]]);
      on_result(p);
    }
  }
  return failed;
}

}  // namespace kiln::train
