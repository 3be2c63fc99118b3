// The training loop: checkpoints (transformers names, atomic saves,
// bit-identical resume), evaluation (compiled once per batch shape), NaN
// detection, optimizers in every mode, the modes' names and the config checks.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/train.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("kiln-train-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  return p.string();
}

nn::ViTConfig small_config() {
  nn::ViTConfig c = nn::ViTConfig::preset("vit-tiny");
  c.image_size = 16, c.patch_size = 8, c.hidden_size = 16, c.num_attention_heads = 2;
  c.intermediate_size = 32, c.num_hidden_layers = 2, c.num_labels = 5;
  return c;
}

train::TrainConfig small_run(const std::string& mode, const std::string& optimizer) {
  train::TrainConfig t;
  t.model = nn::vit_model(small_config());
  t.model_name = "small";
  t.batch_size = 4;
  t.mode = train::parse_mode(mode);
  t.steps = 4;
  t.warmup = 0;
  t.lr = 1e-2;
  t.optimizer = optimizer;
  t.momentum = optimizer == "sgd" ? 0.9 : 0.0;
  t.weight_decay = 0.01;
  t.schedule = "cosine";
  t.lr_warmup = 1;
  t.clip_norm = 1.0;
  t.workers = 0;
  return t;
}

Params final_params(const std::string& dir) {
  return io::load_checkpoint(dir).params;
}

// Every parameter of `got` within `tol` (relative, at least 1) of `want`'s.
void expect_params_near(const Params& got, const Params& want, const std::string& what,
                        double tol = 1e-5) {
  for (auto& [name, x] : got) {
    auto u = x.to_vector<float>(), v = want.at(name).to_vector<float>();
    ASSERT_EQ(u.size(), v.size()) << what << " " << name;
    for (size_t i = 0; i < u.size(); ++i)
      EXPECT_NEAR(u[i], v[i], tol * std::max(1.0f, std::fabs(v[i]))) << what << " " << name;
  }
}

void expect_bitwise_equal(const Params& a, const Params& b) {
  ASSERT_EQ(a.size(), b.size());
  for (auto& [name, x] : a) {
    auto u = x.to_vector<float>(), v = b.at(name).to_vector<float>();
    ASSERT_EQ(u.size(), v.size());
    EXPECT_EQ(0, std::memcmp(u.data(), v.data(), u.size() * sizeof(float))) << name;
  }
}

// Training on the reference backend (--device ref): the cpu's losses and
// final parameters in every mode, with both optimizers; the compiled modes
// compile once and replay their step's recording from step 3 on (as a CUDA
// Graph would be), and the checkpoint is written from the device.
TEST(Train, OnTheRefDeviceAsOnTheCpuWithReplayedSteps) {
  for (const char* optimizer : {"sgd", "adamw"}) {
    for (const char* mode : {"eager", "lazy", "jit"}) {
      SCOPED_TRACE(std::string(mode) + " " + optimizer);
      std::string on_cpu = temp_dir("cpu"), on_ref = temp_dir("ref");
      train::TrainConfig c = small_run(mode, optimizer);
      c.steps = 5;
      c.save_dir = on_cpu;
      train::TrainConfig r = c;
      r.device = "ref";
      r.save_dir = on_ref;
      auto rc = train::run(c), rr = train::run(r);
      ASSERT_EQ(rr.steps.size(), rc.steps.size());
      for (size_t i = 0; i < rc.steps.size(); ++i)
        EXPECT_NEAR(rr.steps[i].loss, rc.steps[i].loss, 1e-5 * std::fabs(rc.steps[i].loss));
      // AdamW divides by the gradients' running RMS: where a gradient is
      // rounding noise (f64 on ref, f32 on the cpu) its step is still ~lr, of
      // either sign; 1e-4 is 1% of the learning rate.
      expect_params_near(final_params(on_ref), final_params(on_cpu), "ref vs cpu",
                         std::string(optimizer) == "adamw" ? 1e-4 : 1e-5);
      EXPECT_EQ(rc.replays, 0u);  // the cpu runs its kernels as they come
      EXPECT_EQ(rr.replays, std::string(mode) == "eager" ? 0u : 3u);
    }
  }
}

class Resume : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Resume, TwoPlusTwoStepsAreBitIdenticalToFour) {
  auto [mode, optimizer] = GetParam();
  std::string whole = temp_dir("whole"), half = temp_dir("half");
  train::TrainConfig t = small_run(mode, optimizer);
  t.save_dir = whole;
  train::run(t);
  // 2 steps, saved...
  train::TrainConfig a = small_run(mode, optimizer);
  a.save_dir = half;
  a.save_every = 2;
  a.steps = 4;
  std::vector<float> losses_a;
  // Stop after step 2 by running with a callback that throws once saved.
  struct Stop {};
  try {
    train::run(a, {.on_save = [](int64_t step, const std::string&) {
                 if (step == 2) throw Stop{};
               }});
  } catch (const Stop&) {
  }
  io::Checkpoint mid = io::load_checkpoint(half);
  EXPECT_EQ(mid.state.step, 2);
  EXPECT_EQ(mid.data_position, 2);
  // ...then 2 more from the checkpoint.
  train::TrainConfig b = small_run(mode, optimizer);
  b.resume_dir = half;
  b.save_dir = half;
  auto report = train::run(b);
  EXPECT_EQ(report.first_step, 3);
  EXPECT_EQ(report.steps.size(), 2u);
  expect_bitwise_equal(final_params(half), final_params(whole));
  auto s1 = io::load_checkpoint(half).state, s2 = io::load_checkpoint(whole).state;
  EXPECT_EQ(s1.step, 4);
  expect_bitwise_equal(s1.buffers, s2.buffers);
  fs::remove_all(whole);
  fs::remove_all(half);
}

INSTANTIATE_TEST_SUITE_P(ModesAndOptimizers, Resume,
                         ::testing::Values(std::tuple{"eager", "adamw"}, std::tuple{"jit", "adamw"},
                                           std::tuple{"lazy", "sgd"}, std::tuple{"jit", "sgd"}),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

TEST(Train, EveryModeGivesTheSameParametersWithAdamW) {
  Params ref;
  for (std::string mode : {"eager", "eager-compile", "lazy", "jit"}) {
    std::string dir = temp_dir("modes-" + mode);
    train::TrainConfig t = small_run(mode == "eager-compile" ? "eager" : mode, "adamw");
    t.compile_model = mode == "eager-compile";
    t.save_dir = dir;
    train::run(t);
    Params p = final_params(dir);
    if (ref.empty()) {
      ref = p;
    } else {
      expect_params_near(p, ref, mode);
    }
    fs::remove_all(dir);
  }
}

// --attention unfused (transformers' eager attention) trains to the same
// parameters as the fused kernel, in the eager and the compiled step. (SGD:
// AdamW would blow the key bias's gradient, zero up to rounding, up to
// lr-sized steps of noise.)
TEST(Train, FusedAndUnfusedAttentionAgree) {
  for (std::string mode : {"eager", "jit"}) {
    Params fused;
    for (bool f : {true, false}) {
      std::string dir = temp_dir("attention-" + mode + (f ? "-fused" : "-unfused"));
      train::TrainConfig t = small_run(mode, "sgd");
      t.fused_attention = f;
      t.save_dir = dir;
      train::run(t);
      Params p = final_params(dir);
      fs::remove_all(dir);
      if (f) {
        fused = p;
        continue;
      }
      expect_params_near(p, fused, mode);
    }
  }
}

TEST(Checkpoint, HasTransformersNamesAndConfig) {
  std::string dir = temp_dir("names");
  train::TrainConfig t = small_run("eager", "adamw");
  t.steps = 1;
  t.schedule = "constant";
  t.save_dir = dir;
  train::run(t);
  for (const char* f :
       {"config.json", "model.safetensors", "training_state.safetensors", "trainer.json"})
    EXPECT_TRUE(fs::exists(dir + "/" + f)) << f;
  auto weights = io::load_safetensors(dir + "/model.safetensors");
  nn::ViTForImageClassification model(small_config());
  for (auto& [name, shape] : model.parameter_shapes()) {
    ASSERT_TRUE(weights.tensors.count(name)) << name;
    EXPECT_EQ(weights.tensors.at(name).shape(), shape) << name;
  }
  EXPECT_EQ(weights.metadata.at("format"), "pt");  // what transformers' loader expects
  EXPECT_TRUE(weights.tensors.count("vit.encoder.layer.0.attention.attention.query.weight"));
  EXPECT_TRUE(weights.tensors.count("classifier.bias"));
  auto state = io::load_safetensors(dir + "/training_state.safetensors").tensors;
  EXPECT_TRUE(state.count("exp_avg/classifier.weight"));
  EXPECT_TRUE(state.count("exp_avg_sq/vit.layernorm.bias"));
  nn::ViTConfig back = io::load_config<nn::ViTConfig>(dir + "/config.json");
  EXPECT_EQ(back.hidden_size, 16);
  EXPECT_EQ(back.num_labels, 5);
  fs::remove_all(dir);
}

TEST(Checkpoint, AnInterruptedSaveLeavesThePreviousOneLoadable) {
  std::string dir = temp_dir("atomic");
  nn::ViTForImageClassification model(small_config());
  io::Checkpoint first{nn::vit_model(small_config()), model.init(random::Key(1)), "sgd", {{}, 1}, 0,
                      1};
  io::save_checkpoint(dir, first);
  io::Checkpoint second{nn::vit_model(small_config()), model.init(random::Key(2)), "sgd",
                       {{}, 2}, 0, 2};
  // Killed after writing everything to DIR.tmp, before the renames:
  std::string staged = io::stage_checkpoint(dir, second);
  EXPECT_TRUE(fs::exists(staged + "/model.safetensors"));
  EXPECT_EQ(io::load_checkpoint(dir).state.step, 1);
  // Killed between the two renames (DIR moved to DIR.old, DIR.tmp not yet in place):
  fs::rename(dir, dir + ".old");
  EXPECT_EQ(io::load_checkpoint(dir).state.step, 1);
  fs::rename(dir + ".old", dir);
  // The commit completes the save and cleans up.
  io::commit_checkpoint(staged, dir);
  EXPECT_EQ(io::load_checkpoint(dir).state.step, 2);
  EXPECT_FALSE(fs::exists(dir + ".old"));
  EXPECT_FALSE(fs::exists(dir + ".tmp"));
  // A checkpoint whose trainer.json is damaged gets an error naming the file
  // and the field (a float or negative count would not convert to an integer).
  struct Damaged {
    const char* trainer_json;
    const char* error;
  } damaged[] = {
      {R"({"format": "kiln-checkpoint-1", "step": "x"})",
       R"(trainer.json: field 'step' is "x", expected an integer in [0, 9223372036854775807])"},
      {R"({"format": "kiln-checkpoint-1", "step": 1e300})", "field 'step' is 1e+300"},
      {R"({"format": "kiln-checkpoint-1", "step": 2, "seed": -1})",
       "field 'seed' is -1, expected an integer in [0, 18446744073709551615]"},
      {R"({"format": "kiln-checkpoint-1", "step": 2, "seed": 0, "data_position": 0})",
       "missing field 'optimizer'"},
      {"[1, 2]", "trainer.json: expected a JSON object, got array"},
  };
  for (const Damaged& d : damaged) {
    io::write_file_atomic(dir + "/trainer.json", d.trainer_json);
    try {
      io::load_checkpoint(dir);
      ADD_FAILURE() << "expected an error for " << d.trainer_json;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(d.error), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(io::load_checkpoint(dir + "-missing"), Error);
  fs::remove_all(dir);
}

TEST(Train, ResumeChecksTheRunAgreesWithTheCheckpoint) {
  std::string dir = temp_dir("agree");
  train::TrainConfig t = small_run("eager", "adamw");
  t.steps = 2;
  t.save_dir = dir;
  train::run(t);
  train::TrainConfig other = small_run("eager", "sgd");
  other.resume_dir = dir;
  EXPECT_THROW(train::run(other), Error);  // optimizer differs
  train::TrainConfig done = small_run("eager", "adamw");
  done.steps = 2;
  done.resume_dir = dir;
  EXPECT_THROW(train::run(done), Error);  // nothing left to do
  fs::remove_all(dir);
}

TEST(Train, ANonFiniteLossStopsTheRunNamingTheStepAndTheOp) {
  train::TrainConfig t = small_run("jit", "sgd");
  t.lr = 1e30;
  t.schedule = "constant";
  t.lr_warmup = 0;
  t.clip_norm = 0;
  t.momentum = 0;
  t.weight_decay = 0;
  try {
    train::run(t);
    FAIL() << "expected the run to stop";
  } catch (const train::NonFiniteLoss& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[train] step 2: the loss is"), std::string::npos) << m;
    EXPECT_NE(m.find("[nan-check]"), std::string::npos) << m;
    EXPECT_NE(m.find("produced"), std::string::npos) << m;
  }
}

// A config that changes only the model (non-square images whose sizes leave a
// remainder, a pruned head, mish, no query/key/value bias) trains in every
// mode to the same parameters, and its checkpoint keeps the config.
TEST(Train, AReshapedModelTrainsAlikeInEveryMode) {
  nn::ViTConfig c = small_config();
  c.image_size = {18, 13}, c.patch_size = {5, 4};
  c.pruned_heads = {{1, {0}}};
  c.hidden_act = nn::Activation::Mish;
  c.qkv_bias = false;
  Params ref;
  for (std::string mode : {"eager", "eager-compile", "lazy", "jit"}) {
    std::string dir = temp_dir("reshaped-" + mode);
    train::TrainConfig t = small_run(mode == "eager-compile" ? "eager" : mode, "sgd");
    t.compile_model = mode == "eager-compile";
    t.model = nn::vit_model(c);
    t.save_dir = dir;
    auto report = train::run(t);
    EXPECT_NEAR(report.steps[0].loss, std::log(5.0), 0.5) << mode;  // chance at the start
    Params p = final_params(dir);
    nn::ViTConfig back = nn::as_vit(*io::load_checkpoint(dir).model)->config();
    EXPECT_EQ(back.image_size, nn::Size2d(18, 13));
    EXPECT_EQ(back.pruned_heads, c.pruned_heads);
    EXPECT_EQ(back.hidden_act, nn::Activation::Mish);
    fs::remove_all(dir);
    if (ref.empty()) {
      ref = p;
      continue;
    }
    expect_params_near(p, ref, mode);
  }
}

// kiln train's data sets label images with classes; regression and
// multi-label models learn targets made from them (the one-hot vector; the
// class index as a number for one output), in every mode alike.
TEST(Train, RegressionAndMultiLabelLearnTargetsMadeFromTheClasses) {
  struct Case {
    const char* name;
    int64_t num_labels;
    nn::ProblemType problem;
  } cases[] = {{"regression-1", 1, nn::ProblemType::Unset},
               {"regression-5", 5, nn::ProblemType::Regression},
               {"multi-label", 5, nn::ProblemType::MultiLabel}};
  for (const Case& k : cases) {
    nn::ViTConfig c = small_config();
    c.num_labels = k.num_labels, c.problem_type = k.problem;
    // The first step's loss, from the same weights and batch by hand.
    nn::ViTForImageClassification model(c);
    Params init = model.init(random::split(random::Key(0), 3)[0]);
    data::RandomImages ds({.num_samples = 4, .num_labels = k.num_labels, .image_size = 16});
    std::vector<float> images(4 * 3 * 16 * 16);
    std::vector<int32_t> classes(4);
    for (int i = 0; i < 4; ++i) ds.get(i, images.data() + i * 3 * 16 * 16, &classes[i]);
    auto logits = model.apply(init, Array::from_vector(images, {4, 3, 16, 16})).to_vector<double>();
    double want = 0;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < k.num_labels; ++j) {
        double x = logits[i * k.num_labels + j];
        double y = k.num_labels == 1 ? classes[i] : (classes[i] == j ? 1.0 : 0.0);
        want += k.problem == nn::ProblemType::MultiLabel ? std::log1p(std::exp(x)) - x * y
                                                         : (x - y) * (x - y);
      }
    want /= 4 * k.num_labels;
    Params ref;
    for (std::string mode : {"eager", "lazy", "jit"}) {
      std::string dir = temp_dir(std::string(k.name) + "-" + mode);
      train::TrainConfig t = small_run(mode, "sgd");
      t.model = nn::vit_model(c);
      t.save_dir = dir;
      auto report = train::run(t);
      EXPECT_NEAR(report.steps[0].loss, want, 1e-5 * want) << k.name << " " << mode;
      for (auto& st : report.steps) EXPECT_TRUE(std::isfinite(st.loss)) << k.name << " " << mode;
      Params p = final_params(dir);
      fs::remove_all(dir);
      if (ref.empty()) {
        ref = p;
        continue;
      }
      expect_params_near(p, ref, std::string(k.name) + " " + mode);
    }
  }
}

TEST(Train, AModelWithoutAClassifierIsRefusedNamingNumLabels) {
  train::TrainConfig t = small_run("eager", "sgd");
  nn::ViTConfig c = small_config();
  c.num_labels = 0;
  t.model = nn::vit_model(c);
  try {
    train::run(t);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[train] the model has num_labels 0 (no classifier"),
              std::string::npos)
        << e.what();
  }
}

TEST(Mode, NamesAndTheReferenceScriptsAliasesParse) {
  struct Case {
    const char* name;
    train::Mode mode;
  } cases[] = {{"eager", train::Mode::eager}, {"pytorch", train::Mode::eager},
               {"lazy", train::Mode::lazy},   {"torch_xla", train::Mode::lazy},
               {"jit", train::Mode::jit},     {"jax", train::Mode::jit}};
  for (const Case& c : cases) EXPECT_EQ(train::parse_mode(c.name), c.mode) << c.name;
  EXPECT_EQ(train::mode_names(),
            (std::vector<std::string>{"eager", "pytorch", "lazy", "torch_xla", "jit", "jax"}));
  for (train::Mode m : {train::Mode::eager, train::Mode::lazy, train::Mode::jit}) {
    EXPECT_EQ(train::parse_mode(train::mode_name(m)), m);
    EXPECT_EQ(train::parse_mode(train::mode_alias(m)), m);
  }
  EXPECT_EQ(train::mode_alias(train::Mode::lazy), "torch_xla");
  for (const char* bad : {"", "JIT", "tpu", "jit "}) {
    try {
      train::parse_mode(bad);
      ADD_FAILURE() << "expected an error for '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[train] mode '" + std::string(bad) +
                                           "', expected eager, lazy or jit"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Validate, EachBadSettingIsNamed) {
  struct Case {
    std::function<void(train::TrainConfig&)> change;
    const char* error;
  } cases[] = {
      {[](auto& t) { t.batch_size = 0; }, "--batch-size must be positive"},
      {[](auto& t) { t.steps = 0; }, "--steps must be positive"},
      {[](auto& t) { t.warmup = 4; }, "--warmup must lie in [0, --steps), got 4 with --steps 4"},
      {[](auto& t) { t.warmup = -1; }, "--warmup must lie in [0, --steps)"},
      {[](auto& t) { t.mode = train::Mode::jit, t.compile_model = true; },
       "--compile-model goes with --mode eager"},
      {[](auto& t) { t.clip_norm = -1; }, "--clip-norm must be >= 0"},
      {[](auto& t) { t.workers = -2; },
       "--workers must be >= 0 (or -1: chosen by the device), got -2"},
      {[](auto& t) { t.color_jitter.brightness = 0.4; },
       "--color-jitter goes with --augment on an RGB image folder"},
      {[](auto& t) { t.color_jitter.hue = 0.6; },
       "--color-jitter's hue 0.600000: expected 0 to 0.5"},
      {[](auto& t) { t.rand_augment = data::RandAugmentOptions::parse("rand-m9", "-"); },
       "--rand-augment goes with --augment on an RGB image folder"},
      {[](auto& t) {
         t.rand_augment = data::RandAugmentOptions::parse("rand-m9", "-");
         t.augment = true, t.data = "imagefolder:x", t.color_jitter.brightness = 0.4;
       },
       "--rand-augment and --color-jitter: pick one"},
      {[](auto& t) { t.rand_augment = {.enabled = true, .prob = 1.5}; },
       "--rand-augment] p 1.500000: expected 0 to 1"},
      {[](auto& t) { t.eval_every = -1; }, "--eval-every and --save-every must be >= 0"},
      {[](auto& t) { t.save_every = -2; }, "--eval-every and --save-every must be >= 0"},
      {[](auto& t) { t.eval_samples = -3; },
       "--eval-samples must be >= 0 (0: the whole held-out split), got -3"},
      {[](auto& t) { t.precision = "tf32"; }, "--precision tf32 is a CUDA setting"},
      {[](auto& t) { t.precision = "tf32", t.device = "ref"; },
       "--precision tf32 is a CUDA setting (TensorFloat-32 tensor cores) and --device is ref"},
      {[](auto& t) { t.device = "gpu"; }, "--device] unknown device 'gpu'"},
      {[](auto& t) { t.device = "cuda:x"; }, "unknown device 'cuda:x'"},
      {[](auto& t) { t.precision = "fp16"; }, "--precision 'fp16', expected fp32, bf16 or tf32"},
      {[](auto& t) { t.lr_warmup = 4; }, "cosine decay needs total steps"},
      {[](auto& t) { t.optimizer = "lamb"; }, "optimizer 'lamb', expected sgd or adamw"},
      {[](auto& t) { t.optimizer = "adamw"; }, "--momentum goes with --optimizer sgd"},
  };
  train::validate(small_run("eager", "sgd"));  // the base case is good
  for (const Case& c : cases) {
    train::TrainConfig t = small_run("eager", "sgd");  // momentum 0.9, cosine, lr warm-up 1
    c.change(t);
    try {
      train::validate(t);
      ADD_FAILURE() << "expected: " << c.error;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.error), std::string::npos) << e.what();
    }
    EXPECT_THROW(train::run(t), Error) << c.error;  // run() makes the same checks
  }
}

// The loader's threads: as given, else 2 on the host devices and half the
// host's cores (2 to 8) for a GPU's.
TEST(Validate, LoaderWorkersAreGivenOrChosenByTheDevice) {
  train::TrainConfig t;
  EXPECT_EQ(t.workers, -1);
  EXPECT_EQ(train::loader_workers(t), 2);  // cpu
  t.device = "ref";
  EXPECT_EQ(train::loader_workers(t), 2);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  for (const char* gpu : {"cuda", "cuda:1"}) {
    t.device = gpu;
    EXPECT_EQ(train::loader_workers(t), std::clamp(cores / 2, 2, 8)) << gpu;
  }
  t.workers = 0;
  EXPECT_EQ(train::loader_workers(t), 0);
  t.workers = 5, t.device = "cpu";
  EXPECT_EQ(train::loader_workers(t), 5);
}

// The data sets' file format, for a tiny Fashion-MNIST-shaped data set.
void write_idx_gz(const std::string& path, const Shape& shape, int modulo) {
  std::vector<uint8_t> b{0, 0, 0x08, static_cast<uint8_t>(shape.size())};
  int64_t n = 1;
  for (int64_t d : shape) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
    n *= d;
  }
  for (int64_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>((i * 37) % modulo));
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, b.data(), b.size()), static_cast<int>(b.size()));
  gzclose(f);
}

// 16 training and 10 test images in Fashion-MNIST's files, and a small model for them.
train::TrainConfig tiny_fashion_run(const std::string& dir) {
  fs::create_directories(dir);
  write_idx_gz(dir + "/train-images-idx3-ubyte.gz", {16, 28, 28}, 256);
  write_idx_gz(dir + "/train-labels-idx1-ubyte.gz", {16}, 10);
  write_idx_gz(dir + "/t10k-images-idx3-ubyte.gz", {10, 28, 28}, 256);
  write_idx_gz(dir + "/t10k-labels-idx1-ubyte.gz", {10}, 10);
  train::TrainConfig t = small_run("jit", "sgd");
  nn::ViTConfig c = small_config();
  c.image_size = 28, c.patch_size = 14, c.num_channels = 1;
  c.num_labels = 10, c.num_hidden_layers = 1;
  t.model = nn::vit_model(c);
  t.data = "fashion-mnist";
  t.data_dir = dir;
  t.steps = 6;
  t.eval_every = 2;  // evaluations at steps 2, 4 and 6
  return t;
}

// Evaluation every --eval-every steps reuses its compiled forward pass: one
// executable per batch shape of the held-out split (10 images in batches of
// 4: shapes 4 and 2; in batches of 5: one shape), counted in the report and
// in the log's summary line.
TEST(Train, EvaluationCompilesOncePerBatchShape) {
  std::string dir = temp_dir("eval-compiles"), log = dir + "/log.jsonl";
  struct Case {
    std::string mode;
    int64_t batch_size;
    uint64_t compiles;
  } cases[] = {
      {"jit", 4, 2}, {"jit", 5, 1}, {"lazy", 4, 2}, {"eager-compile", 4, 2}, {"eager", 4, 0}};
  for (const Case& c : cases) {
    train::TrainConfig t = tiny_fashion_run(dir);
    t.mode = train::parse_mode(c.mode == "eager-compile" ? "eager" : c.mode);
    t.compile_model = c.mode == "eager-compile";
    t.batch_size = c.batch_size;
    t.log_json = log;
    auto report = train::run(t);
    ASSERT_EQ(report.evals.size(), 3u) << c.mode;
    EXPECT_EQ(report.evals[0].samples, 10) << c.mode;
    EXPECT_EQ(report.eval_compiles, c.compiles) << c.mode << " batch " << c.batch_size;
    std::ifstream in(log);
    std::string line, last;
    while (std::getline(in, line)) last = line;
    EXPECT_NE(last.find("\"eval_compiles\":" + std::to_string(c.compiles)), std::string::npos)
        << last;
  }
  fs::remove_all(dir);
}

// An Evaluator keeps its executables across calls; a new one starts afresh.
TEST(Evaluate, AnEvaluatorCompilesEachShapeOnce) {
  nn::ViTConfig c = small_config();
  Params p = nn::ViTForImageClassification(c).init(random::Key(3));
  data::RandomImages ds({.num_samples = 10, .num_labels = 5, .image_size = 16});
  train::Evaluator compiled(nn::vit_model(c), nn::Layout::NCHW, true),
      eager(nn::vit_model(c), nn::Layout::NCHW, false);
  auto first = compiled(p, ds, 4);  // batches of 4, 4, 2
  EXPECT_EQ(compiled.compiles(), 2u);
  for (int i = 0; i < 2; ++i) {
    auto again = compiled(p, ds, 4);
    EXPECT_EQ(again.loss, first.loss);
    EXPECT_EQ(again.accuracy, first.accuracy);
  }
  EXPECT_EQ(compiled.compiles(), 2u);
  compiled(p, ds, 5);  // batches of 5: a third shape
  EXPECT_EQ(compiled.compiles(), 3u);
  auto e = eager(p, ds, 4);
  EXPECT_EQ(eager.compiles(), 0u);
  EXPECT_NEAR(e.loss, first.loss, 1e-5);
}

TEST(Evaluate, CompiledAndEagerAgree) {
  nn::ViTConfig c = small_config();
  Params p = nn::ViTForImageClassification(c).init(random::Key(3));
  data::RandomImages ds({.num_samples = 10, .num_labels = 5, .image_size = 16});
  auto e = train::evaluate(nn::vit_model(c), p, {}, ds, 4, nn::Layout::NCHW,
                           false);  // batches of 4, 4, 2
  auto j = train::evaluate(nn::vit_model(c), p, {}, ds, 4, nn::Layout::NCHW, true);
  EXPECT_EQ(e.samples, 10);
  EXPECT_NEAR(e.loss, j.loss, 1e-5);
  EXPECT_DOUBLE_EQ(e.accuracy, j.accuracy);
  EXPECT_GT(e.loss, 0);
  EXPECT_NEAR(e.loss, std::log(5.0), 0.5);  // near chance for fresh weights
}

}  // namespace
}  // namespace kiln
