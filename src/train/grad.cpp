// kiln grad: one forward and backward pass of ViTForImageClassification with
// transformers' loss (CrossEntropyLoss's ignore_index included).
#include "kiln/train.h"

namespace kiln::train {

GradResult forward_backward(const nn::ViTConfig& cfg, const Params& weights, const Array& pixels,
                            const Array& labels, nn::Layout layout, DType matmul_dtype) {
  nn::ViTForImageClassification model(cfg);
  model.check(weights, "weights");
  Params p;
  for (auto& [name, w] : weights) p.emplace(name, astype(w, DType::f32));
  if (pixels.ndim() != 4 || labels.ndim() == 0 || pixels.shape()[0] != labels.shape()[0])
    fail("batch", "pixel_values " + str(pixels.shape()) + " and labels " + str(labels.shape()) +
                      " disagree on the batch size");
  // CrossEntropyLoss skips labels equal to its ignore_index, -100, and
  // averages over the others.
  int64_t ignored = 0;
  if (cfg.problem_for(labels.dtype()) == nn::ProblemType::SingleLabel && labels.ndim() == 1)
    for (int64_t y : labels.to_vector<int64_t>()) ignored += y == -100;
  auto loss_of = [&](const Array& logits) {
    if (ignored == 0) return model.loss(logits, labels);
    Array keep = not_equal(labels, scalar_like(labels, -100));
    Array safe = where(keep, labels, scalar_like(labels, 0));
    return sum(softmax_cross_entropy(logits, safe) * astype(keep, DType::f32)) /
           static_cast<double>(labels.size() - ignored);
  };
  GradResult r;
  Array x = astype(pixels, DType::f32);
  auto [loss, grads] = value_and_grad([&](const Params& q) {
    r.logits = model.apply(q, x, {.layout = layout, .matmul_dtype = matmul_dtype});
    return loss_of(r.logits);
  })(p);
  r.loss = loss;
  r.grads = std::move(grads);
  return r;
}

}  // namespace kiln::train
