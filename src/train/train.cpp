// kiln train: the eager training loop, its timing and its statistics.
#include "kiln/train.h"

#include "kiln/compiler.h"
#include "kiln/io.h"
#include "ops/dispatch.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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

namespace {

// The data sets label each image with a class (integer). A model trained for
// another problem type learns from the class in the form that problem needs:
// its one-hot vector (float) for multi-label classification and for
// regression with several outputs, the class index as a number for
// regression with one output.
Array targets_for(const nn::ViTConfig& cfg, const Array& classes) {
  switch (cfg.problem_for(classes.dtype())) {
    case nn::ProblemType::Regression:
      if (cfg.num_labels == 1) return astype(classes, DType::f32);
      return one_hot(classes, cfg.num_labels, DType::f32);
    case nn::ProblemType::MultiLabel: return one_hot(classes, cfg.num_labels, DType::f32);
    default: return classes;
  }
}

// A model without a classifier (num_labels 0) has no classes to learn.
void require_classifier(const nn::ViTConfig& cfg, const std::string& origin) {
  if (cfg.num_labels == 0)
    fail(origin,
         "the model has num_labels 0 (no classifier: its logits are the final [CLS] features), "
         "but training and evaluation learn classes; use num_labels >= 1");
}

// The model's forward pass as the loss and hit count of one batch:
// (sum of per-sample losses, number of correct top-1 predictions).
std::pair<Array, Array> batch_metrics(const nn::ViTForImageClassification& model, const Params& p,
                                      const Array& x, const Array& y, nn::Layout layout,
                                      DType matmul_dtype) {
  Array logits = model.apply(p, x, {.layout = layout, .matmul_dtype = matmul_dtype});
  const nn::ViTConfig& cfg = model.config();
  Array loss = cfg.problem_for(y.dtype()) == nn::ProblemType::SingleLabel
                   ? sum(softmax_cross_entropy(logits, y))
                   : model.loss(logits, targets_for(cfg, y)) * static_cast<double>(y.shape()[0]);
  Array hits = sum(astype(equal(argmax(logits, -1), astype(y, DType::i64)), DType::f32));
  return {loss, hits};
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg) {
  if (cfg.optimizer == "sgd")
    return std::make_unique<optim::SGD>(optim::SGDOptions{
        .lr = cfg.lr, .momentum = cfg.momentum, .weight_decay = cfg.weight_decay});
  if (cfg.optimizer == "adamw")
    return std::make_unique<optim::AdamW>(optim::AdamWOptions{
        .lr = cfg.lr, .beta1 = cfg.beta1, .beta2 = cfg.beta2, .weight_decay = cfg.weight_decay});
  fail("train", "optimizer '" + cfg.optimizer + "', expected sgd or adamw");
}

DataSplits make_datasets(const TrainConfig& cfg, const nn::ViTConfig& mcfg) {
  DataSplits d;
  if (cfg.data == "random") {
    data::RandomImagesOptions dopt;
    dopt.num_labels = mcfg.num_labels;
    dopt.image_size = mcfg.image_size;  // height and width
    dopt.channels = mcfg.num_channels;
    dopt.layout = cfg.layout;
    dopt.seed = cfg.seed;
    dopt.num_samples = std::max<int64_t>(cfg.batch_size * cfg.steps, cfg.batch_size);
    d.train = std::make_shared<data::RandomImages>(dopt);
  } else if (cfg.data == "fashion-mnist") {
    if (mcfg.num_channels != 1 || mcfg.image_size != 28 || mcfg.num_labels != 10)
      fail("train",
           "--data fashion-mnist needs a model with num_channels 1, image_size 28 and "
           "num_labels 10 (e.g. --model vit-fmnist), got " +
               std::to_string(mcfg.num_channels) + ", " + nn::to_string(mcfg.image_size) + " and " +
               std::to_string(mcfg.num_labels));
    d.train = std::make_shared<data::FashionMnist>(data::FashionMnistOptions{.dir = cfg.data_dir,
                                                                             .split = "train",
                                                                             .layout = cfg.layout,
                                                                             .hflip = cfg.augment,
                                                                             .seed = cfg.seed});
    d.eval = std::make_shared<data::FashionMnist>(
        data::FashionMnistOptions{.dir = cfg.data_dir, .split = "test", .layout = cfg.layout});
  } else if (cfg.data.rfind("imagefolder:", 0) == 0) {
    data::ImageFolderOptions o{.root = cfg.data.substr(12),
                               .split = "train",
                               .image_size = mcfg.image_size,
                               .channels = mcfg.num_channels,
                               .augment = cfg.augment,
                               .layout = cfg.layout,
                               .skip_bad = cfg.skip_bad_images,
                               .seed = cfg.seed};
    auto train_folder = std::make_shared<data::ImageFolder>(o);
    if (static_cast<int64_t>(train_folder->classes().size()) != mcfg.num_labels)
      fail("train", "--data " + cfg.data + " has " +
                        std::to_string(train_folder->classes().size()) +
                        " classes (sub-folders), the model has num_labels " +
                        std::to_string(mcfg.num_labels));
    o.split = "holdout";
    o.augment = false;
    auto held = std::make_shared<data::ImageFolder>(o);
    if (held->size() > 0) d.eval = held;  // else fewer than 10 files per class: no evaluation
    d.skipped = train_folder->skipped();
    d.train = train_folder;
  } else {
    fail("train", "--data '" + cfg.data + "', expected random, fashion-mnist or imagefolder:PATH");
  }
  return d;
}

}  // namespace

DataSplits load_data(const TrainConfig& cfg) {
  return make_datasets(cfg, cfg.model);
}

DType matmul_dtype_for(const std::string& precision) {
  if (precision == "fp32") return DType::f32;
  if (precision == "bf16") return DType::bf16;
  if (precision == "tf32")
    fail("train",
         "--precision tf32 is a CUDA setting (TensorFloat-32 tensor cores); this build "
         "runs on the cpu device only: use fp32, or bf16 for mixed precision");
  fail("train", "--precision '" + precision + "', expected fp32, bf16 or tf32");
}

EvalResult evaluate(const nn::ViTConfig& cfg, const Params& params, const data::Dataset& dataset,
                    int64_t batch_size, nn::Layout layout, bool compiled, DType matmul_dtype) {
  auto t0 = Clock::now();
  require_classifier(cfg, "eval");
  nn::ViTForImageClassification model(cfg);
  std::shared_ptr<const data::Dataset> ds(&dataset, [](const data::Dataset*) {});
  data::Loader loader(ds, {.batch_size = batch_size, .drop_last = false, .workers = 1});
  std::vector<std::string> names;
  for (auto& [name, p] : params) names.push_back(name);
  const size_t np = names.size();
  Jitted fwd = jit([&](const std::vector<Array>& args) {
    auto [loss, hits] =
        batch_metrics(model, unflatten(names, args), args[np], args[np + 1], layout, matmul_dtype);
    return std::vector<Array>{loss, hits};
  });
  double loss = 0, hits = 0;
  EvalResult r;
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    data::Batch batch = loader.next();
    Array l, h;
    if (compiled) {
      std::vector<Array> args = flatten(params);
      args.push_back(batch.images);
      args.push_back(batch.labels);
      auto out = fwd(args);
      l = out[0], h = out[1];
    } else {
      std::tie(l, h) =
          batch_metrics(model, params, batch.images, batch.labels, layout, matmul_dtype);
    }
    loss += l.item<float>();
    hits += h.item<float>();
    r.samples += batch.labels.size();
  }
  r.loss = loss / r.samples;
  r.accuracy = hits / r.samples;
  r.seconds = since(t0);
  return r;
}

void validate(const TrainConfig& cfg) {
  if (cfg.batch_size <= 0) fail("train", "--batch-size must be positive");
  if (cfg.steps <= 0) fail("train", "--steps must be positive");
  if (cfg.warmup < 0 || cfg.warmup >= cfg.steps)
    fail("train", "--warmup must lie in [0, --steps), got " + std::to_string(cfg.warmup) +
                      " with --steps " + std::to_string(cfg.steps));
  if (cfg.mode != "eager" && cfg.mode != "lazy" && cfg.mode != "jit")
    fail("train", "mode '" + cfg.mode + "', expected eager, lazy or jit");
  if (cfg.compile_model && cfg.mode != "eager")
    fail("train", "--compile-model goes with --mode eager (lazy and jit compile the whole step)");
  if (cfg.clip_norm < 0) fail("train", "--clip-norm must be >= 0");
  if (cfg.eval_every < 0 || cfg.save_every < 0)
    fail("train", "--eval-every and --save-every must be >= 0");
  matmul_dtype_for(cfg.precision);
  optim::Schedule{cfg.schedule, cfg.lr_warmup, cfg.steps}.validate();
  make_optimizer(cfg);
}

TrainReport run(const TrainConfig& cfg, const Callbacks& cb) {
  auto run_start = Clock::now();
  validate(cfg);
  const DType matmul_dtype = matmul_dtype_for(cfg.precision);
  optim::Schedule schedule{cfg.schedule, cfg.lr_warmup, cfg.steps};
  auto optimizer = make_optimizer(cfg);

  // The model, its parameters and the optimizer state: fresh, or from a checkpoint.
  nn::ViTConfig mcfg = cfg.model;
  Params params;
  optim::State state;
  int64_t first_step = 1, data_start = 0;
  auto keys = random::split(random::Key(cfg.seed), 3);
  if (!cfg.resume_dir.empty()) {
    io::Checkpoint ck = io::load_checkpoint(cfg.resume_dir);
    if (ck.optimizer != cfg.optimizer)
      fail("train", "--resume " + cfg.resume_dir +
                        ": the checkpoint was trained with --optimizer " + ck.optimizer +
                        ", this run asks for " + cfg.optimizer);
    if (ck.seed != cfg.seed)
      fail("train", "--resume " + cfg.resume_dir + ": the checkpoint has seed " +
                        std::to_string(ck.seed) + ", this run asks for " +
                        std::to_string(cfg.seed) + " (pass the same --seed)");
    if (ck.state.step >= cfg.steps)
      fail("train", "--resume " + cfg.resume_dir + ": the checkpoint is at step " +
                        std::to_string(ck.state.step) + ", --steps is " +
                        std::to_string(cfg.steps) + " (the total, resumed steps included)");
    mcfg = ck.config;
    params = std::move(ck.params);
    state = std::move(ck.state);
    optim::State fresh = optimizer->init(params);
    for (auto& [name, b] : fresh.buffers)
      if (!state.buffers.count(name))
        fail("train", "--resume " + cfg.resume_dir + ": the optimizer state has no '" + name + "'");
    first_step = state.step + 1;
    data_start = ck.data_position;
  }
  require_classifier(mcfg, "train");
  nn::ViTForImageClassification model(mcfg);
  if (params.empty()) {
    params = model.init(keys[0]);
    state = optimizer->init(params);
  }
  bool dropout = mcfg.hidden_dropout_prob > 0 || mcfg.attention_probs_dropout_prob > 0;

  TrainReport report;
  const DataSplits ds = make_datasets(cfg, mcfg);
  report.skipped_images = ds.skipped;
  data::Loader loader(ds.train, {.batch_size = cfg.batch_size,
                                 .shuffle = cfg.data != "random",  // real data: every epoch anew
                                 .seed = cfg.seed,
                                 .workers = cfg.workers,
                                 .prefetch = 2,
                                 .start = data_start});

  // The loss of config.json's problem_type (softmax cross-entropy for classes).
  auto loss_fn = [&](const Params& p, const Array& x, const Array& y, const nn::ApplyOptions& opt) {
    return model.loss(model.apply(p, x, opt), targets_for(mcfg, y));
  };

  report.first_step = first_step;
  for (auto& [name, p] : params) report.parameters += p.size();
  report.flops_per_step = mcfg.train_flops_per_image() * cfg.batch_size;
  std::ofstream log;
  if (!cfg.log_json.empty()) {
    log.open(cfg.log_json, first_step > 1 ? std::ios::app : std::ios::trunc);
    if (!log) fail("train", "--log-json " + cfg.log_json + ": cannot open for writing");
  }

  std::vector<std::string> names, buffer_names;
  for (auto& [name, p] : params) names.push_back(name);
  for (auto& [name, b] : state.buffers) buffer_names.push_back(name);
  const size_t np = names.size(), nb = buffer_names.size();
  // Compiled steps take (parameters..., buffers..., images, labels, dropout
  // key, step scalars...) and return (parameters..., buffers..., loss).
  auto grads_of = [&](const Params& p, const Array& x, const Array& y, const Array& key) {
    nn::ApplyOptions opt{.layout = cfg.layout,
                         .train = dropout,
                         .dropout_key_array = key,
                         .matmul_dtype = matmul_dtype,
                         .fused_attention = cfg.fused_attention};
    auto [loss, grads] = value_and_grad(loss_fn)(p, x, y, opt);
    if (cfg.clip_norm > 0) grads = optim::clip_by_global_norm(grads, cfg.clip_norm).first;
    return std::pair{loss, grads};
  };
  auto step_fn = [&](const std::vector<Array>& args) {
    Params p = unflatten(names, args);
    optim::State st{unflatten(buffer_names, args, np), 0};
    size_t at = np + nb;
    auto [loss, grads] = grads_of(p, args[at], args[at + 1], args[at + 2]);
    std::vector<Array> scalars(args.begin() + at + 3, args.end());
    auto [next, next_state] = optimizer->apply(grads, st, p, scalars);
    if (cfg.mode == "jit") {
      // The parameters and buffers are donated: on a non-finite loss the step
      // returns its inputs unchanged, so that the step can be re-run to find
      // the op where the NaN starts (one select per element, no copy).
      Array finite = less(abs(loss), scalar_like(loss, INFINITY));
      for (auto& [name, q] : next) q = where(finite, q, p.at(name));
      for (auto& [name, b] : next_state.buffers) b = where(finite, b, st.buffers.at(name));
    }
    std::vector<Array> out = flatten(next);
    for (auto& b : flatten(next_state.buffers)) out.push_back(b);
    out.push_back(loss);
    return out;
  };
  // Forward and backward only (for --compile-model): (loss, grads...).
  auto grad_fn = [&](const std::vector<Array>& args) {
    auto [loss, grads] = grads_of(unflatten(names, args), args[np], args[np + 1], args[np + 2]);
    std::vector<Array> out{loss};
    for (auto& g : flatten(grads)) out.push_back(g);
    return out;
  };
  std::vector<int> donate(np + nb);
  for (size_t i = 0; i < np + nb; ++i) donate[i] = static_cast<int>(i);
  Jitted jitted_step = jit(step_fn, {.donate = donate});
  Jitted jitted_grad = jit(grad_fn);
  uint64_t lazy_compiles_before = lazy_cache_stats().compiles;
  const bool compiled_eval = cfg.mode != "eager" || cfg.compile_model;

  auto save = [&](int64_t step) {
    io::Checkpoint ck{mcfg, params, cfg.optimizer, state, cfg.seed, loader.position()};
    io::save_checkpoint(cfg.save_dir, ck);
    if (cb.on_save) cb.on_save(step, cfg.save_dir);
  };
  auto run_eval = [&](int64_t step) {
    if (!ds.eval) return;
    EvalResult r =
        evaluate(mcfg, params, *ds.eval, cfg.batch_size, cfg.layout, compiled_eval, matmul_dtype);
    r.step = step;
    report.evals.push_back(r);
    if (log)
      log << nlohmann::json{{"step", step},
                            {"eval_loss", r.loss},
                            {"eval_accuracy", r.accuracy},
                            {"eval_samples", r.samples},
                            {"eval_seconds", r.seconds}}
                 .dump()
          << std::endl;
    if (cb.on_eval) cb.on_eval(r);
  };

  for (int64_t step = first_step; step <= cfg.steps; ++step) {
    auto t0 = Clock::now();
    double wait0 = loader.wait_seconds();
    data::Batch batch = loader.next();
    double data_secs = loader.wait_seconds() - wait0;
    random::Key step_key = random::fold_in(keys[1], static_cast<uint32_t>(step));
    double lr = cfg.lr * schedule.factor(step - 1);
    std::vector<Array> scalars;
    for (double v : optimizer->scalars(state.step + 1, lr))
      scalars.push_back(Array::scalar(static_cast<float>(v)));
    // The step's inputs, for finding where a NaN starts (in jit mode they are
    // donated, and the step returns them unchanged when the loss is not finite).
    Params before = params;
    optim::State state_before = state;
    Array loss;
    if (cfg.mode == "eager" && !cfg.compile_model) {
      auto [l, grads] = grads_of(params, batch.images, batch.labels, random::key_array(step_key));
      loss = l;
      std::tie(params, state) = optimizer->apply(grads, state, params, scalars);
      eval(params);
      eval(state.buffers);
    } else if (cfg.mode == "eager") {
      std::vector<Array> args = flatten(params);
      args.push_back(batch.images);
      args.push_back(batch.labels);
      args.push_back(random::key_array(step_key));
      auto out = jitted_grad(args);
      loss = out[0];
      std::tie(params, state) = optimizer->apply(unflatten(names, out, 1), state, params, scalars);
      eval(params);
      eval(state.buffers);
    } else {
      std::vector<Array> args = flatten(params);
      for (auto& b : flatten(state.buffers)) args.push_back(b);
      args.push_back(batch.images);
      args.push_back(batch.labels);
      args.push_back(random::key_array(step_key));
      for (auto& s : scalars) args.push_back(s);
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
      state = optim::State{unflatten(buffer_names, out, np), state.step + 1};
    }
    float loss_value = loss.item<float>();  // the step's results exist now
    StepTiming st{step, since(t0), data_secs, loss_value, lr};
    if (!std::isfinite(loss_value)) {
      if (cfg.mode == "jit") before = params, state_before = {state.buffers, state.step - 1};
      // Re-run the step eagerly from its inputs, checking every op's output.
      std::string where = "every op of the step's forward and backward was finite on the re-run";
      try {
        CheckFiniteScope check;
        auto [l, grads] = grads_of(before, batch.images, batch.labels, random::key_array(step_key));
        optimizer->apply(grads, state_before, before, scalars);
      } catch (const Error& e) {
        where = std::string("first non-finite value: ") + e.what();
      }
      throw NonFiniteLoss("[train] step " + std::to_string(step) + ": the loss is " +
                          (std::isnan(loss_value) ? "NaN" : "infinite") + "; " + where);
    }
    report.steps.push_back(st);
    if (step == first_step) report.first_step_seconds = st.seconds;
    if (log)
      log << nlohmann::json{{"step", step},
                            {"loss", loss_value},
                            {"lr", lr},
                            {"step_time", st.seconds},
                            {"data_wait", data_secs},
                            {"timed", step >= first_step + cfg.warmup}}
                 .dump()
          << "\n";
    if (cb.on_step) cb.on_step(st);
    if (step == first_step + cfg.warmup - 1) kernel_profile().reset();  // KILN_PROFILE: timed steps
    if (cfg.eval_every > 0 && step % cfg.eval_every == 0 && step != cfg.steps) run_eval(step);
    if (!cfg.save_dir.empty() && cfg.save_every > 0 && step % cfg.save_every == 0 &&
        step != cfg.steps)
      save(step);
  }
  run_eval(cfg.steps);
  if (!cfg.save_dir.empty()) save(cfg.steps);

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
    if (s.step >= first_step + cfg.warmup) {
      times.push_back(s.seconds);
      data_total += s.data_seconds;
    }
  if (times.empty())  // every step was a warm-up step: report them all
    for (auto& s : report.steps) {
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
  if (cb.peak_gflops) {
    report.peak_gflops = cb.peak_gflops();
    report.mfu = report.achieved_gflops / report.peak_gflops;
  }
  report.peak_rss_mib = peak_rss_mib();
  report.wall_seconds = since(run_start);
  if (log) {
    nlohmann::json j{{"summary", true},
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
                     {"peak_rss_mib", report.peak_rss_mib},
                     {"wall_seconds", report.wall_seconds}};
    if (!report.evals.empty()) {
      j["eval_loss"] = report.evals.back().loss;
      j["eval_accuracy"] = report.evals.back().accuracy;
    }
    log << j.dump() << "\n";
  }
  return report;
}

}  // namespace kiln::train

namespace kiln::train {

GradResult forward_backward(const nn::ViTConfig& cfg, const Params& weights, const Array& pixels,
                            const Array& labels, nn::Layout layout, DType matmul_dtype) {
  nn::ViTForImageClassification model(cfg);
  model.check(weights, "weights");
  Params p;
  for (auto& [name, w] : weights) p.emplace(name, astype(w, DType::f32));
  if (pixels.ndim() != 4 || labels.ndim() == 0 || pixels.shape()[0] != labels.shape()[0])
    fail("batch", "pixel_values " + str(pixels.shape()) + " and labels " + str(labels.shape()) +
                      " disagree on the batch size");
  // CrossEntropyLoss skips labels equal to its ignore_index, -100, and
  // averages over the others.
  int64_t ignored = 0;
  if (cfg.problem_for(labels.dtype()) == nn::ProblemType::SingleLabel && labels.ndim() == 1)
    for (int64_t y : labels.to_vector<int64_t>()) ignored += y == -100;
  auto loss_of = [&](const Array& logits) {
    if (ignored == 0) return model.loss(logits, labels);
    Array keep = not_equal(labels, scalar_like(labels, -100));
    Array safe = where(keep, labels, scalar_like(labels, 0));
    return sum(softmax_cross_entropy(logits, safe) * astype(keep, DType::f32)) /
           static_cast<double>(labels.size() - ignored);
  };
  GradResult r;
  Array x = astype(pixels, DType::f32);
  auto [loss, grads] = value_and_grad([&](const Params& q) {
    r.logits = model.apply(q, x, {.layout = layout, .matmul_dtype = matmul_dtype});
    return loss_of(r.logits);
  })(p);
  r.loss = loss;
  r.grads = std::move(grads);
  return r;
}

}  // namespace kiln::train
