// kiln — the command line's subcommands and flags: parsed and checked without
// running anything, so that main.cpp runs the result and fuzz/ can feed the
// parser arbitrary argument lists.
#pragma once
#include <cstdint>
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

struct EvalFlags {
  std::string checkpoint, data = "fashion-mnist", data_dir = data::kFashionMnistDir, split = "test",
                          mode = "jit", layout = "nchw";
  int64_t batch_size = 256;
};

struct PlotFlags {
  std::string log, out;
};

struct GradFlags {
  std::string config, weights, batch, out, layout = "nchw";
};

enum class Command { none, demo, info, train, eval, plot, grad };

struct CommandLine {
  // none: nothing to run; `exit_code` is kiln's exit status (0 after --help,
  // 2 for an unknown command or an ambiguous flag, CLI11's code for its errors).
  Command command = Command::none;
  int exit_code = 0;
  DemoOptions demo;
  TrainFlags train;
  EvalFlags eval;
  PlotFlags plot;
  GradFlags grad;
};

// Parses kiln's arguments (args[0] is the program's name). Help goes to `out`,
// the errors of a bad command line to `err`, as CLI11 prints them.
CommandLine parse_command_line(const std::vector<std::string>& args, std::ostream& out,
                               std::ostream& err);

// The TrainConfig of `kiln train`'s flags: mode aliases resolved, the default
// schedule, the model from --config or --resume (read here, so that a bad file
// fails before anything runs). Updates `f` to the resolved values. Data is not
// loaded: with --epochs the caller turns the training split's size into steps.
train::TrainConfig train_config(TrainFlags& f);

// The long flag names of every subcommand (`--batch-size`), and the
// subcommands' names: the words fuzz/'s command-line dictionary is made of.
std::vector<std::string> command_line_words();

}  // namespace kiln::cli
