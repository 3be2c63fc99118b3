// kiln train: one training step, built once per run for its mode (eager,
// eager with --compile-model, lazy, jit).
#pragma once
#include <optional>
#include <utility>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/train.h"

namespace kiln::train {

// A step's inputs besides the parameters, the model's state and the optimizer state.
struct StepInputs {
  Array images, labels;
  Array key;                   // the dropout key (random::key_array)
  std::vector<Array> scalars;  // the optimizer's f32 scalars of this step
};

// One batch's loss, gradients, and the model's state after its forward
// (BatchNorm's running statistics; empty for models without).
struct LossAndGrads {
  Array loss;
  Params grads;
  Params model_state;
};

class TrainStep {
 public:
  // `params`, `model_state` and `state` give the names the compiled steps
  // flatten by. The config, model and optimizer must outlive the step.
  TrainStep(const TrainConfig& cfg, const nn::Model& model, const optim::Optimizer& optimizer,
            const Params& params, const Params& model_state, const optim::State& state);
  TrainStep(const TrainStep&) = delete;  // the compiled functions refer to this object
  TrainStep& operator=(const TrainStep&) = delete;

  // Runs one step: `params`, `model_state` and `state` become their update
  // (in jit mode, where they are donated, their inputs again when the loss
  // is not finite). Returns the loss, whose value exists once read.
  Array operator()(Params& params, Params& model_state, optim::State& state, const StepInputs& in);
  // One step over several batches (--accumulate): the mean of their
  // gradients (clipped after averaging) updates `params` and `state` once;
  // the model's state follows each batch's forward in turn. Returns the mean
  // loss, read here: when it is not finite nothing is updated.
  Array accumulate(Params& params, Params& model_state, optim::State& state,
                   const std::vector<StepInputs>& micro);

  // The loss, the gradients (clipped to --clip-norm) and the model's state
  // after the forward of one batch, eagerly in the current scope: the eager
  // step's, and the re-run that finds where a NaN starts (which stays on
  // this rank: `across_ranks` false).
  LossAndGrads loss_and_grads(const Params& p, const Params& model_state, const Array& images,
                              const Array& labels, const Array& key, bool across_ranks = true,
                              bool clip = true) const;

  // Executables built since the step was made, and the last one's statistics
  // (none in plain eager mode).
  uint64_t compiles() const;
  // Steps that replayed a recording of the compiled step (a CUDA Graph).
  uint64_t replays() const;
  const CompileStats* last_compile() const;

 private:
  Array eager(Params& params, Params& model_state, optim::State& state, const StepInputs& in);
  Array eager_compiled(Params& params, Params& model_state, optim::State& state,
                       const StepInputs& in);
  Array whole(Params& params, Params& model_state, optim::State& state,
              const StepInputs& in);  // lazy and jit
  // The whole step over flat arrays: (parameters..., buffers..., model
  // state..., images, labels, dropout key, scalars...) -> (parameters...,
  // buffers..., model state..., loss).
  std::vector<Array> step_fn(const std::vector<Array>& args) const;
  // Forward and backward only (--compile-model): (parameters..., model
  // state..., images, labels, dropout key) -> (loss, gradients..., model state...).
  std::vector<Array> grad_fn(const std::vector<Array>& args) const;
  // --accumulate: one batch's loss and unclipped gradients (grad_fn's
  // arguments and results), and the update from their sum: (parameters...,
  // buffers..., gradient sums..., scalars...) -> (parameters..., buffers...).
  std::vector<Array> micro_fn(const std::vector<Array>& args) const;
  std::vector<Array> update_fn(const std::vector<Array>& args) const;
  std::pair<Params, optim::State> update(const Params& params, const optim::State& state,
                                         Params sums, const std::vector<Array>& scalars) const;

  const TrainConfig& cfg_;
  const nn::Model& model_;
  const optim::Optimizer& optimizer_;
  DType matmul_dtype_;
  bool dropout_;
  bool all_reduce_;  // gradients (and the loss) averaged over the ranks
  std::vector<std::string> names_, buffer_names_, state_names_;
  std::vector<std::string> grad_names_;  // of the parameters that train (trains())
  std::optional<Jitted> jitted_;         // jit: step_fn; eager with --compile-model: grad_fn
  std::optional<Jitted> micro_,
      update_;  // --accumulate in jit mode (micro_ also with --compile-model)
  uint64_t lazy_compiles_before_ = 0, lazy_replays_before_ = 0;
};

}  // namespace kiln::train
