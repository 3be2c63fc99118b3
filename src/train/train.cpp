// kiln train: a run. Restore or init the parameters, then the loop of steps
// (timed, logged, with evaluations and checkpoints), then the summary of the
// step times. The step of each mode is in step.cpp, evaluation in evaluate.cpp.
#include "kiln/train.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "internal.h"
#include "kiln/distributed.h"
#include "kiln/gpt2.h"
#include "step.h"

namespace kiln::train {
namespace {

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

// Where a run starts: its model, parameters and optimizer state, its first
// step and the serial number of its first training batch.
struct Start {
  std::shared_ptr<const nn::Model> model;
  Params params;
  Params model_state;  // BatchNorm's running statistics (none for a ViT)
  optim::State state;
  int64_t first_step = 1, data_position = 0;
  std::optional<data::ImageProcessor> processor;  // a checkpoint's or a pretrained model's
  double best_accuracy = -1;                      // --save-best: a resumed run's best so far
};

// The checkpoint `resumed`, checked against cfg, or the pretrained model
// `init`, or fresh parameters (from `key`) for cfg.model; and the optimizer
// state.
Start restore_or_init(const TrainConfig& cfg, std::optional<io::Checkpoint> resumed,
                      std::optional<io::Pretrained> init, const optim::Optimizer& optimizer,
                      const random::Key& key) {
  Start s{cfg.model};
  if (resumed) {
    io::Checkpoint& ck = *resumed;
    const std::string resume = "--resume " + cfg.resume_dir + ": ";
    if (ck.optimizer != cfg.optimizer)
      fail("train", resume + "the checkpoint was trained with --optimizer " + ck.optimizer +
                        ", this run asks for " + cfg.optimizer);
    if (ck.seed != cfg.seed)
      fail("train", resume + "the checkpoint has seed " + std::to_string(ck.seed) +
                        ", this run asks for " + std::to_string(cfg.seed) +
                        " (pass the same --seed)");
    if (ck.state.step >= cfg.steps)
      fail("train", resume + "the checkpoint is at step " + std::to_string(ck.state.step) +
                        ", --steps is " + std::to_string(cfg.steps) +
                        " (the total, resumed steps included)");
    s.model = ck.model;
    s.params = std::move(ck.params);
    s.model_state = std::move(ck.model_state);
    s.state = std::move(ck.state);
    const optim::State fresh = optimizer.init(s.params);
    for (auto& [name, b] : fresh.buffers)
      if (!s.state.buffers.count(name))
        fail("train", resume + "the optimizer state has no '" + name + "'");
    for (auto& [name, b] : s.state.buffers)
      if (!fresh.buffers.count(name))
        fail("train", resume + "the optimizer state has '" + name +
                          "', which this run's optimizer does not keep: resume with the flags the "
                          "checkpoint was trained with (--ema, --freeze-backbone)");
    s.best_accuracy = ck.best_accuracy;
    s.first_step = s.state.step + 1;
    s.data_position = ck.data_position;
    s.processor = ck.processor;
    if (cfg.image_size.height > 0 && ck.model->fixed_image_size() &&
        cfg.image_size != ck.model->image_size())
      fail("train", resume + "the checkpoint's images are " +
                        nn::to_string(ck.model->image_size()) + ", --image-size asks for " +
                        nn::to_string(cfg.image_size));
  } else if (init) {
    s.model = init->model;
    s.params = std::move(init->params);
    s.model_state = std::move(init->state);
    s.state = optimizer.init(s.params);
    s.processor = init->processor;
  } else {
    // A new model's labels are named after the data's (an image folder's classes).
    std::vector<std::string> labels = data_labels(cfg);
    if (!s.model->causal_lm() && static_cast<int64_t>(labels.size()) == s.model->num_labels())
      s.model = s.model->with_labels(labels);
  }
  require_classifier(*s.model, "train");
  if (cfg.drop_path >= 0) s.model = s.model->with_drop_path(cfg.drop_path);
  // The model and the optimizer state live on the training device (a new
  // model is drawn there: no copy of it from the host). `--device cuda` in a
  // data-parallel run: each rank takes a GPU of its host by its local rank.
  Device device = parse_device(cfg.device, "--device");
  if (cfg.device == "cuda" && dist::size() > 1 && cuda_device_count() > 0)
    device = Device::cuda(dist::local_rank() % cuda_device_count());
  if (s.params.empty()) {
    s.params = s.model->init(key, device);
    s.model_state = s.model->init_state(device);
    s.state = optimizer.init(s.params);
  }
  for (auto& [name, p] : s.params) p = p.to(device);
  for (auto& [name, v] : s.model_state) v = v.to(device);
  for (auto& [name, b] : s.state.buffers) b = b.to(device);
  return s;
}

// Mean, median, p90, extremes, throughput, data wait and FLOP rate of the
// timed steps (of all steps when every step was a warm-up step).
void summarize_times(TrainReport& report, int64_t first_timed, int64_t batch_size) {
  std::vector<double> times;
  double data_total = 0;
  for (bool all : {false, true}) {
    for (auto& s : report.steps)
      if (all || s.step >= first_timed) {
        times.push_back(s.seconds);
        data_total += s.data_seconds;
      }
    if (!times.empty()) break;
  }
  double total = 0;
  for (double t : times) total += t;
  report.mean = total / times.size();
  report.median = percentile(times, 0.5);
  report.p90 = percentile(times, 0.9);
  report.min = *std::min_element(times.begin(), times.end());
  report.max = *std::max_element(times.begin(), times.end());
  report.images_per_second = batch_size / report.mean;
  report.data_wait_share = data_total / total;
  report.achieved_gflops = report.flops_per_step / report.median / 1e9;
}

// The last line of --log-json.
nlohmann::json summary_json(const TrainReport& report) {
  nlohmann::json j{{"summary", true},
                   {"mean", report.mean},
                   {"median", report.median},
                   {"p90", report.p90},
                   {"images_per_second", report.images_per_second},
                   {"data_wait_share", report.data_wait_share},
                   {"mfu", report.mfu},
                   {"flops_per_step", report.flops_per_step},
                   {"peak_gflops", report.peak_gflops},
                   {"first_step_seconds", report.first_step_seconds},
                   {"compiles", report.compiles},
                   {"replays", report.replays},
                   {"compile_ms", report.compile_ms},
                   {"peak_rss_mib", report.peak_rss_mib},
                   {"wall_seconds", report.wall_seconds}};
  if (report.peak_device_mib > 0) j["peak_device_mib"] = report.peak_device_mib;
  if (report.ranks > 1 || report.all_reduces > 0) {
    j["ranks"] = report.ranks;
    j["all_reduces"] = report.all_reduces;
    j["all_reduce_bytes"] = report.all_reduce_bytes;
    j["all_reduce_seconds"] = report.all_reduce_seconds;
    j["all_reduce_exposed_seconds"] = report.all_reduce_exposed_seconds;
  }
  if (!report.evals.empty()) {
    j["eval_loss"] = report.evals.back().loss;
    j["eval_accuracy"] = report.evals.back().accuracy;
    j["eval_top5"] = report.evals.back().top5;
    j["eval_compiles"] = report.eval_compiles;
  }
  return j;
}

// A run in progress: the model, data, step, evaluation and log it trains
// with, and what it reports.
class Trainer {
 public:
  Trainer(const TrainConfig& cfg, const Callbacks& cb, const optim::Optimizer& optimizer,
          Start start, random::Key step_key, Clock::time_point run_start);
  TrainReport run();

 private:
  void step(int64_t step);
  [[noreturn]] void stop_at_non_finite(int64_t step, float loss,
                                       const std::vector<StepInputs>& micro, Params before,
                                       optim::State state_before);
  void evaluate(int64_t step);
  void save(int64_t step);
  void summarize();
  void check_replicas(int64_t step);
  void inject_fault(int64_t step) const;

  const TrainConfig& cfg_;
  const Callbacks& cb_;
  const optim::Optimizer& optimizer_;
  const optim::Schedule schedule_;
  const random::Key step_key_;  // folded with the step number: the step's dropout key
  const Clock::time_point run_start_;
  const int64_t first_step_;
  const int rank_ = dist::rank(), ranks_ = dist::size();
  const std::shared_ptr<const nn::Model> model_;
  Params params_;
  Params model_state_;  // BatchNorm's running statistics (none for a ViT)
  optim::State state_;
  const std::optional<data::ImageProcessor> processor_;  // saved with the checkpoints
  const DataSplits data_;
  data::Loader loader_;
  TrainReport report_;
  std::ofstream log_;
  TrainStep step_;
  double best_accuracy_ = -1;           // --save-best: of the evaluations so far
  Params model_state_before_;           // the model's state before the current step
  std::optional<Evaluator> evaluator_;  // when the data set has a held-out split
};

Trainer::Trainer(const TrainConfig& cfg, const Callbacks& cb, const optim::Optimizer& optimizer,
                 Start start, random::Key step_key, Clock::time_point run_start)
    : cfg_(cfg),
      cb_(cb),
      optimizer_(optimizer),
      schedule_{cfg.schedule, cfg.lr_warmup, cfg.steps},
      step_key_(step_key),
      run_start_(run_start),
      first_step_(start.first_step),
      model_(start.model),
      params_(std::move(start.params)),
      model_state_(std::move(start.model_state)),
      state_(std::move(start.state)),
      processor_(saved_processor(cfg, *start.model, start.processor)),
      data_(make_datasets(cfg, *start.model, processor_)),
      loader_(data_.train, {.batch_size = cfg.batch_size,
                            .shuffle = cfg.data != "random",  // real data: every epoch anew
                            .seed = cfg.seed,
                            .workers = loader_workers(cfg),
                            .prefetch = std::max(2, 2 * loader_workers(cfg)),
                            .start = start.data_position,
                            .shard = dist::rank(),
                            .shards = dist::size()}),
      step_(cfg, *model_, optimizer, params_, model_state_, state_) {
  report_.skipped_images = data_.skipped;
  if (cb_.on_data && rank_ == 0) cb_.on_data(data_.description);
  report_.first_step = first_step_;
  for (auto& [name, p] : params_) report_.parameters += p.size();
  // The FLOPs this rank computes (its shard of the batch), for its MFU; a
  // language model's for its blocks' length.
  const nn::GPT2LMHeadModel* lm = nn::as_gpt2(*model_);
  const int64_t seq = model_->causal_lm() ? data_.train->image_shape()[0] : 0;
  const double per_example = lm ? lm->config().train_flops_per_token(seq) * static_cast<double>(seq)
                                : model_->train_flops_per_example(data_image_size(cfg, *model_));
  report_.flops_per_step = per_example * cfg.batch_size * cfg.accumulate / ranks_;
  if (model_->causal_lm())
    for (auto [on, flag] : {std::pair{cfg.mixup.enabled(), "--mixup/--cutmix"},
                            {cfg.erasing.enabled(), "--erasing"},
                            {cfg.augment, "--augment"},
                            {cfg.freeze_backbone, "--freeze-backbone"}})
      if (on)
        fail("train", std::string(flag) + " is for image classifiers; " + model_->architecture() +
                          " is a language model");
  report_.ranks = ranks_;
  if (!cfg.log_json.empty() && rank_ == 0) {  // only rank 0 logs
    log_.open(cfg.log_json, first_step_ > 1 ? std::ios::app : std::ios::trunc);
    if (!log_) fail("train", "--log-json " + cfg.log_json + ": cannot open for writing");
  }
  best_accuracy_ = start.best_accuracy;
  if (cfg.save_best && !data_.eval)
    fail("train", "--save-best keeps the checkpoint of the best evaluation, but --data " +
                      cfg.data + " has no held-out split to evaluate on");
  if (data_.eval)
    evaluator_.emplace(model_, cfg.layout, cfg.mode != Mode::eager || cfg.compile_model,
                       matmul_dtype_for(cfg.precision));
}

TrainReport Trainer::run() {
  for (int64_t s = first_step_; s <= cfg_.steps; ++s) {
    step(s);
    if (cfg_.eval_every > 0 && s % cfg_.eval_every == 0 && s != cfg_.steps) evaluate(s);
    if (!cfg_.save_dir.empty() && !cfg_.save_best && cfg_.save_every > 0 &&
        s % cfg_.save_every == 0 && s != cfg_.steps)
      save(s);
  }
  evaluate(cfg_.steps);
  if (!cfg_.save_dir.empty() && !cfg_.save_best) save(cfg_.steps);
  summarize();
  return std::move(report_);
}

// One step, timed from the wait for its batch until its loss exists.
void Trainer::step(int64_t step) {
  auto t0 = Clock::now();
  inject_fault(step);
  double wait0 = loader_.wait_seconds();
  // The batches and the step's scalars go to the model's device (queued
  // copies: the host does not wait for them).
  const Device device = params_.begin()->second.device();
  // Each rank draws its own dropout masks (for its own samples).
  random::Key key = random::fold_in(step_key_, static_cast<uint32_t>(step));
  if (ranks_ > 1) key = random::fold_in(key, static_cast<uint32_t>(rank_));
  double lr = cfg_.lr * schedule_.factor(step - 1);
  std::vector<StepInputs> micro;
  for (int64_t i = 0; i < cfg_.accumulate; ++i) {
    data::Batch batch = loader_.next();
    random::Key k = cfg_.accumulate > 1 ? random::fold_in(key, static_cast<uint32_t>(i)) : key;
    const bool nhwc = cfg_.layout == nn::Layout::NHWC;
    const Shape s = batch.images.shape();  // a copy: erasing replaces batch.images
    if (cfg_.erasing.enabled()) {
      // Each image's box from its own key; then its fill's.
      const random::Key ek = random::fold_in(k, 0x6572);
      std::vector<data::EraseBox> boxes;
      for (int64_t j = 0; j < s[0]; ++j)
        boxes.push_back(data::draw_erase(cfg_.erasing, random::fold_in(ek, static_cast<uint32_t>(j)),
                                         s[nhwc ? 1 : 2], s[nhwc ? 2 : 3]));
      batch.images =
          data::erase_batch(batch.images, boxes, cfg_.erasing, random::fold_in(ek, 0xf111), nhwc);
    }
    if (cfg_.mixup.enabled()) {
      // Each batch (and each rank's) mixed by its own draws, on the host.
      const data::MixParams m = data::draw_mix(cfg_.mixup, random::fold_in(k, 0x6d69),
                                               s[nhwc ? 1 : 2], s[nhwc ? 2 : 3]);
      std::tie(batch.images, batch.labels) =
          data::mix_batch(batch.images, batch.labels, m, model_->num_labels(),
                          cfg_.label_smoothing, nhwc);
    }
    micro.push_back(
        {batch.images.to(device), batch.labels.to(device), random::key_array(k, device)});
  }
  double data_secs = loader_.wait_seconds() - wait0;
  StepInputs& in = micro.back();
  for (double v : optimizer_.scalars(state_.step + 1, lr))
    in.scalars.push_back(Array::scalar(static_cast<float>(v)).to(device));
  // The step's inputs, for finding where a NaN starts (in jit mode they are
  // donated, and the step returns them unchanged when the loss is not finite).
  Params before = params_;
  optim::State state_before = state_;
  model_state_before_ = model_state_;
  Array loss = cfg_.accumulate > 1 ? step_.accumulate(params_, model_state_, state_, micro)
                                   : step_(params_, model_state_, state_, in);
  float loss_value = loss.item<float>();  // the step's results exist now
  StepTiming st{step, since(t0), data_secs, loss_value, lr};
  if (!std::isfinite(loss_value))
    stop_at_non_finite(step, loss_value, micro, std::move(before), std::move(state_before));
  report_.steps.push_back(st);
  if (step == first_step_) report_.first_step_seconds = st.seconds;
  if (log_)
    log_ << nlohmann::json{{"step", step},
                           {"loss", loss_value},
                           {"lr", lr},
                           {"step_time", st.seconds},
                           {"data_wait", data_secs},
                           {"timed", step >= first_step_ + cfg_.warmup}}
                .dump()
         << "\n";
  if (cb_.on_step && rank_ == 0) cb_.on_step(st);
  if (step == first_step_ + cfg_.warmup - 1) {  // the timed steps start
    kernel_profile_reset();                     // KILN_PROFILE
    dist::reset_stats();
  }
  if (cfg_.check_replicas > 0 && step % cfg_.check_replicas == 0) check_replicas(step);
}

// FNV-1a over the bytes of every parameter, in name order.
uint64_t params_hash(const Params& params) {
  uint64_t h = 1469598103934665603ull;
  std::vector<unsigned char> bytes;
  for (auto& [name, p] : params) {
    bytes.resize(p.nbytes());
    p.copy_to_host(bytes.data(), p.dtype());
    for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  }
  return h;
}

// --check-replicas: every rank must hold rank 0's parameters.
void Trainer::check_replicas(int64_t step) {
  std::vector<uint64_t> hashes = dist::all_gather(params_hash(params_));
  std::string differ;
  for (size_t r = 1; r < hashes.size(); ++r)
    if (hashes[r] != hashes[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty())
    fail("train", "--check-replicas: after step " + std::to_string(step) +
                      " the parameters of "
                      "rank" +
                      (differ.find(',') != std::string::npos ? "s " : " ") + differ +
                      " differ from rank 0's");
}

// KILN_DIST_FAULT=exit@R:S or hang@R:S (tests of failure handling): rank R
// dies (exit code 9, no clean-up) or stops making progress at step S.
void Trainer::inject_fault(int64_t step) const {
  const char* f = std::getenv("KILN_DIST_FAULT");
  if (!f) return;
  std::string spec(f);
  const size_t at = spec.find('@'), colon = spec.find(':');
  if (at == std::string::npos || colon == std::string::npos || colon < at)
    fail("train", "KILN_DIST_FAULT='" + spec + "': expected exit@RANK:STEP or hang@RANK:STEP");
  const std::string kind = spec.substr(0, at);
  const int rank = std::atoi(spec.substr(at + 1, colon - at - 1).c_str());
  const int64_t when = std::atoll(spec.substr(colon + 1).c_str());
  if (rank != rank_ || when != step) return;
  if (kind == "exit") ::_exit(9);
  if (kind == "hang")
    for (;;) ::pause();
  fail("train", "KILN_DIST_FAULT='" + spec + "': expected exit or hang before '@'");
}

// Re-runs the step eagerly from its inputs, checking every op's output, and
// stops the run naming the first op that produced a NaN or an infinity.
void Trainer::stop_at_non_finite(int64_t step, float loss, const std::vector<StepInputs>& micro,
                                 Params before, optim::State state_before) {
  // The jitted step donated its inputs and returned them unchanged (an
  // accumulated step updates nothing when its loss is not finite).
  if (cfg_.mode == Mode::jit && cfg_.accumulate == 1)
    before = params_, state_before = {state_.buffers, state_.step - 1},
    model_state_before_ = model_state_;
  std::string where = "every op of the step's forward and backward was finite on the re-run";
  try {
    CheckFiniteScope check;
    // This rank's own forward and backward: a rank whose data makes the NaN
    // names the op; the ranks do not wait for one another.
    for (const StepInputs& in : micro) {
      LossAndGrads r = step_.loss_and_grads(before, model_state_before_, in.images, in.labels,
                                            in.key, /*across_ranks=*/false);
      if (&in == &micro.back())
        optimizer_.apply(r.grads, state_before, before, micro.back().scalars);
    }
  } catch (const Error& e) {
    where = std::string("first non-finite value: ") + e.what();
  }
  throw NonFiniteLoss("[train] step " + std::to_string(step) + ": the loss is " +
                      (std::isnan(loss) ? "NaN" : "infinite") + "; " + where);
}

void Trainer::evaluate(int64_t step) {
  if (!evaluator_) return;
  EvalResult r = (*evaluator_)(params_, model_state_, *data_.eval, cfg_.batch_size);
  r.step = step;
  if (cfg_.ema > 0) {
    EvalResult e =
        (*evaluator_)(optim::ema_params(state_), model_state_, *data_.eval, cfg_.batch_size);
    r.has_ema = true;
    r.ema_loss = e.loss, r.ema_accuracy = e.accuracy, r.ema_top5 = e.top5;
    r.seconds += e.seconds;
  }
  report_.evals.push_back(r);
  // --save-best: the checkpoint follows the best accuracy (of the moving
  // average, when there is one: what is saved for use).
  const double accuracy = r.has_ema ? r.ema_accuracy : r.accuracy;
  if (cfg_.save_best && !cfg_.save_dir.empty() && accuracy > best_accuracy_) {
    best_accuracy_ = accuracy;
    save(step);
  }
  if (rank_ != 0) return;  // every rank evaluated its part; rank 0 reports
  if (log_) {
    nlohmann::json j{
        {"step", step},        {"eval_loss", r.loss},       {"eval_accuracy", r.accuracy},
        {"eval_top5", r.top5}, {"eval_samples", r.samples}, {"eval_seconds", r.seconds}};
    if (r.has_ema) {
      j["eval_ema_loss"] = r.ema_loss;
      j["eval_ema_accuracy"] = r.ema_accuracy;
      j["eval_ema_top5"] = r.ema_top5;
    }
    log_ << j.dump() << std::endl;
  }
  if (cb_.on_eval) cb_.on_eval(r);
}

void Trainer::save(int64_t step) {
  if (rank_ != 0) return;  // the ranks hold the same parameters: rank 0 writes them
  io::Checkpoint ck{model_,    params_, cfg_.optimizer, state_, cfg_.seed, loader_.position(),
                    processor_};
  ck.ema = optim::ema_params(state_);
  ck.model_state = model_state_;
  if (cfg_.save_best) ck.best_accuracy = best_accuracy_;
  ck.files = data_.files;
  io::save_checkpoint(cfg_.save_dir, ck);
  if (cb_.on_save) cb_.on_save(step, cfg_.save_dir);
}

// The report's compile counts, step-time statistics, utilization and memory,
// and the summary line of the log.
void Trainer::summarize() {
  report_.compiles = step_.compiles();
  report_.replays = step_.replays();
  const dist::Stats ds = dist::stats();  // of the timed steps
  report_.all_reduces = ds.all_reduces;
  report_.all_reduce_bytes = ds.bytes;
  report_.all_reduce_seconds = ds.busy_seconds;
  report_.all_reduce_exposed_seconds = ds.exposed_seconds;
  if (const CompileStats* cs = step_.last_compile()) {
    report_.compile_ms = cs->compile_ms;
    report_.arena_bytes = cs->arena_bytes;
    report_.intermediate_bytes = cs->intermediate_bytes;
  }
  if (evaluator_) report_.eval_compiles = evaluator_->compiles();
  summarize_times(report_, first_step_ + cfg_.warmup, cfg_.batch_size * cfg_.accumulate);
  if (cb_.peak_gflops) {
    report_.peak_gflops = cb_.peak_gflops();
    report_.mfu = report_.achieved_gflops / report_.peak_gflops;
  }
  report_.peak_rss_mib = peak_rss_mib();
  const Device device = params_.begin()->second.device();
  if (!device.host_visible())
    report_.peak_device_mib = device_memory_stats(device).peak_in_use / 1048576.0;
  report_.wall_seconds = since(run_start_);
  if (log_) log_ << summary_json(report_).dump() << "\n";
}

}  // namespace

TrainReport run(const TrainConfig& cfg, const Callbacks& callbacks) {
  validate(cfg);  // before the checkpoint is read
  std::optional<io::Checkpoint> resumed = load_resume(cfg);
  std::optional<io::Pretrained> init = resumed ? std::nullopt : load_init(cfg);
  return run(cfg, std::move(resumed), callbacks, std::move(init));
}

TrainReport run(const TrainConfig& cfg, std::optional<io::Checkpoint> resumed,
                const Callbacks& callbacks, std::optional<io::Pretrained> init) {
  auto run_start = Clock::now();
  validate(cfg);
  if (!resumed && !init) init = load_init(cfg);
  dist::set_timeout(cfg.dist_timeout);
  // The f32 matmul precision of the run (process-wide, as PyTorch's
  // allow_tf32): traced into every step's matmuls.
  set_matmul_precision(cfg.precision == "tf32" ? MatmulPrecision::tf32 : MatmulPrecision::fp32);
  auto optimizer = make_optimizer(cfg);
  auto keys = random::split(random::Key(cfg.seed), 3);  // parameters, dropout, (unused)
  Start start = restore_or_init(cfg, std::move(resumed), std::move(init), *optimizer, keys[0]);
  return Trainer(cfg, callbacks, *optimizer, std::move(start), keys[1], run_start).run();
}

}  // namespace kiln::train
