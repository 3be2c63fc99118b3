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
  EXPECT_EQ(p.cl.train.batch_size, 8);
  train::TrainConfig cfg = cli::train_config(p.cl.train);
  EXPECT_EQ(cfg.mode, "eager");
  EXPECT_TRUE(cfg.compile_model);
  EXPECT_EQ(cfg.steps, 20);  // the default schedule of a small preset
  EXPECT_EQ(cfg.model.hidden_size, nn::ViTConfig::preset("vit-tiny").hidden_size);
  train::validate(cfg);
}

TEST(CommandLine, BadCommandLinesGiveAnExitStatusAndAMessage) {
  Parsed unknown = parse({"frobnicate"});
  EXPECT_EQ(unknown.cl.command, cli::Command::none);
  EXPECT_EQ(unknown.cl.exit_code, 2);
  EXPECT_NE(unknown.err.find("unknown command 'frobnicate'"), std::string::npos);
  Parsed ambiguous = parse({"train", "--sa", "x"});
  EXPECT_EQ(ambiguous.cl.exit_code, 2);
  EXPECT_NE(ambiguous.err.find("ambiguous flag --sa: it could be --save, --save-every"),
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
  EXPECT_THROW(cli::train_config(p.cl.train), Error);
  Parsed warmup = parse({"train", "--steps", "3", "--warmup", "3"});
  EXPECT_THROW(train::validate(cli::train_config(warmup.cl.train)), Error);
}

}  // namespace
}  // namespace kiln
