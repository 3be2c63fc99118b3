// kiln train: the gradient buckets of a data-parallel step, as PyTorch's
// DistributedDataParallel makes them. Gradients join the open bucket in the
// order the backward finishes them (value_and_grad_params' on_ready hook);
// a bucket that reaches the size cap starts its all-reduce at once, so that
// the exchange runs while the backward goes on; the last one starts when the
// backward ends. The order is the backward's, the same on every rank and at
// every step, so every rank makes the same buckets.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "kiln/transforms.h"

namespace kiln::train {

class GradBuckets {
 public:
  explicit GradBuckets(double cap_bytes) : cap_(cap_bytes) {}

  // The on_ready hook: `grad` is the final gradient of `name`.
  void ready(const std::string& name, const Array& grad);
  // Starts what is left (with `extra` appended to the last bucket: the loss,
  // whose mean over the ranks is the loss of the global batch), waits for
  // every bucket, and returns the gradients and the extras averaged over the
  // ranks.
  std::pair<Params, std::vector<Array>> finish(const std::vector<Array>& extra);

  // Buckets started so far, and the names in each (for tests).
  const std::vector<std::vector<std::string>>& buckets() const { return names_; }

 private:
  void start_open();

  double cap_;
  std::vector<std::string> open_names_;
  std::vector<Array> open_;
  double open_bytes_ = 0;
  std::vector<Array> tokens_;
  std::vector<std::vector<Array>> grads_;
  std::vector<std::vector<std::string>> names_;
};

}  // namespace kiln::train
