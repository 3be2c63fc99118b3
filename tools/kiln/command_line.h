// kiln — the command line's subcommands and flags: parsed and checked without
// running anything, so that main.cpp runs the result and fuzz/ can feed the
// parser arbitrary argument lists.
#pragma once
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kiln/data.h"
#include "kiln/train.h"

namespace kiln::cli {

struct DemoOptions {
  int steps = 300;
  double lr = 0.1;
  std::string mode = "eager";
  uint64_t seed = 0;
  int threads = 0;
};

// `kiln train`'s flags. Those that are settings of the run are parsed
// straight into `config` (train::run's TrainConfig); the others are the
// command line's own, resolved into it by train_config().
struct TrainFlags {
  train::TrainConfig config;
  std::string mode = "jax";  // as spelled (the reference script's default; its header prints it)
  std::string model = "vit-base", config_file;  // --model PRESET or --config FILE
  std::string layout = "nchw", attention = "fused", all_reduce = "auto", image_size;
  int threads = 0;
  int64_t epochs = 0, print_every = 0;
  bool steps_given = false, warmup_given = false;
  std::vector<double> crop_scale, crop_ratio;  // --crop-scale, --crop-ratio: MIN,MAX
  bool no_crop = false;
  std::string rand_augment;  // timm's config string (parsed into the TrainConfig)
};

struct EvalFlags {
  std::string checkpoint, model, image_size,
      data = "fashion-mnist", data_dir = data::kFashionMnistDir, split = "test", mode = "jit",
      layout = "nchw", device = "cpu", tokenizer;
  int64_t batch_size = 0;  // 0: 256 images, or 8 blocks of a language model
  int64_t seq_len = 0;     // 0: the model's n_positions
  int64_t samples = 0;     // 0: the whole split
};

struct PredictFlags {
  std::string model, image_size, mode = "jit", device = "cpu", precision = "fp32";
  std::vector<std::string> inputs;  // files and folders
  int64_t top_k = 5, batch_size = 32;
  int threads = 0, workers = 2;
  bool json = false;
};

struct GenerateFlags {
  std::string model, prompt, tokenizer, mode = "jit", device = "cpu", precision = "fp32";
  int64_t max_new_tokens = 50, top_k = 0;
  double temperature = 0, top_p = 1.0;
  uint64_t seed = 0;
  int threads = 0;
  bool ignore_eos = false;
};

struct PlotFlags {
  std::string log, out;
};

struct GradFlags {
  std::string config, weights, batch, out, layout = "nchw", device = "cpu";
};

enum class Command { none, demo, info, train, eval, predict, generate, plot, grad };

struct CommandLine {
  // none: nothing to run; `exit_code` is kiln's exit status (0 after --help,
  // 2 for an unknown command or an ambiguous flag, CLI11's code for its errors).
  Command command = Command::none;
  int exit_code = 0;
  DemoOptions demo;
  TrainFlags train;
  EvalFlags eval;
  PredictFlags predict;
  GenerateFlags generate;
  PlotFlags plot;
  GradFlags grad;
};

// Parses kiln's arguments (args[0] is the program's name). Help goes to `out`,
// the errors of a bad command line to `err`, as CLI11 prints them.
CommandLine parse_command_line(const std::vector<std::string>& args, std::ostream& out,
                               std::ostream& err);

// The TrainConfig of `kiln train`'s flags: the mode parsed (its aliases
// resolved), the default schedule where --steps and --warmup are not given,
// the model from --config or the preset, and the command line's own checks
// (--epochs with --steps). train::prepare does the rest, as for
// kiln.train.run: --compile-model dropped outside eager mode, a new ViT
// resized to --image-size, --resume's checkpoint or --init-from's model
// loaded, --epochs turned into steps, and train::validate's checks.
train::TrainConfig train_config(const TrainFlags& f);
// A training run set up from `kiln train`'s flags: train::prepare of
// train_config's config and --epochs.
train::Setup prepare_train(const TrainFlags& f);

// --image-size's value, H (a square) or HxW, or none when it is not one.
std::optional<nn::Size2d> parse_image_size(const std::string& s);

// The long flag names of every subcommand (`--batch-size`), and the
// subcommands' names: the words fuzz/'s command-line dictionary is made of.
std::vector<std::string> command_line_words();

}  // namespace kiln::cli
