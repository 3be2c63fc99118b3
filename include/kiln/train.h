// kiln — the training loop of `kiln train` (the reference experiment): its
// config and checks, the run, evaluation, and one forward-backward pass for
// `kiln grad`.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/data.h"
#include "kiln/io.h"
#include "kiln/model.h"
#include "kiln/nn.h"
#include "kiln/optim.h"

namespace kiln::train {

// How a training step runs. eager: op by op (PyTorch); lazy: the step is
// recorded, compiled and run at the barrier (torch_xla); jit: the whole step
// is one compiled executable with the parameters donated (JAX).
enum class Mode { eager, lazy, jit };

// A mode from kiln's name or the reference script's alias of it (pytorch =
// eager, torch_xla = lazy, jax = jit); any other name is an error.
Mode parse_mode(const std::string& name);
std::string mode_name(Mode mode);   // eager, lazy, jit
std::string mode_alias(Mode mode);  // pytorch, torch_xla, jax
// Every name parse_mode accepts, each mode's name before its alias.
const std::vector<std::string>& mode_names();

struct TrainConfig {
  std::string model_name = "vit-base";  // preset, or the --config path
  // The model of any registered family (nn::model_from_preset,
  // io::load_model_config, nn::vit_model).
  std::shared_ptr<const nn::Model> model = nn::model_from_preset("vit-base");
  int64_t batch_size = 32;
  // Gradient accumulation: each optimizer step averages the gradients of
  // this many batches of batch_size (the update of one batch this many times
  // larger: HF's gradient_accumulation_steps).
  int64_t accumulate = 1;
  Mode mode = Mode::eager;
  bool compile_model = false;  // eager: forward and backward compiled, the optimizer eager
  int64_t steps = 12;          // total steps, warm-up included
  int64_t warmup = 2;          // untimed steps at the start
  double lr = 1e-3;
  uint64_t seed = 0;
  nn::Layout layout = nn::Layout::NCHW;
  // Threads making batches ahead of the model (0: on the training thread);
  // -1: loader_workers() chooses.
  int workers = -1;
  std::string log_json;   // one JSON object per line, if set
  bool progress = false;  // live progress line (on a terminal)

  // Data: "random" (the reference experiment) or "fashion-mnist" (its train
  // split for training, its test split for evaluation).
  // "imagefolder:PATH" trains on PATH/<class>/*.{jpg,png} less every 10th
  // file of each class, which is the held-out split.
  // A language model's: "text:PATH" (a UTF-8 file or a folder of .txt files,
  // tokenized by `tokenizer` once and cached: data::tokenize_text) or
  // "tokens:PATH" (an llm.c or nanoGPT .bin file, or a folder holding
  // train.bin and val.bin as nanoGPT writes them), cut into blocks of
  // seq_len tokens; a single stream's last 10% (at least one block) is held
  // out for evaluation (loss, perplexity, next-token accuracy).
  std::string data = "random";
  int64_t seq_len = 0;           // tokens per block; 0: the model's n_positions
  std::string tokenizer;         // text: a folder with the tokenizer; "": init_from's
  bool skip_bad_images = false;  // imagefolder: skip unreadable files (counted)
  std::string data_dir = data::kFashionMnistDir;
  // fashion-mnist: random horizontal flips; an RGB image folder: torchvision's
  // RandomResizedCrop (random_crop, crop_scale, crop_ratio) and a horizontal
  // flip with probability flip_prob, as run_image_classification.py trains.
  bool augment = false;
  bool random_crop = true;
  double crop_scale[2] = {0.08, 1.0}, crop_ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
  double flip_prob = 0.5;
  // With augment on an RGB image folder: torchvision's ColorJitter after the
  // crop and flip (timm's --color-jitter X: brightness, contrast and
  // saturation X, hue 0).
  data::ColorJitterOptions color_jitter;
  // With augment on an RGB image folder: timm's RandAugment after the crop
  // and the flip (--rand-augment rand-m9-mstd0.5), bicubic, filling with the
  // normalization mean; not with color jitter (timm leaves that out with it).
  data::RandAugmentOptions rand_augment;
  // Optimizer: "sgd" (lr, momentum, weight_decay) or "adamw" (lr, betas,
  // weight_decay); the learning rate follows `schedule` (warm-up + cosine).
  std::string optimizer = "sgd";
  double momentum = 0.0;
  double weight_decay = 0.0;
  // No weight decay on biases, LayerNorm weights, the position embeddings
  // and the [CLS] token (optim::no_weight_decay: the HF Trainer's exemptions and timm's).
  bool exempt_from_decay = false;
  // Layer-wise learning-rate decay (BEiT's, timm's --layer-decay; 0: off):
  // each parameter's lr scaled by layer_decay^(groups - 1 - its group), the
  // classifier at the full lr (nn::layer_decay_scales).
  double layer_decay = 0.0;
  // Mixup and cutmix of each batch (timm's Mixup, mode "batch"; --mixup,
  // --cutmix, --mixup-prob, --mixup-switch-prob): the loss becomes the
  // cross-entropy against the mixed soft targets (timm's
  // SoftTargetCrossEntropy), smoothed by label_smoothing.
  data::MixupOptions mixup;
  // Random erasing of each training image (timm's RandomErasing, one box;
  // --reprob, --remode), applied to the normalized images before mixing.
  data::ErasingOptions erasing;
  double beta1 = 0.9, beta2 = 0.999;
  // Softmax cross-entropy against labels smoothed by this much, as
  // CrossEntropyLoss(label_smoothing=) (single-label classification).
  double label_smoothing = 0.0;
  // Stochastic depth rising linearly over the model's blocks to this rate
  // (timm's --drop-path; Model::with_drop_path); -1: the model's config's.
  double drop_path = -1;
  std::string schedule = "constant";  // constant, cosine, linear
  int64_t lr_warmup = 0;
  double clip_norm = 0.0;  // global-norm gradient clipping; 0: off
  // An exponential moving average of the weights with this decay (timm's
  // ModelEmaV2; 0: none), evaluated beside the weights and saved in the
  // checkpoint's ema/ folder.
  double ema = 0.0;
  bool freeze_backbone = false;  // train the classifier alone (linear probing)
  // Evaluation on the held-out split every `eval_every` steps (0: only at
  // the end) when the data set has one.
  int64_t eval_every = 0;
  // Evaluate on `eval_samples` examples of the held-out split (images, or
  // blocks of tokens for a language model), spread evenly over it (every
  // size/N-th), rather than all of it (0: all): quicker evaluations of a
  // large split (transformers' examples' max_eval_samples).
  int64_t eval_samples = 0;
  // Checkpoints: every `save_every` steps (0: only at the end) into save_dir.
  std::string save_dir;
  int64_t save_every = 0;
  // Save only after an evaluation whose accuracy beats every one before it
  // (save_dir then holds the best model so far).
  bool save_best = false;
  std::string resume_dir;  // continue from this checkpoint (the model comes from it)
  // Start from this pretrained model (io::load_pretrained: a folder that
  // transformers saved, or a Hub id in the local cache) instead of fresh
  // weights; the data's labels decide its classifier (io::adapt_classifier).
  // A --resume checkpoint, when given, is what the run continues from.
  std::string init_from;
  // The images' size for init_from's model (its position embeddings
  // resampled once, io::set_image_size); 0: the model's own. (A new model
  // takes its size from cfg.model.)
  nn::Size2d image_size = 0;
  // fp32, or bf16 mixed precision (bf16 matmul operands, f32 everything else);
  // tf32 is a CUDA setting and an error on the cpu device.
  std::string precision = "fp32";
  // Where the model trains: cpu, ref (the reference backend: slow, for
  // checking) or cuda[:N]. The data pipeline runs on the host; each batch is
  // copied to the device, and the host waits only for the loss it logs.
  std::string device = "cpu";
  // Self-attention as one fused primitive (default) or unfused, as
  // transformers' eager attention (nn::ApplyOptions::fused_attention).
  bool fused_attention = true;

  // Data-parallel training (mpirun -np N kiln train; kiln/distributed.h):
  // every rank takes its contiguous shard of each global batch of
  // batch_size, and gradients are averaged over the ranks in buckets of
  // about bucket_mb MB (DistributedDataParallel's bucket_cap_mb), each
  // started as soon as the backward has produced it.
  double bucket_mb = 25;
  // Average through the buckets even in a process alone (the values are the
  // same; checks the path in one process).
  bool all_reduce_always = false;
  // Every this many steps the ranks compare a hash of their parameters and
  // stop when one differs (0: never).
  int64_t check_replicas = 0;
  // A collective that has not finished after this many seconds stops every
  // rank, naming the ranks that never reached it (0: no limit).
  double dist_timeout = 300;
};

// The training split and the held-out split (null when there is none) of
// cfg.data, shaped for cfg.model (fashion-mnist: train and test;
// imagefolder:PATH: all files but every 10th of each class, and those).
struct DataSplits {
  std::shared_ptr<const data::Dataset> train, eval;
  int64_t skipped = 0;  // unreadable image files skipped (skip_bad_images)
  // A language model's text: what was read ("text:PATH: 3 files, 1.7 MB,
  // 412,345 tokens (cached)"), and its tokenizer's files, kept with the
  // run's checkpoints (io::Checkpoint::files).
  std::string description;
  std::map<std::string, std::string> files;
};
// `processor`: how an RGB image folder's images become pixel values (a
// checkpoint's preprocessor_config.json); unset: data_processor's default.
DataSplits load_data(const TrainConfig& cfg,
                     const std::optional<data::ImageProcessor>& processor = std::nullopt);
// n examples of `all` spread evenly over it (example i is all's i * size /
// n: an image folder's held-out split, in class order, gives every class its
// share); `all` itself where n is 0 or not below its size.
std::shared_ptr<const data::Dataset> spread_examples(std::shared_ptr<const data::Dataset> all,
                                                     int64_t n);
// The images' size in a run of `model`: --image-size when given; else the
// model's own for a model that takes only its size (a ViT); else 28 for
// Fashion-MNIST and the model's config's (224 for a ResNet) otherwise.
nn::Size2d data_image_size(const TrainConfig& cfg, const nn::Model& model);
// The processor of a run's image folder: `given` (a pretrained model's or a
// checkpoint's), else for an RGB model on an image folder ViTImageProcessor's
// defaults at the model's image size; none for other data (Fashion-MNIST,
// random images, grey folders).
std::optional<data::ImageProcessor> data_processor(
    const TrainConfig& cfg, const nn::Model& model,
    const std::optional<data::ImageProcessor>& given);

// The matmul dtype of a --precision value (errors name the flag).
DType matmul_dtype_for(const std::string& precision);

struct EvalResult {
  int64_t step = 0;
  // Mean loss of the model's problem type (softmax cross-entropy for
  // classes); a language model's mean next-token cross-entropy (its
  // perplexity exp(loss)), its accuracy and top-5 the next token's.
  double loss = 0;
  double accuracy = 0;  // top-1, in [0, 1]
  double top5 = 0;      // the true class among the 5 highest logits (fewer than 6 labels: 1)
  // With TrainConfig::ema: the same of the moving average of the weights.
  bool has_ema = false;
  double ema_loss = 0, ema_accuracy = 0, ema_top5 = 0;
  int64_t samples = 0;
  int64_t tokens = 0;  // a language model's: the tokens predicted (T - 1 per block)
  double seconds = 0;
};

struct StepTiming {
  int64_t step;
  double seconds;       // from the start of the step until its results exist
  double data_seconds;  // spent waiting for the batch
  float loss;
  double lr = 0;  // the learning rate the step used
};

struct TrainReport {
  std::vector<StepTiming> steps;
  double mean = 0, median = 0, p90 = 0, min = 0, max = 0;  // over timed steps, seconds
  double images_per_second = 0;
  double data_wait_share = 0;  // data wait / step time, timed steps
  double flops_per_step = 0;   // this rank's: its shard of the batch
  double achieved_gflops = 0;
  double peak_gflops = 0;
  double mfu = 0;
  double first_step_seconds = 0;
  double peak_rss_mib = 0;
  // The most memory kiln's allocator of a CUDA device held at once during
  // the run (0 on the host devices, whose memory peak_rss_mib counts).
  double peak_device_mib = 0;
  int64_t parameters = 0;
  uint64_t compiles = 0;       // lazy, jit, compile-model: executables built
  uint64_t replays = 0;        // steps that replayed a recording of their executable (CUDA Graphs)
  uint64_t eval_compiles = 0;  // compiled evaluation: executables built (one per batch shape)
  double compile_ms = 0;       // the last compile
  size_t arena_bytes = 0, intermediate_bytes = 0;
  std::vector<EvalResult> evals;
  int64_t first_step = 1;      // > 1 when resumed
  int64_t skipped_images = 0;  // imagefolder with skip_bad_images
  // Data-parallel runs: the ranks, and the gradient all-reduces of the timed
  // steps (seconds from each exchange's start to its end, summed; of which
  // the step waited for: not hidden behind the backward).
  int ranks = 1;
  uint64_t all_reduces = 0;
  double all_reduce_seconds = 0, all_reduce_exposed_seconds = 0, all_reduce_bytes = 0;
  double wall_seconds = 0;  // the whole run, evaluation and saving included
};

// A NaN or infinite loss stops the run with this error: the step and the
// first op that produced a non-finite value when the step is re-run eagerly.
struct NonFiniteLoss : Error {
  using Error::Error;
};

struct Callbacks {
  // Once the data sets are read, before the first step (rank 0): what was
  // read (DataSplits::description, a language model's text; "" otherwise).
  std::function<void(const std::string& description)> on_data;
  std::function<void(const StepTiming&)> on_step;
  std::function<void(const EvalResult&)> on_eval;
  std::function<void(int64_t step, const std::string& dir)> on_save;
  // The device's peak GFLOP/s, asked for once at the end of the run, for the
  // model FLOP utilization (the kiln command measures it, tools/kiln/peak.h);
  // without it the report's peak_gflops and mfu are 0.
  std::function<double()> peak_gflops;
};

// The checks run() makes before it reads or loads anything (batch size,
// steps, warm-up, --compile-model, clipping, intervals, precision, schedule,
// optimizer and its momentum); errors name the flag.
void validate(const TrainConfig& cfg);

// The checkpoint of cfg.resume_dir (none when it is empty), loaded once: the
// command line shows its model before the run, which continues from it.
std::optional<io::Checkpoint> load_resume(const TrainConfig& cfg);

// The names of cfg.data's labels, in label order: an image folder's class
// sub-folders, Fashion-MNIST's classes; none for random data.
std::vector<std::string> data_labels(const TrainConfig& cfg);

// The pretrained model of cfg.init_from (none when it is empty), with a
// classifier for the data's labels (data_labels; the checkpoint's for random
// data), loaded once: the command line shows its model and notes first.
std::optional<io::Pretrained> load_init(const TrainConfig& cfg);

// A run set up from a config, as `kiln train` and kiln.train.run start it:
// compile_model dropped outside eager mode (lazy and jit compile the whole
// step already), a new fixed-size model (a ViT) made for cfg.image_size, the
// checkpoint of cfg.resume_dir (load_resume; the run continues its model)
// or else the pretrained model of cfg.init_from (load_init), each loaded
// once and its model put in the config; `epochs` passes over the training
// split (0: cfg.steps) turned into steps (steps_for_epochs); then validate().
struct Setup {
  TrainConfig config;
  std::optional<io::Checkpoint> resumed;
  std::optional<io::Pretrained> init;
};
Setup prepare(TrainConfig cfg, int64_t epochs = 0);

// `epochs` passes over `train_samples` samples: cfg's steps, and its warm-up
// cut to fit them as the default schedule would.
void steps_for_epochs(TrainConfig& cfg, int64_t epochs, int64_t train_samples);

// The loader threads a run uses: cfg.workers where it is set; else 2 on the
// cpu, whose cores the model's kernels need, and on an accelerator, whose
// host is otherwise idle, half the host's cores (2 to 8): the GPU check
// (2026-12-04) found an H200's ViT-B/16 step waiting on two threads' random
// images half of its time. Each thread keeps two batches ahead, as
// PyTorch's DataLoader (prefetch_factor 2).
int loader_workers(const TrainConfig& cfg);

// Runs the experiment: random images (or a data set), ViT, the loss of the
// config's problem_type (mean softmax cross-entropy for classes; targets made
// from the class labels otherwise, see targets_for in step.cpp), SGD or
// AdamW. on_step is called after every step. `resumed` is the checkpoint of
// cfg.resume_dir (load_resume), checked against cfg before the run goes on
// from it; its model replaces cfg.model. Otherwise `init` (load_init), when
// given, is where it starts. The first form loads both itself.
TrainReport run(const TrainConfig& cfg, const Callbacks& callbacks = {});
TrainReport run(const TrainConfig& cfg, std::optional<io::Checkpoint> resumed,
                const Callbacks& callbacks = {}, std::optional<io::Pretrained> init = std::nullopt);

// Loss and top-1 accuracy of a model's parameters on data sets, in batches:
// eager, or compiled, one forward pass per batch shape (the last batch of a
// split may be smaller), built on first use and kept for later calls, so that
// a run that evaluates every N steps compiles once per shape.
class Evaluator {
 public:
  Evaluator(std::shared_ptr<const nn::Model> model, nn::Layout layout, bool compiled,
            DType matmul_dtype = DType::f32);
  Evaluator(const Evaluator&) = delete;  // the compiled pass refers to this object
  Evaluator& operator=(const Evaluator&) = delete;

  // `state`: the model's (BatchNorm's running statistics; none for a ViT).
  EvalResult operator()(const Params& params, const Params& state, const data::Dataset& dataset,
                        int64_t batch_size);
  EvalResult operator()(const Params& params, const data::Dataset& dataset, int64_t batch_size) {
    return (*this)(params, {}, dataset, batch_size);
  }
  uint64_t compiles() const;  // executables built so far (0 when eager)

 private:
  std::shared_ptr<const nn::Model> model_;
  nn::Layout layout_;
  DType matmul_dtype_;
  std::vector<std::string> names_, state_names_;  // in flatten()'s order
  std::optional<Jitted> forward_;                 // when compiled
};

// One evaluation with an Evaluator of its own.
EvalResult evaluate(std::shared_ptr<const nn::Model> model, const Params& params,
                    const Params& state, const data::Dataset& dataset, int64_t batch_size,
                    nn::Layout layout, bool compiled, DType matmul_dtype = DType::f32);

// `kiln predict`: a model's top labels for image files.
struct PredictOptions {
  int64_t batch_size = 32;
  int64_t top_k = 5;     // at most num_labels
  bool compiled = true;  // one compiled forward pass per batch shape; else eager
  int workers = 2;       // threads decoding and processing images ahead of the model
  DType matmul_dtype = DType::f32;
};
struct Prediction {
  std::string file;
  // (label, score), best first: softmax probabilities; sigmoid for
  // multi-label configs and a single unset output (as transformers'
  // image-classification pipeline); the output itself for regression.
  std::vector<std::pair<std::string, double>> top;
  std::string error;  // non-empty: the file could not be read or processed
};
// How scores come from logits for `cfg` ("softmax", "sigmoid" or "none").
std::string score_function(const nn::Model& model);
// Predicts every file of `images` in order, batch by batch (the model on the
// parameters' device), calling on_result once per file as its batch is done.
// Returns the number of files that failed.
int64_t predict(const nn::Model& model, const Params& params, const Params& state,
                const data::ImageFiles& images, const PredictOptions& opt,
                const std::function<void(const Prediction&)>& on_result);

// One forward and backward pass of a model in training mode without dropout
// or drop path (BatchNorm normalizes by the batch and updates its running
// statistics): what `kiln grad` writes. `weights` hold the parameters and
// the state (as a pretrained folder does); pixels are f32 in `layout`;
// labels as transformers takes them for the config's problem type
// (nn::Model::loss): integer classes [B] (-100: ignored, as
// CrossEntropyLoss's ignore_index), or float targets. A language model
// takes input_ids [B, T] for the pixels and labels [B, T] (shifted inside,
// -100 ignored); ids outside the vocabulary are an error.
struct GradResult {
  Array logits;  // [B, num_logits()] ([B, T, vocab] for a language model)
  Array loss;    // scalar, transformers' loss for the problem type
  Params grads;  // HuggingFace names
  Params state;  // the state after the forward (none for models without)
};
GradResult forward_backward(const nn::Model& model, const Params& weights, const Array& pixels,
                            const Array& labels, nn::Layout layout,
                            DType matmul_dtype = DType::f32);

}  // namespace kiln::train
