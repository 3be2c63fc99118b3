// kiln — the training loop of `kiln train`: the reference experiment.
#pragma once
#include <functional>
#include <string>

#include "kiln/data.h"
#include "kiln/nn.h"
#include "kiln/optim.h"

namespace kiln::train {

struct TrainConfig {
  std::string model_name = "vit-base";  // preset, or the --config path
  nn::ViTConfig model = nn::ViTConfig::preset("vit-base");
  int64_t batch_size = 32;
  // eager: op by op (PyTorch); lazy: record the step, compile and run it at
  // the barrier (torch_xla); jit: the whole step is one compiled executable
  // with the parameters donated (JAX).
  std::string mode = "eager";
  bool compile_model = false;  // eager: forward and backward compiled, the optimizer eager
  int64_t steps = 12;          // total steps, warm-up included
  int64_t warmup = 2;          // untimed steps at the start
  double lr = 1e-3;
  uint64_t seed = 0;
  nn::Layout layout = nn::Layout::NCHW;
  int workers = 2;
  std::string log_json;   // one JSON object per line, if set
  bool progress = false;  // live progress line (on a terminal)
};

struct StepTiming {
  int64_t step;
  double seconds;       // from the start of the step until its results exist
  double data_seconds;  // spent waiting for the batch
  float loss;
};

struct TrainReport {
  std::vector<StepTiming> steps;
  double mean = 0, median = 0, p90 = 0, min = 0, max = 0;  // over timed steps, seconds
  double images_per_second = 0;
  double data_wait_share = 0;  // data wait / step time, timed steps
  double flops_per_step = 0;
  double achieved_gflops = 0;
  double peak_gflops = 0;
  double mfu = 0;
  double first_step_seconds = 0;
  double peak_rss_mib = 0;
  int64_t parameters = 0;
  uint64_t compiles = 0;  // lazy, jit, compile-model: executables built
  double compile_ms = 0;  // the last compile
  size_t arena_bytes = 0, intermediate_bytes = 0;
};

// Measures the CPU's fp32 FMA throughput on all threads (GFLOP/s).
double measure_peak_gflops();

// Runs the experiment in eager mode: random images, ViT, mean softmax
// cross-entropy, SGD. on_step is called after every step.
TrainReport run(const TrainConfig& cfg, const std::function<void(const StepTiming&)>& on_step = {});

// One forward and backward pass of ViTForImageClassification (no dropout):
// what `kiln grad` writes. pixels are f32 in `layout`; labels i32 or i64.
struct GradResult {
  Array logits;  // [B, num_labels]
  Array loss;    // scalar, mean softmax cross-entropy
  Params grads;  // HuggingFace names
};
GradResult forward_backward(const nn::ViTConfig& cfg, const Params& weights, const Array& pixels,
                            const Array& labels, nn::Layout layout);

}  // namespace kiln::train
