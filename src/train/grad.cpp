// kiln grad: one forward and backward pass of a model with transformers'
// loss (CrossEntropyLoss's ignore_index included).
#include "kiln/train.h"

namespace kiln::train {

GradResult forward_backward(const nn::Model& model, const Params& weights, const Array& pixels,
                            const Array& labels, nn::Layout layout, DType matmul_dtype) {
  // (Not structured bindings: clang 14 cannot capture those in the lambda below.)
  std::pair<Params, Params> split = model.split(weights, "weights");
  Params& params = split.first;
  Params& state = split.second;
  model.check(params, state, "weights");
  for (auto& [name, w] : params) w = astype(w, DType::f32);
  for (auto& [name, s] : state)
    if (is_floating(s.dtype())) s = astype(s, DType::f32);
  if (pixels.ndim() != 4 || labels.ndim() == 0 || pixels.shape()[0] != labels.shape()[0])
    fail("batch", "pixel_values " + str(pixels.shape()) + " and labels " + str(labels.shape()) +
                      " disagree on the batch size");
  // CrossEntropyLoss skips labels equal to its ignore_index, -100, and
  // averages over the others.
  int64_t ignored = 0;
  if (model.problem_for(labels.dtype()) == nn::ProblemType::SingleLabel && labels.ndim() == 1)
    for (int64_t y : labels.to_vector<int64_t>()) ignored += y == -100;
  auto loss_of = [&](const Array& logits) {
    if (ignored == 0) return model.loss(logits, labels);
    Array keep = not_equal(labels, scalar_like(labels, -100));
    Array safe = where(keep, labels, scalar_like(labels, 0));
    return sum(softmax_cross_entropy(logits, safe) * astype(keep, DType::f32)) /
           static_cast<double>(labels.size() - ignored);
  };
  GradResult r;
  const Array x = astype(pixels, DType::f32);
  const nn::ModelOptions opt{
      .layout = layout, .train = true, .drop = false, .matmul_dtype = matmul_dtype};
  auto [loss, grads] = value_and_grad([&](const Params& q) {
    nn::ModelOutput out = model.apply(q, state, x, opt);
    r.logits = out.logits;
    r.state = out.state;
    return loss_of(out.logits);
  })(params);
  r.loss = loss;
  r.grads = std::move(grads);
  return r;
}

}  // namespace kiln::train
