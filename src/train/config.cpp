// kiln train: the names of the modes, the checks of a TrainConfig, the
// optimizer and matmul precision it asks for, and the checkpoint it resumes.
#include <algorithm>
#include <array>
#include <thread>
#include <utility>

#include "internal.h"
#include "kiln/distributed.h"

namespace kiln::train {
namespace {

struct ModeNames {
  Mode mode;
  const char *name, *alias;
};
constexpr std::array<ModeNames, 3> kModes{{{Mode::eager, "eager", "pytorch"},
                                           {Mode::lazy, "lazy", "torch_xla"},
                                           {Mode::jit, "jit", "jax"}}};

const ModeNames& names_of(Mode mode) {
  for (const ModeNames& m : kModes)
    if (m.mode == mode) return m;
  fail("train", "mode " + std::to_string(static_cast<int>(mode)) + " is not a mode");
}

}  // namespace

Mode parse_mode(const std::string& name) {
  for (const ModeNames& m : kModes)
    if (name == m.name || name == m.alias) return m.mode;
  fail("train", "mode '" + name + "', expected eager, lazy or jit (or pytorch, torch_xla, jax)");
}

std::string mode_name(Mode mode) {
  return names_of(mode).name;
}

std::string mode_alias(Mode mode) {
  return names_of(mode).alias;
}

const std::vector<std::string>& mode_names() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> v;
    for (const ModeNames& m : kModes) v.insert(v.end(), {m.name, m.alias});
    return v;
  }();
  return all;
}

namespace {
std::unique_ptr<optim::Optimizer> base_optimizer(const TrainConfig& cfg) {
  std::map<std::string, double> scales;
  if (cfg.layer_decay > 0) {
    if (!cfg.model) fail("train", "--layer-decay needs the model (TrainConfig::model)");
    scales = nn::layer_decay_scales(*cfg.model, cfg.layer_decay);
  }
  if (cfg.optimizer == "sgd")
    return std::make_unique<optim::SGD>(
        optim::SGDOptions{.lr = cfg.lr,
                          .momentum = cfg.momentum,
                          .weight_decay = cfg.weight_decay,
                          .exempt_from_decay = cfg.exempt_from_decay,
                          .lr_scale = std::move(scales)});
  if (cfg.optimizer == "adamw")
    return std::make_unique<optim::AdamW>(
        optim::AdamWOptions{.lr = cfg.lr,
                            .beta1 = cfg.beta1,
                            .beta2 = cfg.beta2,
                            .weight_decay = cfg.weight_decay,
                            .exempt_from_decay = cfg.exempt_from_decay,
                            .lr_scale = std::move(scales)});
  fail("train", "optimizer '" + cfg.optimizer + "', expected sgd or adamw");
}
}  // namespace

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg) {
  std::unique_ptr<optim::Optimizer> opt = base_optimizer(cfg);
  // The heads train() computes gradients for (a DeiT's two with a teacher).
  if (cfg.freeze_backbone) opt = std::make_unique<optim::Masked>(std::move(opt), in_head);
  if (cfg.ema > 0) opt = std::make_unique<optim::WithEma>(std::move(opt), cfg.ema);
  return opt;
}

DType matmul_dtype_for(const std::string& precision) {
  // tf32: f32 matmuls whose products a GPU's tensor cores form from TF32
  // operands (set_matmul_precision; validate() allows it on cuda only).
  if (precision == "fp32" || precision == "tf32") return DType::f32;
  if (precision == "bf16") return DType::bf16;
  fail("train", "--precision '" + precision + "', expected fp32, bf16 or tf32");
}

int loader_workers(const TrainConfig& cfg) {
  if (cfg.workers >= 0) return cfg.workers;
  if (cfg.device.rfind("cuda", 0) != 0) return 2;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores / 2, 2, 8);
}

void validate(const TrainConfig& cfg) {
  if (cfg.batch_size <= 0) fail("train", "--batch-size must be positive");
  if (cfg.steps <= 0) fail("train", "--steps must be positive");
  if (cfg.warmup < 0 || cfg.warmup >= cfg.steps)
    fail("train", "--warmup must lie in [0, --steps), got " + std::to_string(cfg.warmup) +
                      " with --steps " + std::to_string(cfg.steps));
  if (cfg.compile_model && cfg.mode != Mode::eager)
    fail("train", "--compile-model goes with --mode eager (lazy and jit compile the whole step)");
  if (cfg.clip_norm < 0) fail("train", "--clip-norm must be >= 0");
  if (!(cfg.drop_path == -1 || (cfg.drop_path >= 0 && cfg.drop_path < 1)))
    fail("train", "--drop-path must lie in [0, 1), got " + std::to_string(cfg.drop_path));
  if (cfg.workers < -1)
    fail("train", "--workers must be >= 0 (or -1: chosen by the device), got " +
                      std::to_string(cfg.workers));
  cfg.mixup.validate();
  cfg.erasing.validate();
  cfg.color_jitter.validate();
  cfg.rand_augment.validate("--rand-augment");
  // Both adjust decoded RGB images as they are augmented.
  const bool rgb_augmented = cfg.augment && cfg.data.rfind("imagefolder:", 0) == 0 &&
                             !(cfg.model && cfg.model->num_channels() != 3);
  for (auto [on, flag] : {std::pair{cfg.color_jitter.enabled(), "--color-jitter"},
                          std::pair{cfg.rand_augment.enabled, "--rand-augment"}})
    if (on && !rgb_augmented)
      fail("train", std::string(flag) +
                        " goes with --augment on an RGB image folder (--data imagefolder:"
                        "PATH and a model of 3 channels)");
  if (cfg.rand_augment.enabled && cfg.color_jitter.enabled())
    fail("train",
         "--rand-augment and --color-jitter: pick one (timm leaves color jitter out when "
         "RandAugment is on)");
  if (cfg.mixup.enabled()) {
    if (cfg.batch_size % 2 != 0)
      fail("train", "--mixup/--cutmix mix each image with its mirror in the batch: --batch-size " +
                        std::to_string(cfg.batch_size) + " must be even");
    if (cfg.model && !cfg.model->causal_lm() &&
        (cfg.model->num_labels() < 2 ||
         (cfg.model->problem_type() != nn::ProblemType::Unset &&
          cfg.model->problem_type() != nn::ProblemType::SingleLabel)))
      fail("train", std::string("--mixup/--cutmix need single-label classification, and the "
                                "model's problem_type is ") +
                        nn::problem_type_name(cfg.model->problem_type()) + " with " +
                        std::to_string(cfg.model->num_labels()) + " labels");
  }
  if (!(cfg.layer_decay >= 0 && cfg.layer_decay <= 1))
    fail("train", "--layer-decay " + std::to_string(cfg.layer_decay) +
                      ", expected a value in (0, 1] (0: off)");
  if (cfg.eval_every < 0 || cfg.save_every < 0)
    fail("train", "--eval-every and --save-every must be >= 0");
  if (cfg.eval_samples < 0)
    fail("train", "--eval-samples must be >= 0 (0: the whole held-out split), got " +
                      std::to_string(cfg.eval_samples));
  matmul_dtype_for(cfg.precision);
  const Device device = parse_device(cfg.device, "--device");
  if (cfg.precision == "tf32" && device.type != DeviceType::cuda)
    fail("train",
         "--precision tf32 is a CUDA setting (TensorFloat-32 tensor cores) and --device "
         "is " +
             cfg.device + ": use fp32, or bf16 for mixed precision");
  if (device.type == DeviceType::cuda && device.index >= cuda_device_count())
    fail("train",
         "--device " + cfg.device + ": " +
             (cuda_device_count() == 0 ? cuda_unavailable_reason()
                                       : "no such device (" + std::to_string(cuda_device_count()) +
                                             " CUDA devices visible)"));
  optim::Schedule{cfg.schedule, cfg.lr_warmup, cfg.steps}.validate();
  make_optimizer(cfg);
  if (cfg.momentum != 0 && cfg.optimizer != "sgd")
    fail("train", "--momentum goes with --optimizer sgd");
  if (!(cfg.bucket_mb > 0)) fail("train", "--bucket-mb must be positive");
  if (cfg.accumulate < 1)
    fail("train", "--accumulate " + std::to_string(cfg.accumulate) +
                      ": expected 1 or more batches per step");
  if (!(cfg.label_smoothing >= 0 && cfg.label_smoothing <= 1))
    fail("train", "--label-smoothing " + std::to_string(cfg.label_smoothing) + ": expected 0 to 1");
  if (!(cfg.ema == 0 || (cfg.ema > 0 && cfg.ema < 1)))
    fail("train", "--ema " + std::to_string(cfg.ema) + ": expected a decay in (0, 1), e.g. 0.999");
  if (cfg.save_best && cfg.save_dir.empty()) fail("train", "--save-best goes with --save DIR");
  if (cfg.label_smoothing > 0 && cfg.model->num_labels() == 1)
    fail("train",
         "--label-smoothing smooths the classes of single-label classification, but the "
         "model has one output (regression)");
  if (cfg.label_smoothing > 0 && cfg.model->problem_type() != nn::ProblemType::Unset &&
      cfg.model->problem_type() != nn::ProblemType::SingleLabel)
    fail("train",
         "--label-smoothing smooths single-label classification, but the model's problem_type is " +
             std::string(nn::problem_type_name(cfg.model->problem_type())));
  if (cfg.check_replicas < 0) fail("train", "--check-replicas must be >= 0");
  if (!(cfg.dist_timeout >= 0)) fail("train", "--dist-timeout must be >= 0");
  const int ranks = dist::size();
  if (cfg.batch_size % ranks != 0)
    fail("train", "--batch-size " + std::to_string(cfg.batch_size) +
                      " (the global batch) does "
                      "not divide among " +
                      std::to_string(ranks) + " ranks: use a multiple of " + std::to_string(ranks));
}

std::optional<io::Checkpoint> load_resume(const TrainConfig& cfg) {
  if (cfg.resume_dir.empty()) return std::nullopt;
  return io::load_checkpoint(cfg.resume_dir);
}

std::vector<std::string> data_labels(const TrainConfig& cfg) {
  if (cfg.data == "fashion-mnist") return data::FashionMnist::class_names();
  if (cfg.data.rfind("imagefolder:", 0) == 0)
    return data::ImageFolder::list_classes(cfg.data.substr(12));
  return {};
}

std::optional<io::Pretrained> load_init(const TrainConfig& cfg) {
  if (cfg.init_from.empty()) return std::nullopt;
  io::Pretrained m = io::load_pretrained(cfg.init_from);
  // A key of its own: the parameters' key draws a whole model.
  // (A language model has no classifier: its head is its vocabulary.)
  if (!m.model->causal_lm())
    io::adapt_classifier(m, data_labels(cfg), random::fold_in(random::Key(cfg.seed), 0x1ead));
  if (cfg.image_size.height > 0) io::set_image_size(m, cfg.image_size);
  return m;
}

Setup prepare(TrainConfig cfg, int64_t epochs) {
  if (epochs < 0) fail("train", "--epochs " + std::to_string(epochs) + ": expected 0 or more");
  if (epochs > 0 && cfg.data == "random")
    fail("train",
         "--epochs needs a finite data set (--data fashion-mnist, imagefolder:PATH, text:PATH "
         "or tokens:PATH)");
  Setup s{std::move(cfg), std::nullopt, std::nullopt};
  TrainConfig& c = s.config;
  // As in the reference script, compile_model only changes the eager mode;
  // lazy and jit compile the whole step already.
  if (c.mode != Mode::eager) c.compile_model = false;
  // A new fixed-size model (a ViT) takes image_size (a convolutional model
  // takes any size); init_from's model is resized when it is loaded.
  if (c.image_size.height > 0 && c.init_from.empty() && c.model->fixed_image_size())
    c.model = c.model->with_image_size(c.image_size, "--image-size " + nn::to_string(c.image_size));
  s.resumed = load_resume(c);
  if (s.resumed) {
    c.model = s.resumed->model;
    c.model_name = c.resume_dir;
  } else {
    s.init = load_init(c);
  }
  if (s.init) {
    c.model = s.init->model;
    c.model_name =
        c.init_from == s.init->dir ? c.init_from : c.init_from + " (" + s.init->dir + ")";
  }
  if (epochs > 0) steps_for_epochs(c, epochs, load_data(c).train->size());
  validate(c);
  return s;
}

void steps_for_epochs(TrainConfig& cfg, int64_t epochs, int64_t train_samples) {
  int64_t per_epoch = train_samples / cfg.batch_size;
  if (per_epoch == 0)
    fail("train", "--batch-size " + std::to_string(cfg.batch_size) + " is larger than the " +
                      std::to_string(train_samples) + " training samples");
  cfg.steps = std::max<int64_t>(1, epochs * per_epoch / cfg.accumulate);
  if (cfg.warmup >= cfg.steps) cfg.warmup = std::min<int64_t>(2, cfg.steps - 1);
}

}  // namespace kiln::train
