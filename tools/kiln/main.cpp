// kiln — the command line.
//   kiln demo [--steps N] [--lr X] [--mode eager|lazy] [--seed S] [--threads T]
//   kiln train [--batch-size N] [--mode eager|pytorch] [--model NAME | --config PATH] ...
//   kiln eval --checkpoint DIR [--data fashion-mnist]
//   kiln plot LOG.jsonl -o curves.png (or .svg)
//   kiln grad --config C.json --weights W.safetensors --batch B.safetensors --out O.safetensors
//   kiln info
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>
#include <oneapi/dnnl/dnnl.hpp>

#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/train.h"
#include "ops/dispatch.h"

using namespace kiln;

namespace {

struct DemoOptions {
  int steps = 300;
  double lr = 0.1;
  std::string mode = "eager";
  uint64_t seed = 0;
  int threads = 0;
};

// A small classifier trained with grad + SGD on a synthetic task: 4 Gaussian
// clusters in 16 dimensions, 512 samples, MLP 16 -> 64 (GELU, LayerNorm) -> 4.
int run_demo(const DemoOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const int64_t n = 512, d = 16, hidden = 64, classes = 4;
  auto k = random::split(random::Key(o.seed), 6);
  Array centers = random::normal(k[0], {classes, d}) * 0.3;
  std::vector<int32_t> label_v(n);
  for (int64_t i = 0; i < n; ++i) label_v[i] = static_cast<int32_t>(i % classes);
  Array labels = Array::from_vector(label_v, {n});
  Array x = take(centers, labels, 0) + random::normal(k[1], {n, d});

  Params params{{"fc1.weight", random::truncated_normal(k[2], {hidden, d}) * (1.0 / std::sqrt(d))},
                {"fc1.bias", zeros({hidden})},
                {"norm.weight", ones({hidden})},
                {"norm.bias", zeros({hidden})},
                {"fc2.weight", random::truncated_normal(k[3], {classes, hidden}) * 0.1},
                {"fc2.bias", zeros({classes})}};
  auto forward = [](const Params& p, const Array& x) {
    Array h = matmul(x, p.at("fc1.weight"), {.transpose_b = true}) + p.at("fc1.bias");
    h = layer_norm(gelu(h), p.at("norm.weight"), p.at("norm.bias"), 1e-5);
    return matmul(h, p.at("fc2.weight"), {.transpose_b = true}) + p.at("fc2.bias");
  };
  auto loss_fn = [&](const Params& p, const Array& x, const Array& y) {
    return mean(softmax_cross_entropy(forward(p, x), y));
  };
  auto accuracy = [&](const Params& p) {
    Array hits = equal(argmax(forward(p, x), -1), labels);
    return sum(hits).item<double>() / static_cast<double>(n);
  };

  std::printf("kiln demo: MLP %lld-%lld-%lld on %lld samples, SGD lr %.3g, %s mode, %d threads\n",
              (long long)d, (long long)hidden, (long long)classes, (long long)n, o.lr,
              o.mode.c_str(), num_threads());
  auto start = std::chrono::steady_clock::now();
  float loss = 0;
  for (int step = 1; step <= o.steps; ++step) {
    std::optional<LazyScope> lazy;
    if (o.mode == "lazy") lazy.emplace();
    auto [value, grads] = value_and_grad(loss_fn)(params, x, labels);
    for (auto& [name, p] : params) p = p - grads.at(name) * o.lr;
    eval(params);  // the step barrier: in lazy mode the whole step runs here
    loss = value.item<float>();
    if (step == 1 || step % 50 == 0 || step == o.steps)
      std::printf("step %4d  loss %.4f  accuracy %.1f%%\n", step, loss, 100 * accuracy(params));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d steps in %.3f s (%.1f steps/s); final loss %.4f\n", o.steps, secs, o.steps / secs,
              loss);
  return 0;
}

int run_info() {
  const dnnl_version_t* v = dnnl_version();
  std::printf("kiln 0.1\n");
  std::printf("threads:  %d (OpenMP)\n", num_threads());
  std::printf("oneDNN:   %d.%d.%d (cpu runtime %s)\n", v->major, v->minor, v->patch,
              v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other");
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  const char* isa_name = isa == dnnl_cpu_isa_avx512_core_amx
                             ? "AVX-512 with AMX (bf16 GEMMs on AMX)"
                         : isa == dnnl_cpu_isa_avx512_core_bf16 ? "AVX-512 with BF16 (no AMX)"
                         : isa == dnnl_cpu_isa_avx512_core_vnni ? "AVX-512 with VNNI"
                                                                : "older than AVX-512 BF16";
  std::printf("CPU ISA:  %s (oneDNN's choice)\n", isa_name);
  std::printf("f32 GEMM: %s on %s; %s\n", cpu_gemm_library().c_str(), cpu_gemm_isa().c_str(),
              cpu_gemm_library_reason().c_str());
  std::printf("bf16 GEMM: %s\n", cpu_bf16_gemm_native()
                                      ? "oneDNN, native"
                                      : "none on this CPU: bf16 operands widened to f32");
  std::printf("devices:  cpu\n");
  return 0;
}

struct TrainFlags {
  int64_t batch_size = 32;
  std::string mode = "jax";  // the reference script's default
  bool compile_model = false;
  std::string model = "vit-base";
  std::string config;
  int64_t steps = -1, warmup = -1;
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string layout = "nchw";
  int threads = 0;
  std::string log_json;
  std::string data = "random", data_dir = data::kFashionMnistDir;
  bool augment = false, skip_bad_images = false;
  std::string optimizer = "sgd", schedule = "constant";
  double momentum = 0, weight_decay = 0, clip_norm = 0;
  int64_t lr_warmup = 0, epochs = 0, eval_every = 0, save_every = 0, print_every = 0;
  bool steps_given = false;
  std::string save, resume;
  std::string precision = "fp32";
  std::string attention = "fused";
};

// Default schedule: a few timed steps, so that the default run (vit-base on a
// 2-core CPU) finishes in minutes. The reference schedule is --steps 52 --warmup 11.
void default_schedule(TrainFlags& f) {
  if (f.steps < 0) f.steps = f.model == "vit-base" || f.model == "vit-large" ? 8 : 20;
  if (f.warmup < 0) f.warmup = std::min<int64_t>(2, f.steps - 1);
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 1 ? "%.1f ms" : "%.3f s", s < 1 ? s * 1e3 : s);
  return buf;
}

int run_train(TrainFlags f) {
  // The reference script's first three lines, byte for byte (Python's
  // f"Mode: {mode} \n" f"Batch size: {batch_size} \n" f"Compile model: {compile_model}"),
  // so that runs of both can be compared by grepping them.
  std::printf("Mode: %s \nBatch size: %lld \nCompile model: %s\n", f.mode.c_str(),
              (long long)f.batch_size, f.compile_model ? "True" : "False");
  std::fflush(stdout);
  if (f.mode == "pytorch") f.mode = "eager";
  if (f.mode == "torch_xla") f.mode = "lazy";
  if (f.mode == "jax") f.mode = "jit";
  // As in the reference script, --compile-model only changes the eager mode;
  // lazy and jit compile the whole step already.
  if (f.mode != "eager") f.compile_model = false;
  if (f.threads > 0) set_num_threads(f.threads);
  f.steps_given = f.steps >= 0;
  default_schedule(f);
  train::TrainConfig cfg;
  if (!f.config.empty()) {
    cfg.model = io::load_vit_config(f.config);
    cfg.model_name = f.config;
  } else {
    cfg.model = nn::ViTConfig::preset(f.model);
    cfg.model_name = f.model;
  }
  cfg.batch_size = f.batch_size;
  cfg.mode = f.mode;
  cfg.compile_model = f.compile_model;
  cfg.steps = f.steps;
  cfg.warmup = f.warmup;
  cfg.lr = f.lr;
  cfg.seed = f.seed;
  cfg.layout = f.layout == "nhwc" ? nn::Layout::NHWC : nn::Layout::NCHW;
  cfg.log_json = f.log_json;
  cfg.data = f.data;
  cfg.data_dir = f.data_dir;
  cfg.augment = f.augment;
  cfg.skip_bad_images = f.skip_bad_images;
  cfg.optimizer = f.optimizer;
  cfg.momentum = f.momentum;
  cfg.weight_decay = f.weight_decay;
  cfg.schedule = f.schedule;
  cfg.lr_warmup = f.lr_warmup;
  cfg.clip_norm = f.clip_norm;
  cfg.eval_every = f.eval_every;
  cfg.save_dir = f.save;
  cfg.save_every = f.save_every;
  cfg.resume_dir = f.resume;
  cfg.precision = f.precision;
  cfg.fused_attention = f.attention == "fused";
  train::matmul_dtype_for(f.precision);  // a bad value fails before anything runs
  if (!f.resume.empty()) {
    cfg.model = io::load_checkpoint(f.resume).config;
    cfg.model_name = f.resume;
  }
  if (f.momentum != 0 && f.optimizer != "sgd")
    fail("train", "--momentum goes with --optimizer sgd");
  if (f.epochs > 0) {
    if (f.data == "random")
      fail("train", "--epochs needs a finite data set (--data fashion-mnist or imagefolder:PATH)");
    if (f.steps_given)
      fail("train", "--epochs and --steps both set the length of the run; give one");
    int64_t samples = train::load_data(cfg).train->size(), per_epoch = samples / cfg.batch_size;
    if (per_epoch == 0)
      fail("train", "--batch-size " + std::to_string(cfg.batch_size) + " is larger than the " +
                        std::to_string(samples) + " training samples");
    cfg.steps = f.epochs * per_epoch;
    if (cfg.warmup >= cfg.steps) cfg.warmup = std::min<int64_t>(2, cfg.steps - 1);
  }
  bool tty = ::isatty(STDOUT_FILENO);
  int64_t params = 0;
  for (auto& [name, shape] : nn::ViTForImageClassification(cfg.model).parameter_shapes())
    params += numel(shape);
  int64_t print_every = f.print_every > 0 ? f.print_every : std::max<int64_t>(1, cfg.steps / 50);

  const char* alias = f.mode == "eager" ? "pytorch" : f.mode == "lazy" ? "torch_xla" : "jax";
  std::printf("kiln train: mode %s (%s)%s, model %s, %.1fM parameters\n", f.mode.c_str(), alias,
              f.compile_model ? " with --compile-model" : "", cfg.model_name.c_str(), params / 1e6);
  auto g = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  std::string opt = f.optimizer == "sgd" ? "SGD" : "AdamW";
  if (f.momentum != 0) opt += " momentum " + g(f.momentum);
  if (f.weight_decay != 0) opt += " weight decay " + g(f.weight_decay);
  if (f.schedule != "constant" || f.lr_warmup > 0)
    opt += ", " + std::to_string(f.lr_warmup) + " warm-up steps then " + f.schedule;
  if (f.clip_norm > 0) opt += ", gradients clipped to norm " + g(f.clip_norm);
  // The data sets' labels are classes; other problem types learn targets made from them.
  nn::ProblemType problem = cfg.model.problem_for(DType::i32);
  std::string loss = problem == nn::ProblemType::SingleLabel
                         ? ""
                         : std::string(" (") + nn::problem_type_name(problem) + ")";
  std::printf("batch size %lld, %lldx%lld images (%s) of %s, %lld labels%s, %s lr %g, seed %llu\n",
              (long long)cfg.batch_size, (long long)cfg.model.image_size.height,
              (long long)cfg.model.image_size.width, f.layout == "nhwc" ? "NHWC" : "NCHW",
              f.data == "random" ? "random data" : f.data.c_str(), (long long)cfg.model.num_labels,
              loss.c_str(), opt.c_str(), cfg.lr, (unsigned long long)cfg.seed);
  std::string precision = "fp32";
  if (f.precision == "bf16")
    precision = cpu_bf16_gemm_native() ? "bf16 mixed precision"
                                       : "bf16 mixed precision (this CPU has no bf16 GEMM: the "
                                         "bf16-rounded operands are multiplied in f32)";
  std::printf("device cpu (%s), %d threads, %s, f32 GEMMs on %s; %lld steps, the first %lld "
              "untimed\n",
              cpu_gemm_isa().c_str(), num_threads(), precision.c_str(), cpu_gemm_library().c_str(),
              (long long)cfg.steps, (long long)cfg.warmup);
  std::fflush(stdout);

  double elapsed = 0;
  int64_t done = 0, first = -1;
  double last_acc = -1;
  auto on_step = [&](const train::StepTiming& s) {
    elapsed += s.seconds;
    ++done;
    if (first < 0) first = s.step;
    double eta = elapsed / done * (cfg.steps - s.step);
    bool untimed = s.step < first + cfg.warmup;
    if (tty) {
      const int width = 20;
      int filled = static_cast<int>(width * s.step / cfg.steps);
      std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
      std::string acc = last_acc >= 0 ? "  acc " + g(std::round(1000 * last_acc) / 10) + "%" : "";
      std::printf("\r\033[K[%s] step %lld/%lld  loss %.4f%s  %.1f img/s  ETA %s", bar.c_str(),
                  (long long)s.step, (long long)cfg.steps, s.loss, acc.c_str(),
                  cfg.batch_size / s.seconds, fmt_seconds(eta).c_str());
      if (s.step == cfg.steps) std::printf("\n");
    } else if (s.step % print_every == 0 || s.step == first || s.step == cfg.steps) {
      std::printf("step %lld/%lld  loss %.4f  lr %.3g  %s%s\n", (long long)s.step,
                  (long long)cfg.steps, s.loss, s.lr, fmt_seconds(s.seconds).c_str(),
                  untimed ? "  (untimed)" : "");
    }
    std::fflush(stdout);
  };
  auto on_eval = [&](const train::EvalResult& e) {
    last_acc = e.accuracy;
    std::printf("%seval at step %lld: loss %.4f, accuracy %.2f%% on %lld %s images (%s)\n",
                tty && e.step != cfg.steps ? "\r\033[K" : "", (long long)e.step, e.loss,
                100 * e.accuracy, (long long)e.samples,
                f.data == "fashion-mnist" ? "test" : "held-out", fmt_seconds(e.seconds).c_str());
    std::fflush(stdout);
  };
  auto on_save = [&](int64_t step, const std::string& dir) {
    std::printf("%ssaved step %lld to %s\n", tty && step != cfg.steps ? "\r\033[K" : "",
                (long long)step, dir.c_str());
    std::fflush(stdout);
  };
  if (tty) {
    // The first step also touches all memory (and compiles): say it started.
    std::printf("step 0/%lld  first step running", (long long)cfg.steps);
    std::fflush(stdout);
  }
  train::TrainReport r = train::run(cfg, {on_step, on_eval, on_save});
  std::printf("average step time: %.6f\n", r.mean);
  std::printf("median %s, p90 %s, min %s, max %s over %lld timed steps\n",
              fmt_seconds(r.median).c_str(), fmt_seconds(r.p90).c_str(), fmt_seconds(r.min).c_str(),
              fmt_seconds(r.max).c_str(),
              (long long)std::max<int64_t>(1, cfg.steps - r.first_step + 1 - cfg.warmup));
  std::printf("%.2f images/s, data wait %.1f%% of the step, first step %s, peak RSS %.0f MiB\n",
              r.images_per_second, 100 * r.data_wait_share,
              fmt_seconds(r.first_step_seconds).c_str(), r.peak_rss_mib);
  if (f.mode != "eager" || f.compile_model)
    std::printf(
        "time to first step %s (compile %.0f ms); %llu compilation%s; arena %.0f MiB for "
        "%.0f MiB of intermediates\n",
        fmt_seconds(r.first_step_seconds).c_str(), r.compile_ms, (unsigned long long)r.compiles,
        r.compiles == 1 ? "" : "s", r.arena_bytes / 1048576.0, r.intermediate_bytes / 1048576.0);
  std::printf(
      "model FLOP utilization %.1f%%: %.0f of %.0f GFLOP/s (%.1f GFLOP per step; peak "
      "measured by an fp32 %s FMA loop on all threads)\n",
      100 * r.mfu, r.achieved_gflops, r.peak_gflops, r.flops_per_step / 1e9,
      cpu_gemm_isa().c_str());
  if (r.skipped_images)
    std::printf("skipped %lld unreadable image files (--skip-bad-images)\n",
                (long long)r.skipped_images);
  if (!r.evals.empty())
    std::printf("final %s accuracy %.2f%% (loss %.4f) after %lld steps; wall time %.1f s\n",
                f.data == "fashion-mnist" ? "test" : "held-out", 100 * r.evals.back().accuracy,
                r.evals.back().loss, (long long)cfg.steps, r.wall_seconds);
  if (kernel_profile().enabled) std::printf("%s", kernel_profile().report().c_str());
  return 0;
}

struct EvalFlags {
  std::string checkpoint, data = "fashion-mnist", data_dir = data::kFashionMnistDir, split = "test",
                          mode = "jit", layout = "nchw";
  int64_t batch_size = 256;
};

int run_eval(const EvalFlags& f) {
  io::Checkpoint ck = io::load_checkpoint(f.checkpoint);
  train::TrainConfig cfg;
  cfg.model = ck.config;
  cfg.data = f.data;
  cfg.data_dir = f.data_dir;
  cfg.layout = f.layout == "nhwc" ? nn::Layout::NHWC : nn::Layout::NCHW;
  train::DataSplits splits = train::load_data(cfg);
  auto ds = f.split == "train" ? splits.train : splits.eval;
  if (!ds)
    fail("eval", "--data " + f.data +
                     " has no held-out split (an image folder needs 10 or more files per class)");
  auto r = train::evaluate(cfg.model, ck.params, *ds, f.batch_size, cfg.layout, f.mode != "eager");
  std::printf("%s (step %lld) on %s %s: loss %.4f, accuracy %.2f%% (%lld images, %s)\n",
              f.checkpoint.c_str(), (long long)ck.state.step, f.data.c_str(),
              f.split == "train"          ? "train"
              : f.data == "fashion-mnist" ? "test"
                                          : "held-out",
              r.loss, 100 * r.accuracy, (long long)r.samples, fmt_seconds(r.seconds).c_str());
  return 0;
}

struct GradFlags {
  std::string config, weights, batch, out, layout = "nchw";
};

int run_grad(const GradFlags& f) {
  nn::ViTConfig cfg = io::load_vit_config(f.config);
  Params weights = io::load_safetensors(f.weights).tensors;
  Params batch = io::load_safetensors(f.batch).tensors;
  for (const char* key : {"pixel_values", "labels"})
    if (!batch.count(key)) fail("grad", f.batch + ": no tensor '" + std::string(key) + "'");
  auto r = train::forward_backward(cfg, weights, batch.at("pixel_values"), batch.at("labels"),
                                   f.layout == "nhwc" ? nn::Layout::NHWC : nn::Layout::NCHW);
  Params out{{"logits", r.logits}, {"loss", r.loss}};
  for (auto& [name, g] : r.grads) out.emplace("grad." + name, g);
  io::save_safetensors(f.out, out);
  std::printf("loss %.6f; wrote logits, loss and %zu gradients to %s\n", r.loss.item<float>(),
              r.grads.size(), f.out.c_str());
  return 0;
}

// Number checks whose errors say what was expected and what was found
// (CLI11's own print the whole range of a double).
CLI::Validator number_check(bool zero_ok, bool integer) {
  const std::string kind = integer ? "an integer" : "a number";
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v = 0;
        size_t used = 0;
        try {
          v = integer ? static_cast<double>(std::stoll(s, &used)) : std::stod(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size()) return "expected " + kind + ", got '" + s + "'";
        if (v > 0 || (zero_ok && v == 0)) return "";
        return "expected " + kind + (zero_ok ? " of 0 or more" : " above 0") + ", got " + s;
      },
      zero_ok ? "NONNEGATIVE" : "POSITIVE", zero_ok ? "nonnegative" : "positive");
}
const CLI::Validator kPositive = number_check(false, false);
const CLI::Validator kNonNegative = number_check(true, false);
const CLI::Validator kPositiveInt = number_check(false, true);
const CLI::Validator kNonNegativeInt = number_check(true, true);

// Replaces each abbreviated long flag in args[2..] by the one flag of `sub`
// that it begins (`--batch=8` -> `--batch-size=8`); returns an error naming
// the flag when it begins several.
std::string expand_abbreviations(const CLI::App& sub, std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (const CLI::Option* o : sub.get_options())
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
  for (size_t i = 2; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a.rfind("--", 0) != 0 || a.size() < 3) continue;
    size_t eq = a.find('=');
    std::string flag = a.substr(0, eq);
    if (std::find(names.begin(), names.end(), flag) != names.end()) continue;
    std::vector<std::string> matches;
    for (const std::string& n : names)
      if (n.rfind(flag, 0) == 0) matches.push_back(n);
    if (matches.size() > 1) {
      std::string list;
      for (const std::string& m : matches) list += (list.empty() ? "" : ", ") + m;
      return "ambiguous flag " + flag + ": it could be " + list;
    }
    if (matches.size() == 1) a = matches[0] + (eq == std::string::npos ? "" : a.substr(eq));
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln: train neural networks from C++"};
  app.require_subcommand(1);
  DemoOptions demo;
  auto* d = app.add_subcommand("demo", "train a small classifier with grad and SGD");
  d->add_option("--steps", demo.steps, "training steps")->check(kPositiveInt);
  d->add_option("--lr", demo.lr, "SGD learning rate")->check(kPositive);
  d->add_option("--mode", demo.mode, "execution mode")->check(CLI::IsMember({"eager", "lazy"}));
  d->add_option("--seed", demo.seed, "random seed");
  d->add_option("--threads", demo.threads, "CPU threads (default: all)")->check(kPositiveInt);
  auto* info = app.add_subcommand("info", "show the build, devices and libraries");

  TrainFlags tf;
  auto* t = app.add_subcommand("train",
                               "train a ViT (default: the reference experiment on random images)");
  t->add_option("--batch-size", tf.batch_size, "images per step")->check(kPositiveInt);
  t->add_option("--mode", tf.mode,
                "jit (alias jax, the default), eager (pytorch) or lazy (torch_xla)")
      ->check(CLI::IsMember({"eager", "pytorch", "lazy", "torch_xla", "jit", "jax"}));
  t->add_flag("--compile-model", tf.compile_model,
              "with --mode eager: compile forward and backward, the optimizer stays eager "
              "(lazy and jit compile the whole step already)");
  auto* model_opt =
      t->add_option("--model", tf.model, "preset")
          ->check(CLI::IsMember({"vit-tiny", "vit-small", "vit-base", "vit-large", "vit-fmnist"}));
  t->add_option("--config", tf.config, "a HuggingFace config.json instead of a preset")
      ->check(CLI::ExistingFile)
      ->excludes(model_opt);
  t->add_option(
       "--steps", tf.steps,
       "total steps, warm-up included (default: 8 for vit-base and vit-large, 20 otherwise)")
      ->check(kPositiveInt);
  t->add_option("--warmup", tf.warmup, "untimed steps at the start (default 2)")
      ->check(kNonNegativeInt);
  t->add_option("--lr", tf.lr, "learning rate (the peak, with a schedule)")->check(kNonNegative);
  t->add_option("--seed", tf.seed, "random seed for weights and data");
  t->add_option("--layout", tf.layout, "image layout")->check(CLI::IsMember({"nchw", "nhwc"}));
  t->add_option("--threads", tf.threads, "CPU threads (default: all)")->check(kPositiveInt);
  t->add_option("--log-json", tf.log_json,
                "write one JSON object per step (and per evaluation) to this file");
  t->add_option("--data", tf.data,
                "random (the reference experiment), fashion-mnist, or imagefolder:PATH "
                "(PATH/<class>/*.jpg|png; every 10th file of a class held out)")
      ->check([](const std::string& v) {
        if (v == "random" || v == "fashion-mnist") return std::string();
        if (v.rfind("imagefolder:", 0) == 0 && v.size() > 12) return std::string();
        return "'" + v + "': expected random, fashion-mnist or imagefolder:PATH";
      });
  t->add_flag("--skip-bad-images", tf.skip_bad_images,
              "imagefolder: skip files that cannot be read (counted) instead of stopping");
  t->add_option("--data-dir", tf.data_dir, "where the Fashion-MNIST IDX files are");
  t->add_flag("--augment", tf.augment,
              "random horizontal flips (fashion-mnist), random crops and flips (imagefolder)");
  t->add_option("--epochs", tf.epochs,
                "passes over the training split (sets --steps; fashion-mnist, imagefolder)")
      ->check(kPositiveInt);
  t->add_option("--optimizer", tf.optimizer, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  t->add_option("--momentum", tf.momentum, "SGD momentum")->check(kNonNegative);
  t->add_option("--weight-decay", tf.weight_decay, "weight decay (AdamW: decoupled)")
      ->check(kNonNegative);
  t->add_option("--schedule", tf.schedule, "learning rate: constant or cosine (after --lr-warmup)")
      ->check(CLI::IsMember({"constant", "cosine"}));
  t->add_option("--lr-warmup", tf.lr_warmup, "steps of linear learning-rate warm-up")
      ->check(kNonNegativeInt);
  t->add_option("--clip-norm", tf.clip_norm, "clip gradients to this global L2 norm (0: off)")
      ->check(kNonNegative);
  t->add_option("--eval-every", tf.eval_every,
                "evaluate on the test split every N steps (always at the end)")
      ->check(kNonNegativeInt);
  t->add_option("--save", tf.save,
                "checkpoint directory (transformers-loadable), written at the end");
  t->add_option("--save-every", tf.save_every, "also save every N steps")->check(kNonNegativeInt);
  t->add_option("--resume", tf.resume, "continue from this checkpoint directory")
      ->check(CLI::ExistingDirectory);
  t->add_option("--precision", tf.precision,
                "fp32, bf16 (mixed: bf16 matmul operands, f32 master weights), tf32 (CUDA only)")
      ->check(CLI::IsMember({"fp32", "bf16", "tf32"}));
  t->add_option("--attention", tf.attention,
                "fused (one kernel per layer, forward and backward) or unfused (as transformers' "
                "eager attention)")
      ->check(CLI::IsMember({"fused", "unfused"}));
  t->add_option("--print-every", tf.print_every,
                "without a terminal: print every N steps (default: steps / 50)")
      ->check(kPositiveInt);

  EvalFlags ef;
  auto* e = app.add_subcommand("eval", "loss and top-1 accuracy of a checkpoint on a data set");
  e->add_option("--checkpoint", ef.checkpoint, "directory written by kiln train --save")
      ->required();
  e->add_option("--data", ef.data, "fashion-mnist or imagefolder:PATH");
  e->add_option("--data-dir", ef.data_dir, "where the Fashion-MNIST IDX files are");
  e->add_option("--split", ef.split,
                "test (fashion-mnist's test split, an image folder's held-out files) or train")
      ->check(CLI::IsMember({"test", "train"}));
  e->add_option("--batch-size", ef.batch_size, "images per batch")->check(kPositiveInt);
  e->add_option("--mode", ef.mode, "eager or jit")->check(CLI::IsMember({"eager", "jit"}));
  e->add_option("--layout", ef.layout, "image layout")->check(CLI::IsMember({"nchw", "nhwc"}));

  std::string plot_log, plot_out;
  auto* pl = app.add_subcommand("plot", "draw loss and accuracy curves of a --log-json file");
  pl->add_option("log", plot_log, "the JSON-lines log of kiln train --log-json")
      ->required()
      ->check(CLI::ExistingFile);
  pl->add_option("-o,--out", plot_out, "output .png or .svg file")->required();

  GradFlags gf;
  auto* g = app.add_subcommand("grad",
                               "one forward and backward pass; writes logits, loss and gradients");
  g->add_option("--config", gf.config, "HuggingFace config.json")
      ->required()
      ->check(CLI::ExistingFile);
  g->add_option("--weights", gf.weights, "model.safetensors with HuggingFace names")
      ->required()
      ->check(CLI::ExistingFile);
  g->add_option("--batch", gf.batch,
                "safetensors with pixel_values and labels (integer classes, or float targets for "
                "regression and multi-label problem types)")
      ->required()
      ->check(CLI::ExistingFile);
  g->add_option("--out", gf.out, "output safetensors")->required();
  g->add_option("--layout", gf.layout, "layout of pixel_values")
      ->check(CLI::IsMember({"nchw", "nhwc"}));

  if (argc > 1 && argv[1][0] != '-') {
    std::string cmd = argv[1];
    bool known = false;
    for (auto* sub : app.get_subcommands({})) known |= sub->get_name() == cmd;
    if (!known) {
      std::fprintf(
          stderr,
          "kiln: unknown command '%s'; expected one of train, eval, plot, grad, demo, info\n",
          cmd.c_str());
      return 2;
    }
  }
  // Long flags may be abbreviated to any unique prefix, as argparse (the
  // reference script's parser) allows: `--batch 64`, `--compile`.
  std::vector<std::string> args(argv, argv + argc);
  if (argc > 1)
    for (auto* sub : app.get_subcommands({}))
      if (sub->get_name() == args[1]) {
        std::string error = expand_abbreviations(*sub, args);
        if (!error.empty()) {
          std::fprintf(stderr, "kiln %s: %s\n", args[1].c_str(), error.c_str());
          return 2;
        }
      }
  std::vector<char*> expanded;
  for (auto& a : args) expanded.push_back(a.data());
  CLI11_PARSE(app, argc, expanded.data());
  try {
    if (t->parsed()) return run_train(tf);
    if (e->parsed()) return run_eval(ef);
    if (pl->parsed()) {
      train::plot_log(plot_log, plot_out);
      std::printf("wrote %s\n", plot_out.c_str());
      return 0;
    }
    if (g->parsed()) return run_grad(gf);
    if (d->parsed()) return run_demo(demo);
    if (info->parsed()) return run_info();
  } catch (const Error& e) {
    if (::isatty(STDOUT_FILENO)) std::printf("\n");
    std::fprintf(stderr, "kiln: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    // A library's own exception that no check turned into a kiln error: still
    // a message and an exit code, not an abort (and a bug to report).
    if (::isatty(STDOUT_FILENO)) std::printf("\n");
    std::fprintf(stderr, "kiln: unexpected error (please report): %s\n", e.what());
    return 1;
  }
  return 0;
}
