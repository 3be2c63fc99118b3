// kiln — the command line.
//   kiln demo [--steps N] [--lr X] [--mode eager|lazy] [--seed S] [--threads T]
//   kiln info
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>

#include "kiln/kiln.h"

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
  std::printf("%d steps in %.3f s (%.1f steps/s); final loss %.4f\n", o.steps, secs,
              o.steps / secs, loss);
  return 0;
}

int run_info() {
  const dnnl_version_t* v = dnnl_version();
  std::printf("kiln 0.1\n");
  std::printf("threads:  %d (OpenMP)\n", num_threads());
  std::printf("oneDNN:   %d.%d.%d (cpu runtime %s)\n", v->major, v->minor, v->patch,
              v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other");
  std::printf("devices:  cpu\n");
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
  d->add_option("--threads", demo.threads, "CPU threads (default: all)")->check(CLI::PositiveNumber);
  auto* info = app.add_subcommand("info", "show the build, devices and libraries");
  CLI11_PARSE(app, argc, argv);
  try {
    if (d->parsed()) return run_demo(demo);
    if (info->parsed()) return run_info();
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln: %s\n", e.what());
    return 1;
  }
  return 0;
}
