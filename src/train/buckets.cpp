// kiln train: gradient buckets (see buckets.h).
#include "buckets.h"

#include "kiln/ops.h"

namespace kiln::train {

void GradBuckets::ready(const std::string& name, const Array& grad) {
  // A bucket holds one dtype: a gradient of another closes the open one.
  if (!open_.empty() && grad.dtype() != open_[0].dtype()) start_open();
  open_names_.push_back(name);
  open_.push_back(grad);
  open_bytes_ += static_cast<double>(grad.nbytes());
  if (open_bytes_ >= cap_) start_open();
}

void GradBuckets::start_open() {
  if (open_.empty()) return;
  const int id = static_cast<int>(tokens_.size());
  tokens_.push_back(all_reduce_start(open_, id));
  grads_.push_back(std::move(open_));
  names_.push_back(std::move(open_names_));
  open_.clear();
  open_names_.clear();
  open_bytes_ = 0;
}

std::pair<Params, std::vector<Array>> GradBuckets::finish(const std::vector<Array>& extra) {
  for (const Array& e : extra) {
    if (!open_.empty() && e.dtype() != open_[0].dtype()) start_open();
    open_names_.push_back("");
    open_.push_back(e);
  }
  start_open();
  Params grads;
  std::vector<Array> extras;
  for (size_t b = 0; b < tokens_.size(); ++b) {
    std::vector<Array> mean = all_reduce_wait(tokens_[b], grads_[b], static_cast<int>(b));
    for (size_t i = 0; i < mean.size(); ++i) {
      if (names_[b][i].empty())
        extras.push_back(mean[i]);
      else
        grads.emplace(names_[b][i], mean[i]);
    }
  }
  return {grads, extras};
}

}  // namespace kiln::train
