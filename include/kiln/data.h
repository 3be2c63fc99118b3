// kiln — data sets and a threaded loader with bounded prefetch.
#pragma once
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "kiln/nn.h"

namespace kiln::data {

// A data set of fixed-shape float images with integer labels. get() must be
// safe to call from several threads at once.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Shape image_shape() const = 0;  // one sample, e.g. {3, 224, 224}
  virtual void get(int64_t index, float* image, int32_t* label) const = 0;
};

struct RandomImagesOptions {
  int64_t num_samples = 1 << 20;
  int64_t num_labels = 1000;
  int64_t image_size = 224;
  int64_t channels = 3;
  nn::Layout layout = nn::Layout::NCHW;
  uint64_t seed = 0;
};

// The reference experiment's data: N(0,1) pixels, label of sample i = i % num_labels.
// Sample i is a pure function of (seed, i).
class RandomImages final : public Dataset {
 public:
  explicit RandomImages(RandomImagesOptions opt);
  int64_t size() const override { return opt_.num_samples; }
  Shape image_shape() const override;
  void get(int64_t index, float* image, int32_t* label) const override;

 private:
  RandomImagesOptions opt_;
};

struct LoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = false;
  uint64_t seed = 0;      // shuffling order of epoch e uses fold_in(seed, e)
  bool drop_last = true;  // drop a final partial batch
  int workers = 2;        // 0: batches are made on the caller's thread
  int prefetch = 4;       // batches made ahead of the consumer, at most
};

struct Batch {
  Array images;  // [B, ...image_shape] f32
  Array labels;  // [B] i32
  int64_t epoch = 0;
  int64_t index = 0;  // batch number within the epoch
};

// Yields batches in order, epoch after epoch, forever; workers build them
// ahead of time. Destroying the loader stops the workers cleanly.
class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions opt);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  Batch next();
  int64_t batches_per_epoch() const { return per_epoch_; }
  // Seconds the caller has spent blocked in next() waiting for a batch.
  double wait_seconds() const { return wait_seconds_; }

 private:
  Batch make(int64_t serial) const;
  std::vector<int64_t> order_for(int64_t epoch) const;
  void worker_loop(int id);

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions opt_;
  int64_t per_epoch_;
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::map<int64_t, Batch> done_;                 // finished batches by serial number
  std::map<int64_t, std::exception_ptr> failed_;  // a worker's error, raised by next()
  int64_t next_to_make_ = 0, next_to_take_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
  double wait_seconds_ = 0;
  mutable std::mutex order_mu_;
  mutable std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders_;
};

}  // namespace kiln::data
