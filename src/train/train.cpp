// kiln train: the eager training loop, its timing and its statistics.
#include "kiln/train.h"

#include "kiln/compiler.h"
#include "ops/dispatch.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

namespace kiln::train {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q * (v.size() - 1);
  size_t lo = static_cast<size_t>(pos);
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

}  // namespace

double measure_peak_gflops() {
  // Ten independent chains of 64-byte vector FMAs per thread (GCC vector
  // extensions: one register each, AVX-512 where the CPU has it) hide the FMA
  // latency on two FMA ports; the best of a few short runs is the peak.
  typedef float v16 __attribute__((vector_size(64)));
  constexpr int64_t kIters = 20'000'000;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
      v16 a0 = {}, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, a4 = a0 + 4, a5 = a0 + 5, a6 = a0 + 6,
          a7 = a0 + 7, a8 = a0 + 8, a9 = a0 + 9;
      const v16 m = v16{} + 0.999999f, c = v16{} + 1e-7f;
      for (int64_t it = 0; it < kIters; ++it) {
        a0 = a0 * m + c, a1 = a1 * m + c, a2 = a2 * m + c, a3 = a3 * m + c, a4 = a4 * m + c;
        a5 = a5 * m + c, a6 = a6 * m + c, a7 = a7 * m + c, a8 = a8 * m + c, a9 = a9 * m + c;
      }
      v16 t = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9;
      for (int l = 0; l < 16; ++l) sink += t[l];
    }
    double secs = since(t0);
    double flops = 2.0 * 10 * 16 * kIters * num_threads();
    if (sink != 12345.0f) best = std::max(best, flops / secs / 1e9);
  }
  return best;
}

TrainReport run(const TrainConfig& cfg, const std::function<void(const StepTiming&)>& on_step) {
  if (cfg.batch_size <= 0) fail("train", "--batch-size must be positive");
  if (cfg.steps <= 0) fail("train", "--steps must be positive");
  if (cfg.warmup < 0 || cfg.warmup >= cfg.steps)
    fail("train", "--warmup must lie in [0, --steps), got " + std::to_string(cfg.warmup) +
                      " with --steps " + std::to_string(cfg.steps));
  bool dropout = cfg.model.hidden_dropout_prob > 0 || cfg.model.attention_probs_dropout_prob > 0;
  if (cfg.mode != "eager" && cfg.mode != "lazy" && cfg.mode != "jit")
    fail("train", "mode '" + cfg.mode + "', expected eager, lazy or jit");
  if (cfg.compile_model && cfg.mode != "eager")
    fail("train", "--compile-model goes with --mode eager (lazy and jit compile the whole step)");
  nn::ViTForImageClassification model(cfg.model);
  auto keys = random::split(random::Key(cfg.seed), 3);
  Params params = model.init(keys[0]);
  optim::SGD sgd({.lr = cfg.lr});
  optim::State state = sgd.init(params);

  data::RandomImagesOptions dopt;
  dopt.num_labels = cfg.model.num_labels;
  dopt.image_size = cfg.model.image_size;
  dopt.channels = cfg.model.num_channels;
  dopt.layout = cfg.layout;
  dopt.seed = cfg.seed;
  dopt.num_samples = std::max<int64_t>(cfg.batch_size * cfg.steps, cfg.batch_size);
  data::Loader loader(std::make_shared<data::RandomImages>(dopt),
                      {.batch_size = cfg.batch_size, .workers = cfg.workers, .prefetch = 2});

  auto loss_fn = [&](const Params& p, const Array& x, const Array& y, const nn::ApplyOptions& opt) {
    return mean(softmax_cross_entropy(model.apply(p, x, opt), y));
  };
  // Compiled steps take the step's dropout key as their last argument.
  auto traced_options = [&](const std::vector<Array>& args, size_t np) {
    return nn::ApplyOptions{
        .layout = cfg.layout, .train = dropout, .dropout_key_array = args[np + 2]};
  };

  TrainReport report;
  for (auto& [name, p] : params) report.parameters += p.size();
  report.flops_per_step = cfg.model.train_flops_per_image() * cfg.batch_size;
  std::ofstream log;
  if (!cfg.log_json.empty()) {
    log.open(cfg.log_json);
    if (!log) fail("train", "--log-json " + cfg.log_json + ": cannot open for writing");
  }

  std::vector<std::string> names;
  for (auto& [name, p] : params) names.push_back(name);
  const size_t np = names.size();
  // The whole step as a function of (parameters..., images, labels).
  auto step_fn = [&](const std::vector<Array>& args) {
    Params p = unflatten(names, args);
    auto [loss, grads] =
        value_and_grad(loss_fn)(p, args[np], args[np + 1], traced_options(args, np));
    auto [next, st] = sgd.update(grads, state, p);
    std::vector<Array> out = flatten(next);
    out.push_back(loss);
    return out;
  };
  // Forward and backward only (for --compile-model): (loss, grads...).
  auto grad_fn = [&](const std::vector<Array>& args) {
    Params p = unflatten(names, args);
    auto [loss, grads] =
        value_and_grad(loss_fn)(p, args[np], args[np + 1], traced_options(args, np));
    std::vector<Array> out{loss};
    for (auto& g : flatten(grads)) out.push_back(g);
    return out;
  };
  std::vector<int> donate(np);
  for (size_t i = 0; i < np; ++i) donate[i] = static_cast<int>(i);
  Jitted jitted_step = jit(step_fn, {.donate = donate});
  Jitted jitted_grad = jit(grad_fn);
  uint64_t lazy_compiles_before = lazy_cache_stats().compiles;

  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto t0 = Clock::now();
    double wait0 = loader.wait_seconds();
    data::Batch batch = loader.next();
    double data_secs = loader.wait_seconds() - wait0;
    random::Key step_key = random::fold_in(keys[1], static_cast<uint32_t>(step));
    Array loss;
    if (cfg.mode == "eager" && !cfg.compile_model) {
      Params grads;
      nn::ApplyOptions opt{.layout = cfg.layout, .train = dropout, .dropout_key = step_key};
      std::tie(loss, grads) = value_and_grad(loss_fn)(params, batch.images, batch.labels, opt);
      std::tie(params, state) = sgd.update(grads, state, params);
      eval(params);
    } else if (cfg.mode == "eager") {
      std::vector<Array> args = flatten(params);
      args.push_back(batch.images);
      args.push_back(batch.labels);
      args.push_back(random::key_array(step_key));
      auto out = jitted_grad(args);
      loss = out[0];
      std::tie(params, state) = sgd.update(unflatten(names, out, 1), state, params);
      eval(params);
    } else {
      std::vector<Array> args = flatten(params);
      args.push_back(batch.images);
      args.push_back(batch.labels);
      args.push_back(random::key_array(step_key));
      std::vector<Array> out;
      if (cfg.mode == "jit") {
        out = jitted_step(args);
      } else {
        {
          LazyScope lazy;
          out = step_fn(args);
        }
        mark_step(out);  // the step barrier
      }
      loss = out.back();
      params = unflatten(names, out);
    }
    float loss_value = loss.item<float>();  // the step's results exist now
    StepTiming st{step, since(t0), data_secs, loss_value};
    report.steps.push_back(st);
    if (step == 1) report.first_step_seconds = st.seconds;
    if (log)
      log << nlohmann::json{{"step", step},
                            {"loss", loss_value},
                            {"step_time", st.seconds},
                            {"data_wait", data_secs},
                            {"timed", step > cfg.warmup}}
                 .dump()
          << "\n";
    if (on_step) on_step(st);
    if (step == cfg.warmup) kernel_profile().reset();  // KILN_PROFILE covers the timed steps
  }
  const CompileStats* cs = nullptr;
  if (cfg.mode == "jit") {
    report.compiles = jitted_step.cache_stats().compiles;
    cs = &jitted_step.last_compile();
  } else if (cfg.mode == "lazy") {
    report.compiles = lazy_cache_stats().compiles - lazy_compiles_before;
    cs = &lazy_last_compile();
  } else if (cfg.compile_model) {
    report.compiles = jitted_grad.cache_stats().compiles;
    cs = &jitted_grad.last_compile();
  }
  if (cs) {
    report.compile_ms = cs->compile_ms;
    report.arena_bytes = cs->arena_bytes;
    report.intermediate_bytes = cs->intermediate_bytes;
  }

  std::vector<double> times;
  double data_total = 0;
  for (auto& s : report.steps)
    if (s.step > cfg.warmup) {
      times.push_back(s.seconds);
      data_total += s.data_seconds;
    }
  double total = 0;
  for (double t : times) total += t;
  report.mean = total / times.size();
  report.median = percentile(times, 0.5);
  report.p90 = percentile(times, 0.9);
  report.min = *std::min_element(times.begin(), times.end());
  report.max = *std::max_element(times.begin(), times.end());
  report.images_per_second = cfg.batch_size / report.mean;
  report.data_wait_share = data_total / total;
  report.achieved_gflops = report.flops_per_step / report.median / 1e9;
  report.peak_gflops = measure_peak_gflops();
  report.mfu = report.achieved_gflops / report.peak_gflops;
  report.peak_rss_mib = peak_rss_mib();
  if (log)
    log << nlohmann::json{{"summary", true},
                          {"mean", report.mean},
                          {"median", report.median},
                          {"p90", report.p90},
                          {"images_per_second", report.images_per_second},
                          {"data_wait_share", report.data_wait_share},
                          {"mfu", report.mfu},
                          {"peak_gflops", report.peak_gflops},
                          {"first_step_seconds", report.first_step_seconds},
                          {"compiles", report.compiles},
                          {"compile_ms", report.compile_ms},
                          {"peak_rss_mib", report.peak_rss_mib}}
               .dump()
        << "\n";
  return report;
}

}  // namespace kiln::train

namespace kiln::train {

GradResult forward_backward(const nn::ViTConfig& cfg, const Params& weights, const Array& pixels,
                            const Array& labels, nn::Layout layout) {
  nn::ViTForImageClassification model(cfg);
  model.check(weights, "weights");
  Params p;
  for (auto& [name, w] : weights) p.emplace(name, astype(w, DType::f32));
  if (labels.ndim() != 1 || !is_integral(labels.dtype()))
    fail("batch", "labels must be a 1-d integer array, got " +
                      std::string(name_of(labels.dtype())) + " " + str(labels.shape()));
  if (pixels.ndim() != 4 || pixels.shape()[0] != labels.shape()[0])
    fail("batch", "pixel_values " + str(pixels.shape()) + " and labels " + str(labels.shape()) +
                      " disagree on the batch size");
  GradResult r;
  Array x = astype(pixels, DType::f32);
  auto [loss, grads] = value_and_grad([&](const Params& q) {
    r.logits = model.apply(q, x, {.layout = layout});
    return mean(softmax_cross_entropy(r.logits, labels));
  })(p);
  r.loss = loss;
  r.grads = std::move(grads);
  return r;
}

}  // namespace kiln::train
