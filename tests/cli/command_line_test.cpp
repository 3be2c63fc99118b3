// kiln's flags parsed and checked without running anything
// (tools/kiln/command_line.h): what `kiln` would run, or its exit status.
#include <gtest/gtest.h>

#include <sstream>

#include "command_line.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

struct Parsed {
  cli::CommandLine cl;
  std::string out, err;
};

Parsed parse(const std::vector<std::string>& args) {
  std::vector<std::string> argv{"kiln"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::ostringstream out, err;
  cli::CommandLine cl = cli::parse_command_line(argv, out, err);
  return {cl, out.str(), err.str()};
}

TEST(CommandLine, AbbreviatedFlagsAndModeAliasesResolveToATrainConfig) {
  Parsed p = parse({"train", "--batch=8", "--compile", "--mode", "pytorch", "--model", "vit-tiny"});
  ASSERT_EQ(p.cl.command, cli::Command::train) << p.err;
  EXPECT_EQ(p.cl.train.config.batch_size, 8);
  train::TrainConfig cfg = cli::train_config(p.cl.train);
  EXPECT_EQ(cfg.mode, train::Mode::eager);
  EXPECT_TRUE(cfg.compile_model);
  EXPECT_EQ(cfg.steps, 20);  // the default schedule of a small preset
  EXPECT_EQ(nn::as_vit(*cfg.model)->config().hidden_size,
            nn::ViTConfig::preset("vit-tiny").hidden_size);
  train::validate(cfg);
}

// Each mode name or alias is parsed once, into the config's enum; flags that
// are settings of the run land in the TrainConfig as given.
TEST(CommandLine, TrainFlagsParseStraightIntoTheTrainConfig) {
  for (auto [flag, mode] : {std::pair{"jax", train::Mode::jit},
                            {"jit", train::Mode::jit},
                            {"torch_xla", train::Mode::lazy},
                            {"lazy", train::Mode::lazy},
                            {"pytorch", train::Mode::eager},
                            {"eager", train::Mode::eager}}) {
    Parsed p = parse({"train", "--mode", flag, "--compile-model"});
    ASSERT_EQ(p.cl.command, cli::Command::train) << p.err;
    EXPECT_EQ(p.cl.train.mode, flag);  // as spelled, for the reference script's header
    train::TrainConfig cfg = cli::train_config(p.cl.train);
    EXPECT_EQ(cfg.mode, mode) << flag;
    // --compile-model changes only the eager mode (train::prepare).
    EXPECT_EQ(train::prepare(cfg).config.compile_model, mode == train::Mode::eager) << flag;
  }
  Parsed p = parse({"train", "--lr", "0.5", "--save", "ck", "--save-every", "3", "--optimizer",
                    "adamw", "--layout", "nhwc", "--attention", "unfused", "--precision", "bf16",
                    "--warmup", "0", "--model", "vit-small"});
  ASSERT_EQ(p.cl.command, cli::Command::train) << p.err;
  train::TrainConfig cfg = cli::train_config(p.cl.train);
  EXPECT_EQ(cfg.lr, 0.5);
  EXPECT_EQ(cfg.save_dir, "ck");
  EXPECT_EQ(cfg.save_every, 3);
  EXPECT_EQ(cfg.optimizer, "adamw");
  EXPECT_EQ(cfg.layout, nn::Layout::NHWC);
  EXPECT_FALSE(cfg.fused_attention);
  EXPECT_EQ(cfg.precision, "bf16");
  EXPECT_EQ(cfg.steps, 20);
  EXPECT_EQ(cfg.warmup, 0);
  EXPECT_EQ(cfg.model_name, "vit-small");
  train::validate(cfg);
  // --epochs: the steps of whole passes, the default warm-up cut to fit.
  Parsed e = parse({"train", "--data", "fashion-mnist", "--model", "vit-fmnist", "--epochs", "2",
                    "--batch-size", "40"});
  ASSERT_EQ(e.cl.command, cli::Command::train) << e.err;
  cfg = cli::train_config(e.cl.train);
  train::steps_for_epochs(cfg, e.cl.train.epochs, 100);
  EXPECT_EQ(cfg.steps, 4);
  EXPECT_EQ(cfg.warmup, 2);
  train::steps_for_epochs(cfg, 1, 50);
  EXPECT_EQ(cfg.steps, 1);
  EXPECT_EQ(cfg.warmup, 0);
  EXPECT_THROW(train::steps_for_epochs(cfg, 1, 39), Error);  // fewer samples than a batch
}

TEST(CommandLine, BadCommandLinesGiveAnExitStatusAndAMessage) {
  Parsed unknown = parse({"frobnicate"});
  EXPECT_EQ(unknown.cl.command, cli::Command::none);
  EXPECT_EQ(unknown.cl.exit_code, 2);
  EXPECT_NE(unknown.err.find("unknown command 'frobnicate'"), std::string::npos);
  Parsed ambiguous = parse({"train", "--sa", "x"});
  EXPECT_EQ(ambiguous.cl.exit_code, 2);
  EXPECT_NE(
      ambiguous.err.find("ambiguous flag --sa: it could be --save-best, --save, --save-every"),
      std::string::npos);
  Parsed zero = parse({"train", "--batch-size", "0"});
  EXPECT_NE(zero.cl.exit_code, 0);
  EXPECT_NE(zero.err.find("--batch-size: expected an integer above 0, got 0"), std::string::npos);
  Parsed help = parse({"eval", "--help"});
  EXPECT_EQ(help.cl.command, cli::Command::none);
  EXPECT_EQ(help.cl.exit_code, 0);
  EXPECT_NE(help.out.find("--checkpoint"), std::string::npos);
}

TEST(CommandLine, TrainFlagsThatDisagreeFailBeforeAnythingLoads) {
  Parsed p = parse({"train", "--optimizer", "adamw", "--momentum", "0.9"});
  ASSERT_EQ(p.cl.command, cli::Command::train);
  EXPECT_THROW(train::validate(cli::train_config(p.cl.train)), Error);
  Parsed warmup = parse({"train", "--steps", "3", "--warmup", "3"});
  EXPECT_THROW(train::validate(cli::train_config(warmup.cl.train)), Error);
}

}  // namespace
}  // namespace kiln
