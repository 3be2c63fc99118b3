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
  if (model.causal_lm()) {
    // input_ids [B, T] and labels [B, T] (shifted inside the loss; -100 ignored).
    if (!is_integral(pixels.dtype()) || pixels.ndim() != 2)
      fail("batch", "input_ids must be integers [batch, tokens], got " +
                        std::string(name_of(pixels.dtype())) + " " + str(pixels.shape()));
    if (!is_integral(labels.dtype()) || labels.shape() != pixels.shape())
      fail("batch", "labels must be integers of input_ids' shape " + str(pixels.shape()) +
                        ", got " + std::string(name_of(labels.dtype())) + " " +
                        str(labels.shape()));
    const int64_t vocab = model.num_logits();
    for (int64_t id : astype(pixels, DType::i64).to_vector<int64_t>())
      if (id < 0 || id >= vocab)
        fail("batch", "input_ids holds token " + std::to_string(id) +
                          ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
    for (int64_t id : astype(labels, DType::i64).to_vector<int64_t>())
      if (id != -100 && (id < 0 || id >= vocab))
        fail("batch", "labels holds " + std::to_string(id) + ", expected a token in [0, " +
                          std::to_string(vocab) + ") or -100 (ignored)");
    GradResult r;
    const nn::ModelOptions opt{.train = true, .drop = false, .matmul_dtype = matmul_dtype};
    auto [loss, grads] = value_and_grad([&](const Params& q) {
      r.logits = model.apply(q, state, pixels, opt).logits;
      return model.loss(r.logits, labels);
    })(params);
    r.loss = loss;
    r.grads = std::move(grads);
    return r;
  }
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
