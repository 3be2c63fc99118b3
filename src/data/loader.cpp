// kiln data: the random-image data set and the threaded loader.
#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <numeric>

#include "kiln/data.h"

namespace kiln::data {

RandomImages::RandomImages(RandomImagesOptions opt) : opt_(opt) {
  if (opt.num_samples <= 0 || opt.num_labels <= 0 || opt.image_size.height <= 0 ||
      opt.image_size.width <= 0 || opt.channels <= 0)
    fail("data", "random images need positive num_samples, num_labels, image_size and channels");
}

Shape RandomImages::image_shape() const {
  const int64_t h = opt_.image_size.height, w = opt_.image_size.width;
  return opt_.layout == nn::Layout::NCHW ? Shape{opt_.channels, h, w} : Shape{h, w, opt_.channels};
}

void RandomImages::get(int64_t index, float* image, int32_t* label) const {
  if (index < 0 || index >= opt_.num_samples)
    fail("data", "sample " + std::to_string(index) + " is outside [0, " +
                     std::to_string(opt_.num_samples) + ")");
  random::fill_normal(random::fold_in(random::Key(opt_.seed), static_cast<uint32_t>(index)), image,
                      numel(image_shape()));
  *label = static_cast<int32_t>(index % opt_.num_labels);
}

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions opt)
    : dataset_(std::move(dataset)), opt_(opt) {
  if (opt.batch_size <= 0)
    fail("loader", "batch_size must be positive, got " + std::to_string(opt.batch_size));
  if (opt.workers < 0) fail("loader", "workers must be >= 0");
  if (opt.prefetch < 1) fail("loader", "prefetch must be >= 1");
  int64_t n = dataset_->size();
  per_epoch_ = opt.drop_last ? n / opt.batch_size : (n + opt.batch_size - 1) / opt.batch_size;
  if (per_epoch_ == 0)
    fail("loader", "data set of " + std::to_string(n) + " samples yields no batch of " +
                       std::to_string(opt.batch_size) + " with drop_last");
  if (opt.start < 0) fail("loader", "start must be >= 0");
  if (opt.shards < 1 || opt.shard < 0 || opt.shard >= opt.shards)
    fail("loader", "shard " + std::to_string(opt.shard) + " of " + std::to_string(opt.shards) +
                       ": expected 0 <= shard < shards");
  next_to_make_ = next_to_take_ = opt.start;
  for (int i = 0; i < opt.workers; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  space_.notify_all();
  ready_.notify_all();
  for (auto& t : workers_) t.join();
}

std::vector<int64_t> Loader::order_for(int64_t epoch) const {
  std::vector<int64_t> order(dataset_->size());
  std::iota(order.begin(), order.end(), 0);
  if (opt_.shuffle) {
    // Fisher-Yates driven by counter-based draws: the order is a function of
    // (seed, epoch) alone.
    const random::Key key = random::fold_in(random::Key(opt_.seed), static_cast<uint32_t>(epoch));
    double v[2];
    for (int64_t i = static_cast<int64_t>(order.size()) - 1; i > 0; --i) {
      random::uniform_block(key, static_cast<uint64_t>(i), v);
      int64_t j = std::min<int64_t>(i, static_cast<int64_t>(v[0] * static_cast<double>(i + 1)));
      std::swap(order[i], order[j]);
    }
  }
  return order;
}

Batch Loader::make(int64_t serial) const {
  int64_t epoch = serial / per_epoch_, index = serial % per_epoch_;
  std::shared_ptr<const std::vector<int64_t>> order;
  {
    std::lock_guard<std::mutex> lock(order_mu_);
    auto& slot = orders_[epoch];
    if (!slot) slot = std::make_shared<const std::vector<int64_t>>(order_for(epoch));
    order = slot;
    // Forget epochs no batch can ask for any more.
    while (!orders_.empty() && orders_.begin()->first < epoch - 1) orders_.erase(orders_.begin());
  }
  int64_t begin = index * opt_.batch_size;
  int64_t count = std::min<int64_t>(opt_.batch_size, static_cast<int64_t>(order->size()) - begin);
  // This rank's shard of the global batch.
  const int64_t lo = count * opt_.shard / opt_.shards, hi = count * (opt_.shard + 1) / opt_.shards;
  begin += lo;
  count = hi - lo;
  Shape shape = dataset_->image_shape();
  int64_t per_image = numel(shape);
  shape.insert(shape.begin(), count);
  if (dataset_->sample_dtype() == DType::i32) {
    // Token blocks: a language model's labels are its inputs (shifted in the loss).
    Batch b{Array::empty(shape, DType::i32), Array(), epoch, index};
    int32_t* ids = b.images.data<int32_t>();
    for (int64_t i = 0; i < count; ++i)
      dataset_->get_tokens((*order)[begin + i], ids + i * per_image);
    b.labels = b.images;
    return b;
  }
  Batch b{Array::empty(shape, DType::f32), Array::empty({count}, DType::i32), epoch, index};
  float* images = b.images.data<float>();
  int32_t* labels = b.labels.data<int32_t>();
  for (int64_t i = 0; i < count; ++i)
    dataset_->get((*order)[begin + i], epoch, images + i * per_image, labels + i);
  return b;
}

void Loader::worker_loop(int) {
  while (true) {
    int64_t serial;
    {
      std::unique_lock<std::mutex> lock(mu_);
      space_.wait(lock, [&] { return stop_ || next_to_make_ < next_to_take_ + opt_.prefetch; });
      if (stop_ || (opt_.limit > 0 && next_to_make_ >= opt_.limit)) return;
      serial = next_to_make_++;
    }
    try {
      Batch b = make(serial);
      std::lock_guard<std::mutex> lock(mu_);
      done_.emplace(serial, std::move(b));
    } catch (abi::__forced_unwind&) {
      throw;  // the thread is being cancelled (a Python data set at interpreter exit)
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      failed_.emplace(serial, std::current_exception());
    }
    ready_.notify_all();
  }
}

Batch Loader::next() {
  if (opt_.limit > 0 && next_to_take_ >= opt_.limit)
    fail("loader",
         "all " + std::to_string(opt_.limit) + " batches were taken (LoaderOptions::limit)");
  if (workers_.empty()) return make(next_to_take_++);
  auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  ready_.wait(lock,
              [&] { return done_.count(next_to_take_) > 0 || failed_.count(next_to_take_) > 0; });
  if (auto f = failed_.find(next_to_take_); f != failed_.end()) std::rethrow_exception(f->second);
  Batch b = std::move(done_.at(next_to_take_));
  done_.erase(next_to_take_++);
  lock.unlock();
  space_.notify_all();
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return b;
}

}  // namespace kiln::data
