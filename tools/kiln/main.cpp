// kiln — the command line.
//   kiln demo [--steps N] [--lr X] [--mode eager|lazy] [--seed S] [--threads T]
//   kiln train [--batch-size N] [--mode eager|pytorch] [--model NAME | --config PATH] ...
//   kiln grad --config C.json --weights W.safetensors --batch B.safetensors --out O.safetensors
//   kiln info
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
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
  std::printf("devices:  cpu\n");
  return 0;
}

struct TrainFlags {
  int64_t batch_size = 32;
  std::string mode = "eager";
  bool compile_model = false;
  std::string model = "vit-base";
  std::string config;
  int64_t steps = -1, warmup = -1;
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string layout = "nchw";
  int threads = 0;
  std::string log_json;
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
  if (f.mode == "pytorch") f.mode = "eager";
  if (f.mode == "torch_xla") f.mode = "lazy";
  if (f.mode == "jax") f.mode = "jit";
  if (f.compile_model && f.mode != "eager")
    fail("train",
         "--compile-model goes with --mode eager (alias pytorch); lazy and jit compile "
         "the whole step already");
  if (f.threads > 0) set_num_threads(f.threads);
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
  bool tty = ::isatty(STDOUT_FILENO);
  int64_t params = 0;
  for (auto& [name, shape] : nn::ViTForImageClassification(cfg.model).parameter_shapes())
    params += numel(shape);

  const char* alias = f.mode == "eager" ? "pytorch" : f.mode == "lazy" ? "torch_xla" : "jax";
  std::printf("kiln train: mode %s (%s)%s, model %s, %.1fM parameters\n", f.mode.c_str(), alias,
              f.compile_model ? " with --compile-model" : "", cfg.model_name.c_str(), params / 1e6);
  std::printf("batch size %lld, %lldx%lld images (%s), %lld labels, SGD lr %g, seed %llu\n",
              (long long)cfg.batch_size, (long long)cfg.model.image_size,
              (long long)cfg.model.image_size, f.layout == "nhwc" ? "NHWC" : "NCHW",
              (long long)cfg.model.num_labels, cfg.lr, (unsigned long long)cfg.seed);
  std::printf("device cpu, %d threads; %lld steps, the first %lld untimed\n", num_threads(),
              (long long)cfg.steps, (long long)cfg.warmup);
  std::fflush(stdout);

  double elapsed = 0;
  auto on_step = [&](const train::StepTiming& s) {
    elapsed += s.seconds;
    double eta = elapsed / s.step * (cfg.steps - s.step);
    if (tty) {
      std::printf("\r\033[Kstep %lld/%lld  loss %.4f  %s/step  ETA %.0f s", (long long)s.step,
                  (long long)cfg.steps, s.loss, fmt_seconds(s.seconds).c_str(), eta);
      if (s.step == cfg.steps) std::printf("\n");
    } else {
      std::printf("step %lld/%lld  loss %.4f  %s%s\n", (long long)s.step, (long long)cfg.steps,
                  s.loss, fmt_seconds(s.seconds).c_str(),
                  s.step <= cfg.warmup ? "  (untimed)" : "");
    }
    std::fflush(stdout);
  };
  if (tty) {
    // The first step also touches all memory (and compiles): say it started.
    std::printf("step 0/%lld  first step running", (long long)cfg.steps);
    std::fflush(stdout);
  }
  train::TrainReport r = train::run(cfg, on_step);
  std::printf("average step time: %.6f\n", r.mean);
  std::printf("median %s, p90 %s, min %s, max %s over %lld timed steps\n",
              fmt_seconds(r.median).c_str(), fmt_seconds(r.p90).c_str(), fmt_seconds(r.min).c_str(),
              fmt_seconds(r.max).c_str(), (long long)(cfg.steps - cfg.warmup));
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
      "measured by an fp32 FMA loop on all threads)\n",
      100 * r.mfu, r.achieved_gflops, r.peak_gflops, r.flops_per_step / 1e9);
  if (kernel_profile().enabled) std::printf("%s", kernel_profile().report().c_str());
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln: train neural networks from C++"};
  app.require_subcommand(1);
  DemoOptions demo;
  auto* d = app.add_subcommand("demo", "train a small classifier with grad and SGD");
  d->add_option("--steps", demo.steps, "training steps")->check(CLI::PositiveNumber);
  d->add_option("--lr", demo.lr, "SGD learning rate")->check(CLI::PositiveNumber);
  d->add_option("--mode", demo.mode, "execution mode")->check(CLI::IsMember({"eager", "lazy"}));
  d->add_option("--seed", demo.seed, "random seed");
  d->add_option("--threads", demo.threads, "CPU threads (default: all)")
      ->check(CLI::PositiveNumber);
  auto* info = app.add_subcommand("info", "show the build, devices and libraries");

  TrainFlags tf;
  auto* t = app.add_subcommand("train", "the reference experiment: train a ViT on random images");
  t->add_option("--batch-size", tf.batch_size, "images per step")->check(CLI::PositiveNumber);
  t->add_option("--mode", tf.mode, "eager (alias pytorch), lazy (torch_xla) or jit (jax)")
      ->check(CLI::IsMember({"eager", "pytorch", "lazy", "torch_xla", "jit", "jax"}));
  t->add_flag("--compile-model", tf.compile_model,
              "with --mode eager: compile forward and backward, the optimizer stays eager");
  auto* model_opt = t->add_option("--model", tf.model, "preset")
                        ->check(CLI::IsMember({"vit-tiny", "vit-small", "vit-base", "vit-large"}));
  t->add_option("--config", tf.config, "a HuggingFace config.json instead of a preset")
      ->check(CLI::ExistingFile)
      ->excludes(model_opt);
  t->add_option(
       "--steps", tf.steps,
       "total steps, warm-up included (default: 8 for vit-base and vit-large, 20 otherwise)")
      ->check(CLI::PositiveNumber);
  t->add_option("--warmup", tf.warmup, "untimed steps at the start (default 2)")
      ->check(CLI::NonNegativeNumber);
  t->add_option("--lr", tf.lr, "SGD learning rate")->check(CLI::NonNegativeNumber);
  t->add_option("--seed", tf.seed, "random seed for weights and data");
  t->add_option("--layout", tf.layout, "image layout")->check(CLI::IsMember({"nchw", "nhwc"}));
  t->add_option("--threads", tf.threads, "CPU threads (default: all)")->check(CLI::PositiveNumber);
  t->add_option("--log-json", tf.log_json, "write one JSON object per step to this file");

  GradFlags gf;
  auto* g = app.add_subcommand("grad",
                               "one forward and backward pass; writes logits, loss and gradients");
  g->add_option("--config", gf.config, "HuggingFace config.json")
      ->required()
      ->check(CLI::ExistingFile);
  g->add_option("--weights", gf.weights, "model.safetensors with HuggingFace names")
      ->required()
      ->check(CLI::ExistingFile);
  g->add_option("--batch", gf.batch, "safetensors with pixel_values and labels")
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
      std::fprintf(stderr, "kiln: unknown command '%s'; expected one of train, grad, demo, info\n",
                   cmd.c_str());
      return 2;
    }
  }
  CLI11_PARSE(app, argc, argv);
  try {
    if (t->parsed()) return run_train(tf);
    if (g->parsed()) return run_grad(gf);
    if (d->parsed()) return run_demo(demo);
    if (info->parsed()) return run_info();
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln: %s\n", e.what());
    return 1;
  }
  return 0;
}
