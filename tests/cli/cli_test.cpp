// The kiln command as a user runs it: good runs, and bad flags that get a
// clear error and a non-zero exit.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kiln/io.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

struct CliRun {
  int status;
  std::string output;
};

CliRun kiln_cli(const std::string& args) {
  std::string cmd = std::string(KILN_CLI_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kiln-cli-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

TEST(Cli, BadFlagsFailWithAClearMessage) {
  struct Case {
    std::string args, message;
  } cases[] = {
      {"train --batch-size 0", "--batch-size"},
      {"train --batch-size abc", "--batch-size"},
      {"train --model vit-huge", "--model"},
      {"train --layout xyz", "--layout"},
      {"train --mode jax --compile-model", "--compile-model goes with --mode eager"},
      {"train --mode tpu", "--mode"},
      {"train --steps 3 --warmup 3", "--warmup must lie in [0, --steps)"},
      {"train --config /nonexistent/config.json", "--config"},
      {"train --model vit-tiny --config " + std::string(KILN_FIXTURES_DIR) +
           "/vit_golden/config.json",
       "excludes"},
      {"grad --config x.json", "--config"},
      {"frobnicate", "unknown command 'frobnicate'"},
      {"", "subcommand"},
  };
  for (auto& c : cases) {
    CliRun r = kiln_cli(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << " printed:\n" << r.output;
  }
}

TEST(Cli, TrainRunsASmallConfigAndLogsJson) {
  std::string cfg = temp_path("config.json"), log = temp_path("log.jsonl");
  nn::ViTConfig c = nn::ViTConfig::preset("vit-tiny");
  c.image_size = 32, c.patch_size = 8, c.hidden_size = 32, c.num_attention_heads = 4;
  c.intermediate_size = 64, c.num_hidden_layers = 2, c.num_labels = 10;
  io::save_vit_config(cfg, c);
  CliRun r =
      kiln_cli("train --config " + cfg + " --steps 4 --warmup 1 --batch-size 8 --log-json " + log);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("kiln train: mode eager (pytorch)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("average step time: "), std::string::npos);
  EXPECT_NE(r.output.find("model FLOP utilization"), std::string::npos);
  std::ifstream in(log);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 5);  // 4 steps and the summary
  for (std::string mode : {"jax", "torch_xla", "pytorch --compile-model"}) {
    CliRun m =
        kiln_cli("train --config " + cfg + " --steps 3 --warmup 1 --batch-size 4 --mode " + mode);
    ASSERT_EQ(m.status, 0) << mode << ":\n" << m.output;
    EXPECT_NE(m.output.find("1 compilation;"), std::string::npos) << mode << ":\n" << m.output;
  }
  std::filesystem::remove(cfg);
  std::filesystem::remove(log);
}

TEST(Cli, DropoutGivesTheSameLossesInEveryMode) {
  std::string cfg = temp_path("dropout.json");
  nn::ViTConfig c = nn::ViTConfig::preset("vit-tiny");
  c.image_size = 32, c.patch_size = 8, c.hidden_size = 32, c.num_attention_heads = 4;
  c.intermediate_size = 64, c.num_hidden_layers = 1, c.num_labels = 10;
  c.hidden_dropout_prob = 0.1;
  io::save_vit_config(cfg, c);
  // The dropout key is an argument of the compiled step: the masks change
  // every step and equal eager mode's.
  auto losses = [&](const std::string& mode) {
    std::string log = temp_path(mode + ".jsonl");
    CliRun r = kiln_cli("train --config " + cfg + " --steps 3 --warmup 1 --batch-size 4 --mode " +
                        mode + " --log-json " + log);
    EXPECT_EQ(r.status, 0) << mode << ":\n" << r.output;
    std::vector<std::string> out;
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);)
      if (line.find("\"summary\"") == std::string::npos)
        out.push_back(line.substr(line.find("\"loss\""), 20));
    std::filesystem::remove(log);
    return out;
  };
  auto eager = losses("eager");
  ASSERT_EQ(eager.size(), 3u);
  EXPECT_NE(eager[0], eager[1]);
  EXPECT_EQ(losses("jit"), eager);
  EXPECT_EQ(losses("lazy"), eager);
  std::filesystem::remove(cfg);
}

TEST(Cli, GradWritesLossLogitsAndEveryGradient) {
  std::string dir = std::string(KILN_FIXTURES_DIR) + "/vit_golden/",
              out = temp_path("grads.safetensors");
  CliRun r = kiln_cli("grad --config " + dir + "config.json --weights " + dir +
                      "model.safetensors --batch " + dir + "batch.safetensors --out " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  auto got = io::load_safetensors(out).tensors;
  auto want = io::load_safetensors(dir + "expected.safetensors").tensors;
  EXPECT_EQ(got.at("loss").shape(), Shape{});
  EXPECT_NEAR(got.at("loss").item<double>(), want.at("loss").item<double>(), 1e-5);
  EXPECT_EQ(got.at("logits").shape(), (Shape{4, 10}));
  EXPECT_EQ(got.size(), 2 + io::load_safetensors(dir + "model.safetensors").tensors.size());
  EXPECT_TRUE(got.count("grad.vit.embeddings.patch_embeddings.projection.weight"));
  std::filesystem::remove(out);
}

TEST(Cli, GradRejectsWeightsOfAnotherModel) {
  std::string dir = std::string(KILN_FIXTURES_DIR) + "/vit_golden/";
  std::string cfg = temp_path("other.json");
  nn::ViTConfig c = io::load_vit_config(dir + "config.json");
  c.intermediate_size = 128;
  io::save_vit_config(cfg, c);
  CliRun r = kiln_cli("grad --config " + cfg + " --weights " + dir + "model.safetensors --batch " +
                      dir + "batch.safetensors --out " + temp_path("x.safetensors"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("[weights] parameter 'vit.encoder.layer.0.intermediate.dense.weight' has "
                          "shape (64,32), expected (128,32)"),
            std::string::npos)
      << r.output;
  std::filesystem::remove(cfg);
}

}  // namespace
}  // namespace kiln
