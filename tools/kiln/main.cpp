// kiln — the command line: runs what command_line.cpp parsed and checked
// (kiln train: the run's description, its progress and its report).
//   kiln demo [--steps N] [--lr X] [--mode eager|lazy] [--seed S] [--threads T]
//   kiln train [--batch-size N] [--mode eager|pytorch] [--model NAME | --config PATH] ...
//   kiln eval --checkpoint DIR [--data fashion-mnist]
//   kiln predict --model SRC [--top-k K] [--json] FILE|DIR...
//   kiln generate --model SRC --prompt TEXT [--max-new-tokens N] [--temperature T] ...
//   kiln plot LOG.jsonl -o curves.png (or .svg)
//   kiln grad --config C.json --weights W.safetensors --batch B.safetensors --out O.safetensors
//   kiln info
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <vector>

#include "command_line.h"
#include "kiln/distributed.h"
#include "kiln/gpt2.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/tokenizer.h"
#include "kiln/train.h"
#include "peak.h"
#include "plot.h"

using namespace kiln;

namespace {

// A small classifier trained with grad + SGD on a synthetic task: 4 Gaussian
// clusters in 16 dimensions, 512 samples, MLP 16 -> 64 (GELU, LayerNorm) -> 4.
int run_demo(const cli::DemoOptions& o) {
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
  std::printf("bf16 GEMM: %s\n",
              cpu_bf16_gemm_native()
                  ? ("oneDNN on " + cpu_bf16_gemm_unit()).c_str()
                  : "no bf16 unit on this CPU: bf16 operands widened to f32 by kiln");
  std::string devices = "cpu, ref";
  for (int i = 0; i < cuda_device_count(); ++i)
    devices += ", cuda:" + std::to_string(i) + " (" + device_name(Device::cuda(i)) + ")";
  std::printf("devices:  %s\n", devices.c_str());
  if (cuda_device_count() == 0) std::printf("CUDA:     %s\n", cuda_unavailable_reason().c_str());
  return 0;
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 1 ? "%.1f ms" : "%.3f s", s < 1 ? s * 1e3 : s);
  return buf;
}

std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The image data line of print_description.
void print_image_data(const train::TrainConfig& cfg, const std::string& opt) {
  // The data sets' labels are classes; other problem types learn targets made from them.
  nn::ProblemType problem = cfg.model->problem_for(DType::i32);
  const nn::Size2d size = train::data_image_size(cfg, *cfg.model);
  std::string loss = problem == nn::ProblemType::SingleLabel
                         ? ""
                         : std::string(" (") + nn::problem_type_name(problem) + ")";
  std::printf("batch size %lld, %lldx%lld images (%s) of %s, %lld labels%s, %s lr %g, seed %llu\n",
              (long long)cfg.batch_size, (long long)size.height, (long long)size.width,
              cfg.layout == nn::Layout::NHWC ? "NHWC" : "NCHW",
              cfg.data == "random" ? "random data" : cfg.data.c_str(),
              (long long)cfg.model->num_labels(), loss.c_str(), opt.c_str(), cfg.lr,
              (unsigned long long)cfg.seed);
}

// The three lines after the reference script's: mode and model; batch, data
// and optimizer; device, precision and schedule.
void print_description(const train::TrainConfig& cfg) {
  int64_t params = 0;
  for (auto& [name, shape] : cfg.model->parameter_shapes()) params += numel(shape);
  std::printf("kiln train: mode %s (%s)%s, model %s, %.1fM parameters\n",
              train::mode_name(cfg.mode).c_str(), train::mode_alias(cfg.mode).c_str(),
              cfg.compile_model ? " with --compile-model" : "", cfg.model_name.c_str(),
              params / 1e6);
  std::string opt = cfg.optimizer == "sgd" ? "SGD" : "AdamW";
  if (cfg.momentum != 0) opt += " momentum " + fmt_g(cfg.momentum);
  if (cfg.weight_decay != 0) opt += " weight decay " + fmt_g(cfg.weight_decay);
  if (cfg.schedule != "constant" || cfg.lr_warmup > 0)
    opt += ", " + std::to_string(cfg.lr_warmup) + " warm-up steps then " + cfg.schedule;
  if (cfg.clip_norm > 0) opt += ", gradients clipped to norm " + fmt_g(cfg.clip_norm);
  if (cfg.model->causal_lm()) {
    const std::string seq =
        cfg.seq_len > 0 ? std::to_string(cfg.seq_len) + " tokens" : "n_positions tokens";
    std::printf("batch size %lld, blocks of %s of %s, next-token loss, %s lr %g, seed %llu\n",
                (long long)cfg.batch_size, seq.c_str(), cfg.data.c_str(), opt.c_str(), cfg.lr,
                (unsigned long long)cfg.seed);
  } else {
    print_image_data(cfg, opt);
  }
  if (dist::size() > 1)
    std::printf(
        "data-parallel: %d ranks, %lld samples of each batch per rank, gradients "
        "averaged in buckets of %g MB on %s\n",
        dist::size(), (long long)(cfg.batch_size / dist::size()), cfg.bucket_mb,
        dist::library().c_str());
  std::string precision = "fp32";
  if (cfg.precision == "bf16")
    precision = cpu_bf16_gemm_native() ? "bf16 mixed precision"
                                       : "bf16 mixed precision (this CPU has no bf16 GEMM: the "
                                         "bf16-rounded operands are multiplied in f32)";
  const Device device = parse_device(cfg.device, "--device");
  if (device.type == DeviceType::cpu)
    std::printf(
        "device cpu (%s), %d threads, %s, f32 GEMMs on %s; %lld steps, the first %lld "
        "untimed\n",
        cpu_gemm_isa().c_str(), num_threads(), precision.c_str(), cpu_gemm_library().c_str(),
        (long long)cfg.steps, (long long)cfg.warmup);
  else
    std::printf("device %s (%s), %s; %lld steps, the first %lld untimed\n", device.str().c_str(),
                device.type == DeviceType::ref ? "the reference backend: plain loops in f64"
                                               : device_name(device).c_str(),
                cfg.precision == "bf16" ? "bf16 mixed precision" : cfg.precision.c_str(),
                (long long)cfg.steps, (long long)cfg.warmup);
  std::fflush(stdout);
}

// The tokens of a sample of a language model's run (its blocks of --seq-len,
// default n_positions); 0 for an image model.
int64_t tokens_per_sample(const train::TrainConfig& cfg) {
  if (!cfg.model || !cfg.model->causal_lm()) return 0;
  if (cfg.seq_len > 0) return cfg.seq_len;
  const nn::GPT2LMHeadModel* lm = nn::as_gpt2(*cfg.model);
  return lm ? lm->config().n_positions : 0;
}

// What the run shows while it goes: on a terminal a progress bar that
// rewrites one line, otherwise a line every `print_every` steps; evaluations
// and saves on lines of their own.
class Progress {
 public:
  Progress(const train::TrainConfig& cfg, int64_t print_every)
      : cfg_(cfg), print_every_(print_every), tty_(::isatty(STDOUT_FILENO)) {}

  void started() const {
    // The first step also touches all memory (and compiles): say it started.
    if (!tty_) return;
    std::printf("step 0/%lld  first step running", (long long)cfg_.steps);
    std::fflush(stdout);
  }

  void on_step(const train::StepTiming& s) {
    elapsed_ += s.seconds;
    ++done_;
    if (first_ < 0) first_ = s.step;
    double eta = elapsed_ / done_ * (cfg_.steps - s.step);
    bool untimed = s.step < first_ + cfg_.warmup;
    if (tty_) {
      const int width = 20;
      int filled = static_cast<int>(width * s.step / cfg_.steps);
      std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
      std::string acc =
          last_acc_ >= 0 ? "  acc " + fmt_g(std::round(1000 * last_acc_) / 10) + "%" : "";
      const int64_t tokens = tokens_per_sample(cfg_);
      const double rate = cfg_.batch_size * std::max<int64_t>(tokens, 1) / s.seconds;
      std::printf("\r\033[K[%s] step %lld/%lld  loss %.4f%s  %.*f %s  ETA %s", bar.c_str(),
                  (long long)s.step, (long long)cfg_.steps, s.loss, acc.c_str(), tokens ? 0 : 1,
                  rate, tokens ? "tok/s" : "img/s", fmt_seconds(eta).c_str());
      if (s.step == cfg_.steps) std::printf("\n");
    } else if (s.step % print_every_ == 0 || s.step == first_ || s.step == cfg_.steps) {
      std::printf("step %lld/%lld  loss %.4f  lr %.3g  %s%s\n", (long long)s.step,
                  (long long)cfg_.steps, s.loss, s.lr, fmt_seconds(s.seconds).c_str(),
                  untimed ? "  (untimed)" : "");
    }
    std::fflush(stdout);
  }

  void on_eval(const train::EvalResult& e) {
    last_acc_ = e.accuracy;
    if (cfg_.model->causal_lm()) {
      std::printf(
          "%seval at step %lld: loss %.4f (perplexity %.2f), next-token accuracy %.2f%% (top-5 "
          "%.2f%%) on %lld held-out tokens (%s)\n",
          tty_ && e.step != cfg_.steps ? "\r\033[K" : "", (long long)e.step, e.loss,
          std::exp(e.loss), 100 * e.accuracy, 100 * e.top5, (long long)e.tokens,
          fmt_seconds(e.seconds).c_str());
      std::fflush(stdout);
      return;
    }
    std::printf(
        "%seval at step %lld: loss %.4f, accuracy %.2f%% on %lld %s images (top-5 %.2f%%, %s)\n",
        tty_ && e.step != cfg_.steps ? "\r\033[K" : "", (long long)e.step, e.loss, 100 * e.accuracy,
        (long long)e.samples, cfg_.data == "fashion-mnist" ? "test" : "held-out", 100 * e.top5,
        fmt_seconds(e.seconds).c_str());
    if (e.has_ema)
      std::printf("  moving average of the weights: loss %.4f, accuracy %.2f%% (top-5 %.2f%%)\n",
                  e.ema_loss, 100 * e.ema_accuracy, 100 * e.ema_top5);
    std::fflush(stdout);
  }

  void on_save(int64_t step, const std::string& dir) const {
    std::printf("%ssaved step %lld to %s\n", tty_ && step != cfg_.steps ? "\r\033[K" : "",
                (long long)step, dir.c_str());
    std::fflush(stdout);
  }

 private:
  const train::TrainConfig& cfg_;
  const int64_t print_every_;
  const bool tty_;
  double elapsed_ = 0, last_acc_ = -1;
  int64_t done_ = 0, first_ = -1;
};

// The summary after the run: step times, throughput, compilations, FLOP
// utilization, the last evaluation.
void print_report(const train::TrainConfig& cfg, const train::TrainReport& r) {
  std::printf("average step time: %.6f\n", r.mean);
  std::printf("median %s, p90 %s, min %s, max %s over %lld timed steps\n",
              fmt_seconds(r.median).c_str(), fmt_seconds(r.p90).c_str(), fmt_seconds(r.min).c_str(),
              fmt_seconds(r.max).c_str(),
              (long long)std::max<int64_t>(1, cfg.steps - r.first_step + 1 - cfg.warmup));
  if (const int64_t tokens = tokens_per_sample(cfg))
    std::printf("%.0f tokens/s (%.2f blocks of %lld), ", r.images_per_second * tokens,
                r.images_per_second, (long long)tokens);
  else
    std::printf("%.2f images/s, ", r.images_per_second);
  std::printf("data wait %.1f%% of the step, first step %s, peak RSS %.0f MiB\n",
              100 * r.data_wait_share, fmt_seconds(r.first_step_seconds).c_str(), r.peak_rss_mib);
  if (r.peak_device_mib > 0)
    std::printf("peak device memory %.0f MiB (kiln's allocator on %s)\n", r.peak_device_mib,
                cfg.device.c_str());
  const bool compiled = cfg.mode != train::Mode::eager || cfg.compile_model;
  if (compiled)
    std::printf(
        "time to first step %s (compile %.0f ms); %llu compilation%s; arena %.0f MiB for "
        "%.0f MiB of intermediates%s\n",
        fmt_seconds(r.first_step_seconds).c_str(), r.compile_ms, (unsigned long long)r.compiles,
        r.compiles == 1 ? "" : "s", r.arena_bytes / 1048576.0, r.intermediate_bytes / 1048576.0,
        r.replays ? ("; " + std::to_string(r.replays) + " steps replayed as one graph").c_str()
                  : "");
  if (r.peak_gflops > 0)
    std::printf(
        "model FLOP utilization %.1f%%: %.0f of %.0f GFLOP/s (%.1f GFLOP per step; peak "
        "measured by %s on all threads)\n",
        100 * r.mfu, r.achieved_gflops, r.peak_gflops, r.flops_per_step / 1e9,
        tools::peak_description(cfg.precision == "bf16").c_str());
  if (r.ranks > 1)
    std::printf(
        "gradient all-reduces: %llu of %.1f MB in the timed steps, %s in all, of which "
        "%s (%.0f%%) not hidden behind the backward (per step: %s exposed)\n",
        (unsigned long long)r.all_reduces, r.all_reduce_bytes / 1e6,
        fmt_seconds(r.all_reduce_seconds).c_str(),
        fmt_seconds(r.all_reduce_exposed_seconds).c_str(),
        r.all_reduce_seconds > 0 ? 100 * r.all_reduce_exposed_seconds / r.all_reduce_seconds : 0.0,
        fmt_seconds(r.all_reduce_exposed_seconds /
                    std::max<int64_t>(1, cfg.steps - r.first_step + 1 - cfg.warmup))
            .c_str());
  if (r.skipped_images)
    std::printf("skipped %lld unreadable image files (--skip-bad-images)\n",
                (long long)r.skipped_images);
  if (!r.evals.empty() && cfg.model->causal_lm())
    std::printf(
        "final held-out loss %.4f (perplexity %.2f, next-token accuracy %.2f%%) after %lld "
        "steps; wall time %.1f s\n",
        r.evals.back().loss, std::exp(r.evals.back().loss), 100 * r.evals.back().accuracy,
        (long long)cfg.steps, r.wall_seconds);
  else if (!r.evals.empty())
    std::printf("final %s accuracy %.2f%% (loss %.4f) after %lld steps; wall time %.1f s\n",
                cfg.data == "fashion-mnist" ? "test" : "held-out", 100 * r.evals.back().accuracy,
                r.evals.back().loss, (long long)cfg.steps, r.wall_seconds);
  if (!r.evals.empty() && compiled)
    std::printf("eval compiles: %llu (one per batch shape; %zu evaluation%s)\n",
                (unsigned long long)r.eval_compiles, r.evals.size(),
                r.evals.size() == 1 ? "" : "s");
  if (kernel_profile_enabled()) std::printf("%s", kernel_profile_report().c_str());
}

// A model without preprocessor_config.json is used with ViTImageProcessor's
// defaults at its image size: say so.
void print_processor_note(const char* flag, const std::string& src, const io::Pretrained& m,
                          FILE* to) {
  if (m.has_processor) return;
  std::fprintf(
      to,
      "%s %s: no preprocessor_config.json in %s: ViTImageProcessor's defaults at the model's "
      "image size (resize to %s, bilinear, rescale 1/255, normalize with mean 0.5 and std 0.5)\n",
      flag, src.c_str(), m.dir.c_str(), nn::to_string(m.processor.size).c_str());
}

int run_train(const cli::TrainFlags& f) {
  // A data-parallel run (mpirun -np N): only rank 0 prints and writes.
  dist::init();
  if (dist::rank() != 0 && !std::freopen("/dev/null", "w", stdout))
    fail("train", "rank " + std::to_string(dist::rank()) + ": cannot silence stdout");
  // The reference script's first three lines, byte for byte (Python's
  // f"Mode: {mode} \n" f"Batch size: {batch_size} \n" f"Compile model: {compile_model}"),
  // so that runs of both can be compared by grepping them.
  std::printf("Mode: %s \nBatch size: %lld \nCompile model: %s\n", f.mode.c_str(),
              (long long)f.config.batch_size, f.config.compile_model ? "True" : "False");
  std::fflush(stdout);
  if (f.threads > 0) set_num_threads(f.threads);
  train::Setup setup = cli::prepare_train(f);
  train::TrainConfig& cfg = setup.config;
  std::optional<io::Checkpoint>& resumed = setup.resumed;
  std::optional<io::Pretrained>& init = setup.init;
  print_description(cfg);
  if (resumed && !cfg.init_from.empty())
    std::printf("--init-from %s: not read (the run continues from --resume %s)\n",
                cfg.init_from.c_str(), cfg.resume_dir.c_str());
  if (init) {
    for (const std::string& note : init->notes)
      std::printf("--init-from %s: %s\n", cfg.init_from.c_str(), note.c_str());
    if (train::data_processor(cfg, *cfg.model, std::nullopt))  // an RGB image folder
      print_processor_note("--init-from", cfg.init_from, *init, stdout);
  }
  int64_t print_every = f.print_every > 0 ? f.print_every : std::max<int64_t>(1, cfg.steps / 50);
  Progress progress(cfg, print_every);
  progress.started();
  train::Callbacks callbacks{
      .on_data =
          [&](const std::string& d) {
            if (d.empty()) return;
            std::printf("%s\n", d.c_str());
            std::fflush(stdout);
          },
      .on_step = [&](const train::StepTiming& s) { progress.on_step(s); },
      .on_eval = [&](const train::EvalResult& e) { progress.on_eval(e); },
      .on_save = [&](int64_t step, const std::string& dir) { progress.on_save(step, dir); },
      // The FMA-loop peak is the CPU's: MFU is reported for the cpu device
      // only (on a GPU, bench/compare.py takes the measured matmul rate).
      .peak_gflops = parse_device(cfg.device) == Device::cpu()
                         ? std::function<double()>([bf16 = cfg.precision == "bf16"] {
                             return tools::measure_peak_gflops(bf16);
                           })
                         : std::function<double()>()};
  print_report(cfg, train::run(cfg, std::move(resumed), callbacks, std::move(init)));
  return 0;
}

int run_eval(const cli::EvalFlags& f) {
  if (!f.image_size.empty() && f.model.empty())
    fail("eval", "--image-size goes with --model (a checkpoint is evaluated at its own size)");
  if (f.checkpoint.empty() == f.model.empty())
    fail("eval",
         "give --checkpoint DIR (written by kiln train --save) or --model SRC (a pretrained "
         "model: a folder that transformers saved, or a Hub id)");
  // A pretrained model is evaluated as it is: its labels must be the data's.
  io::Checkpoint ck;
  std::string what = f.checkpoint;
  std::optional<data::ImageProcessor> processor;
  if (!f.model.empty()) {
    const auto presets = nn::model_presets();
    if (std::find(presets.begin(), presets.end(), f.model) != presets.end())
      fail("eval", "--model " + f.model +
                       " is a preset (kiln train --model); eval --model takes "
                       "a pretrained model: a folder that transformers saved, or a Hub id");
    io::Pretrained m = io::load_pretrained(f.model);
    if (!f.image_size.empty()) io::set_image_size(m, *cli::parse_image_size(f.image_size));
    if (!m.has_classifier && !m.model->causal_lm())
      fail("eval", "--model " + f.model +
                       ": no classifier (a ViTModel checkpoint): fine-tune it "
                       "first (kiln train --init-from " +
                       f.model + " --data ...)");
    for (const std::string& note : m.notes)
      std::printf("--model %s: %s\n", f.model.c_str(), note.c_str());
    if (!m.model->causal_lm()) print_processor_note("--model", f.model, m, stdout);
    ck.model = m.model;
    ck.params = std::move(m.params);
    ck.model_state = std::move(m.state);
    processor = m.processor;
    what = f.model;
  } else {
    ck = io::load_checkpoint(f.checkpoint);
    processor = ck.processor;
    what += " (step " + std::to_string(ck.state.step) + ")";
  }
  train::TrainConfig cfg;
  cfg.model = ck.model;
  cfg.data = f.data;
  cfg.data_dir = f.data_dir;
  cfg.layout = f.layout == "nhwc" ? nn::Layout::NHWC : nn::Layout::NCHW;
  // A language model: the next token's loss, perplexity and accuracy on text
  // or token data (the held-out blocks, as kiln train's evaluation), with the
  // folder's tokenizer.
  const bool lm = cfg.model->causal_lm();
  if (!lm && (f.seq_len > 0 || !f.tokenizer.empty()))
    fail("eval", std::string(f.seq_len > 0 ? "--seq-len" : "--tokenizer") + " goes with a " +
                     "language model; " + what + " is " + cfg.model->architecture());
  if (lm) {
    cfg.seq_len = f.seq_len;
    cfg.tokenizer = !f.tokenizer.empty()    ? f.tokenizer
                    : !f.checkpoint.empty() ? f.checkpoint
                                            : io::resolve_model_source(f.model);
  } else {
    const std::vector<std::string> labels = train::data_labels(cfg);
    const std::vector<std::string> names = cfg.model->label_names();
    if (labels.size() == names.size())
      for (size_t i = 0; i < names.size(); ++i)
        if (names[i] != labels[i] && names[i] != "LABEL_" + std::to_string(i)) {
          std::printf(
              "note: the model's label %lld is '%s', the data's '%s' (label i is counted as "
              "class i)\n",
              (long long)i, names[i].c_str(), labels[i].c_str());
          break;
        }
  }
  train::DataSplits splits = train::load_data(cfg, lm ? std::nullopt : processor);
  if (lm) std::printf("%s\n", splits.description.c_str());
  auto ds = f.split == "train" ? splits.train : splits.eval;
  if (!ds)
    fail("eval", "--data " + f.data +
                     (lm ? " has no held-out blocks"
                         : " has no held-out split (an image folder needs 10 or more files per "
                           "class)"));
  ds = train::spread_examples(ds, f.samples);
  const Device device = parse_device(f.device, "--device");
  for (auto& [name, p] : ck.params) p = p.to(device);
  for (auto& [name, v] : ck.model_state) v = v.to(device);
  auto r = train::evaluate(cfg.model, ck.params, ck.model_state, *ds,
                           f.batch_size > 0 ? f.batch_size
                           : lm             ? 8
                                            : 256,
                           cfg.layout, f.mode != "eager");
  if (lm) {
    std::printf(
        "%s on %s %s: loss %.4f (perplexity %.2f), next-token accuracy %.2f%% (top-5 %.2f%%) on "
        "%lld tokens (%s)\n",
        what.c_str(), f.data.c_str(), f.split == "train" ? "train" : "held-out", r.loss,
        std::exp(r.loss), 100 * r.accuracy, 100 * r.top5, (long long)r.tokens,
        fmt_seconds(r.seconds).c_str());
    return 0;
  }
  std::printf("%s on %s %s: loss %.4f, accuracy %.2f%% (%lld images, top-5 %.2f%%, %s)\n",
              what.c_str(), f.data.c_str(),
              f.split == "train"          ? "train"
              : f.data == "fashion-mnist" ? "test"
                                          : "held-out",
              r.loss, 100 * r.accuracy, (long long)r.samples, 100 * r.top5,
              fmt_seconds(r.seconds).c_str());
  return 0;
}

// kiln predict: one line per image, in the order given (folders sorted);
// notes and the summary on stderr, so that --json's output is JSON lines only.
int run_predict(const cli::PredictFlags& f) {
  if (f.threads > 0) set_num_threads(f.threads);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> files = data::ImageFiles::find(f.inputs);
  io::Pretrained m = io::load_pretrained(f.model);
  if (!f.image_size.empty()) io::set_image_size(m, *cli::parse_image_size(f.image_size));
  for (const std::string& note : m.notes)
    std::fprintf(stderr, "--model %s: %s\n", f.model.c_str(), note.c_str());
  print_processor_note("--model", f.model, m, stderr);
  if (!m.has_classifier)
    fail(
        "predict",
        "--model " + f.model +
            ": no classifier (a ViTModel checkpoint): fine-tune it first (kiln train --init-from " +
            f.model + " --data ...)");
  const int64_t channels = m.model->num_channels();
  if (channels != 3 && channels != 1)
    fail("predict", "--model " + f.model + " takes " + std::to_string(channels) +
                        "-channel images; predict reads RGB (num_channels 3) or greyscale "
                        "(num_channels 1) images");
  const Device device = parse_device(f.device, "--device");
  for (auto& [name, p] : m.params) p = p.to(device);
  // A ViT takes its own size; a convolutional model the processor's output.
  const data::ImageProcessor& pp = m.processor;
  const nn::Size2d size = m.model->fixed_image_size()         ? m.model->image_size()
                          : pp.do_center_crop                 ? pp.crop_size
                          : pp.do_resize && !pp.shortest_edge ? pp.size
                                                              : m.model->image_size();
  data::ImageFiles images(files, m.processor, size, channels);
  train::PredictOptions opt{.batch_size = f.batch_size,
                            .top_k = f.top_k,
                            .compiled = f.mode == "jit",
                            .workers = f.workers,
                            .matmul_dtype = train::matmul_dtype_for(f.precision)};
  int64_t done = 0;
  const int64_t failed =
      train::predict(*m.model, m.params, m.state, images, opt, [&](const train::Prediction& p) {
        ++done;
        if (!p.error.empty()) std::fprintf(stderr, "kiln predict: %s\n", p.error.c_str());
        if (f.json) {
          nlohmann::ordered_json j{{"file", p.file}};
          if (!p.error.empty()) {
            j["error"] = p.error;
          } else {
            j["predictions"] = nlohmann::ordered_json::array();
            for (const auto& [label, score] : p.top)
              j["predictions"].push_back({{"label", label}, {"score", score}});
          }
          std::printf("%s\n",
                      j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
        } else if (p.error.empty()) {
          std::string line = p.file + ":";
          for (size_t i = 0; i < p.top.size(); ++i) {
            char score[32];
            std::snprintf(score, sizeof score, " (%.4f)", p.top[i].second);
            line += (i ? ", " : " ") + p.top[i].first + score;
          }
          std::printf("%s\n", line.c_str());
        }
        std::fflush(stdout);
      });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "kiln predict: %lld images in %s (%.1f images/s, %s, %s)%s\n",
               (long long)done, fmt_seconds(seconds).c_str(), done / seconds, f.mode.c_str(),
               train::score_function(*m.model).c_str(),
               failed ? (", " + std::to_string(failed) + " failed").c_str() : "");
  if (kernel_profile_enabled()) std::fprintf(stderr, "%s", kernel_profile_report().c_str());
  return failed ? 1 : 0;
}

// kiln generate: the prompt and its continuation on stdout, the rest on stderr.
int run_generate(const cli::GenerateFlags& f) {
  if (f.threads > 0) set_num_threads(f.threads);
  io::Pretrained m = io::load_pretrained(f.model);
  for (const std::string& note : m.notes)
    std::fprintf(stderr, "--model %s: %s\n", f.model.c_str(), note.c_str());
  const nn::GPT2LMHeadModel* lm = nn::as_gpt2(*m.model);
  if (!lm)
    fail("generate", "--model " + f.model + " is a " + m.model->architecture() +
                         "; generate takes a language model (GPT2LMHeadModel)");
  const std::string tok_dir = f.tokenizer.empty() ? m.dir : f.tokenizer;
  const data::Tokenizer tok = data::Tokenizer::from_folder(tok_dir);
  if (tok.vocab_size() > lm->config().vocab_size)
    fail("generate", "the tokenizer of " + tok_dir + " has " + std::to_string(tok.vocab_size()) +
                         " tokens, more than the model's vocab_size " +
                         std::to_string(lm->config().vocab_size));
  const std::vector<int32_t> ids = tok.encode(f.prompt);
  if (ids.empty()) fail("generate", "--prompt is empty: there is nothing to continue");
  const Device device = parse_device(f.device, "--device");
  for (auto& [name, p] : m.params) p = p.to(device);
  const int64_t eos = f.ignore_eos ? -1 : lm->config().eos_token_id;
  const nn::GenerateOptions opt{.max_new_tokens = f.max_new_tokens,
                                .temperature = f.temperature,
                                .top_k = f.top_k,
                                .top_p = f.top_p,
                                .seed = f.seed,
                                .eos_token_id = eos,
                                .pad_token_id = eos >= 0 ? eos : 0,
                                .matmul_dtype = train::matmul_dtype_for(f.precision),
                                .compiled = f.mode == "jit"};
  const Array prompt = Array::from_vector(ids, {1, static_cast<int64_t>(ids.size())}).to(device);
  const auto t0 = std::chrono::steady_clock::now();
  const Array out = nn::generate(*lm, m.params, prompt, opt);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<int32_t> all = out.to(Device::cpu()).to_vector<int32_t>();
  // A model's vocab_size may exceed its tokenizer's (padded, as GPT-2's
  // 50257 to 50304): ids beyond the tokenizer have no text and are left out,
  // as transformers' decode leaves them out.
  std::vector<int32_t> known;
  int64_t beyond = 0;
  for (int32_t id : all) {
    if (id < tok.vocab_size())
      known.push_back(id);
    else
      ++beyond;
  }
  std::printf("%s\n", tok.decode(known).c_str());
  if (beyond > 0)
    std::fprintf(stderr,
                 "kiln generate: %lld generated ids are beyond the tokenizer's %lld tokens (the "
                 "model's vocab_size is %lld): they have no text and are left out\n",
                 (long long)beyond, (long long)tok.vocab_size(),
                 (long long)lm->config().vocab_size);
  const int64_t added = static_cast<int64_t>(all.size() - ids.size());
  std::fprintf(stderr, "kiln generate: %zu prompt tokens, %lld new in %s (%.1f tokens/s, %s, %s)\n",
               ids.size(), (long long)added, fmt_seconds(seconds).c_str(),
               seconds > 0 ? static_cast<double>(added) / seconds : 0.0, f.mode.c_str(),
               f.temperature == 0 ? "greedy" : "sampled");
  return 0;
}

int run_grad(const cli::GradFlags& f) {
  // Any registered model type: config.json's model_type picks the family.
  const std::shared_ptr<const nn::Model> model = io::load_model_config(f.config);
  Params weights = io::load_safetensors(f.weights).tensors;
  Params batch = io::load_safetensors(f.batch).tensors;
  // A language model reads input_ids, and labels (input_ids when absent, as
  // transformers' causal LMs are trained); an image model pixel_values and labels.
  const bool lm = model->causal_lm();
  const std::string inputs = lm ? "input_ids" : "pixel_values";
  if (lm && !batch.count("labels") && batch.count("input_ids"))
    batch.emplace("labels", batch.at("input_ids"));
  for (const std::string& key : {inputs, std::string("labels")})
    if (!batch.count(key)) fail("grad", f.batch + ": no tensor '" + key + "'");
  // Computed on --device; the results are written from the host.
  const Device device = parse_device(f.device, "--device");
  for (auto& [name, w] : weights) w = w.to(device);
  auto r = train::forward_backward(*model, weights, batch.at(inputs).to(device),
                                   batch.at("labels").to(device),
                                   f.layout == "nhwc" ? nn::Layout::NHWC : nn::Layout::NCHW);
  Params out{{"logits", r.logits}, {"loss", r.loss}};
  for (auto& [name, g] : r.grads) out.emplace("grad." + name, g);
  for (auto& [name, s] : r.state) out.emplace("state." + name, s);
  io::save_safetensors(f.out, out);
  std::printf(
      "loss %.6f; wrote logits, loss, %zu gradients%s to %s\n", r.loss.item<float>(),
      r.grads.size(),
      r.state.empty() ? "" : (" and " + std::to_string(r.state.size()) + " state entries").c_str(),
      f.out.c_str());
  return 0;
}

// "rank N: " in a data-parallel run, where every rank's errors reach the terminal.
std::string rank_prefix() {
  return dist::size() > 1 ? "rank " + std::to_string(dist::rank()) + ": " : "";
}

// After an error in a data-parallel run the other ranks would wait for this
// one at their next collective: stop them all now.
void stop_the_group() {
  std::fflush(stdout);
  std::fflush(stderr);
  if (dist::size() > 1) dist::abort(1);
}

}  // namespace

int main(int argc, char** argv) {
  cli::CommandLine cl =
      cli::parse_command_line(std::vector<std::string>(argv, argv + argc), std::cout, std::cerr);
  try {
    switch (cl.command) {
      case cli::Command::train: return run_train(cl.train);
      case cli::Command::eval: return run_eval(cl.eval);
      case cli::Command::predict: return run_predict(cl.predict);
      case cli::Command::generate: return run_generate(cl.generate);
      case cli::Command::plot:
        tools::plot_log(cl.plot.log, cl.plot.out);
        std::printf("wrote %s\n", cl.plot.out.c_str());
        return 0;
      case cli::Command::grad: return run_grad(cl.grad);
      case cli::Command::demo: return run_demo(cl.demo);
      case cli::Command::info: return run_info();
      case cli::Command::none: return cl.exit_code;
    }
  } catch (const Error& e) {
    if (::isatty(STDOUT_FILENO)) std::printf("\n");
    std::fprintf(stderr, "kiln: %s%s\n", rank_prefix().c_str(), e.what());
    stop_the_group();
    return 1;
  } catch (const std::exception& e) {
    // A library's own exception that no check turned into a kiln error: still
    // a message and an exit code, not an abort (and a bug to report).
    if (::isatty(STDOUT_FILENO)) std::printf("\n");
    std::fprintf(stderr, "kiln: %sunexpected error (please report): %s\n", rank_prefix().c_str(),
                 e.what());
    stop_the_group();
    return 1;
  }
  return 0;
}
