// The kiln command as a user runs it: good runs, and bad flags that get a
// clear error and a non-zero exit.
#include <gtest/gtest.h>
#include <png.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "backend/cpu/sgemm.h"
#include "kiln/data.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

struct CliRun {
  int status;
  std::string output;
};

// Runs a shell command line, stdout and stderr together.
CliRun kiln_cli_raw(const std::string& command) {
  std::string cmd = command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

CliRun kiln_cli(const std::string& args) {
  return kiln_cli_raw(test_util::kiln_cli_path() + " " + args);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kiln-cli-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

TEST(Cli, BadFlagsFailWithAClearMessage) {
  ::setenv("HF_HUB_OFFLINE", "1", 1);  // a Hub id that is not cached is an error, not a download
  struct Case {
    std::string args, message;
  } cases[] = {
      {"train --batch-size 0", "--batch-size: expected an integer above 0, got 0"},
      {"train --batch-size abc", "--batch-size: expected an integer, got 'abc'"},
      {"train --steps 2.5", "--steps: expected an integer, got '2.5'"},
      {"train --lr -1", "--lr: expected a number of 0 or more, got -1"},
      {"train --clip-norm 1e-3x", "--clip-norm: expected a number, got '1e-3x'"},
      {"train --model vit-huge", "--model"},
      {"train --layout xyz", "--layout"},
      {"train --sa x", "ambiguous flag --sa: it could be --save-best, --save, --save-every"},
      {"train --mode tpu", "--mode"},
      {"train --bucket-mb 0", "--bucket-mb: expected a number above 0, got 0"},
      {"train --dist-timeout -1", "--dist-timeout: expected a number of 0 or more, got -1"},
      {"train --check-replicas 1.5", "--check-replicas: expected an integer, got '1.5'"},
      {"train --all-reduce sometimes", "--all-reduce"},
      {"train --steps 3 --warmup 3", "--warmup must lie in [0, --steps)"},
      {"train --config /nonexistent/config.json", "--config"},
      {"train --model vit-tiny --config " + std::string(KILN_FIXTURES_DIR) +
           "/vit_golden/config.json",
       "excludes"},
      {"grad --config x.json", "--config"},
      {"train --precision tf32", "--precision tf32 is a CUDA setting"},
      {"train --precision fp16", "--precision"},
      {"train --data imagenet", "--data"},
      {"train --data fashion-mnist --model vit-tiny", "needs a model with num_channels 1"},
      {"train --epochs 2", "--epochs needs a finite data set"},
      {"train --data fashion-mnist --model vit-fmnist --epochs 1 --steps 5", "give one"},
      {"train --optimizer adamw --momentum 0.9", "--momentum goes with --optimizer sgd"},
      {"train --schedule cosine --lr-warmup 30 --steps 20", "cosine decay needs total steps"},
      {"train --resume /nonexistent-checkpoint", "--resume"},
      {"eval --checkpoint /nonexistent-checkpoint", "no such checkpoint directory"},
      {"eval --data fashion-mnist",
       "give --checkpoint DIR (written by kiln train --save) or --model SRC"},
      {"eval --model " + std::string(KILN_FIXTURES_DIR) + "/pretrained/v4-headless",
       "no classifier (a ViTModel checkpoint): fine-tune it first"},
      {"train --init-from /nonexistent/model",
       "/nonexistent/model: not a folder, and not a Hub id"},
      {"train --init-from org/not-cached",
       "org/not-cached: not a folder, and not in the Hugging Face cache"},
      {"train --model vit-tiny --init-from org/x", "excludes"},
      {"train --image-size 0",
       "--image-size: expected H or HxW (positive integers, e.g. 384 or 224x320), got '0'"},
      {"train --image-size 224x", "--image-size: expected H or HxW"},
      {"eval --checkpoint x --image-size 32", "--image-size goes with --model"},
      {"plot /nonexistent.jsonl -o x.svg", "log"},
      {"plot " + std::string(KILN_FIXTURES_DIR) + "/vit_golden/config.json -o x.jpg",
       "kiln plot writes PNG or SVG"},
      {"frobnicate", "unknown command 'frobnicate'"},
      {"", "subcommand"},
  };
  for (auto& c : cases) {
    CliRun r = kiln_cli(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << " printed:\n" << r.output;
  }
}

// `kiln info` names the f32 GEMM library; KILN_SGEMM picks oneDNN's, and a
// bad value stops a run with a message instead of running on either.
TEST(Cli, InfoNamesTheGemmLibraryAndKilnSgemmIsChecked) {
  const std::string cli = test_util::kiln_cli_path();
  CliRun info = kiln_cli("info");
  ASSERT_EQ(info.status, 0) << info.output;
  // This process and the command share the remembered choice (sgemm.h).
  EXPECT_NE(
      info.output.find(std::string("f32 GEMM: ") +
                       (cpu::sgemm_library() == cpu::SgemmLibrary::onemkl ? "oneMKL" : "oneDNN")),
      std::string::npos)
      << info.output;
  CliRun onednn = kiln_cli_raw("KILN_SGEMM=onednn " + cli + " info");
  EXPECT_NE(onednn.output.find("(dnnl_sgemm)"), std::string::npos) << onednn.output;
  EXPECT_NE(onednn.output.find("; KILN_SGEMM=onednn"), std::string::npos) << onednn.output;
  CliRun bad = kiln_cli_raw("KILN_SGEMM=mkl " + cli + " train --config " +
                            std::string(KILN_FIXTURES_DIR) + "/vit_golden/config.json --steps 1");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("KILN_SGEMM is 'mkl', expected auto, onemkl or onednn"),
            std::string::npos)
      << bad.output;
}

// With oneMKL built in, the first process on a machine times both libraries
// and remembers the faster; later processes read the same choice.
TEST(Cli, TheMeasuredGemmLibraryIsRemembered) {
  if (!cpu::have_onemkl()) GTEST_SKIP() << "one GEMM library only: nothing to choose";
  const std::string dir = temp_path("cache"), cli = test_util::kiln_cli_path();
  std::filesystem::remove_all(dir);
  CliRun first = kiln_cli_raw("KILN_SGEMM=auto KILN_CACHE_DIR=" + dir + " " + cli + " info");
  CliRun second = kiln_cli_raw("KILN_CACHE_DIR=" + dir + " " + cli + " info");
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(first.output.find("measured faster on this machine ("), std::string::npos)
      << first.output;
  EXPECT_NE(first.output.find(" ms against "), std::string::npos) << first.output;
  EXPECT_NE(second.output.find("(remembered in " + dir + "/sgemm-choice-"), std::string::npos)
      << second.output;
  auto library = [](const std::string& out) {
    size_t at = out.find("f32 GEMM: ");
    return at == std::string::npos ? std::string() : out.substr(at, 16);
  };
  EXPECT_EQ(library(first.output), library(second.output));
  std::filesystem::remove_all(dir);
}

TEST(Cli, TrainRunsASmallConfigAndLogsJson) {
  std::string cfg = temp_path("config.json"), log = temp_path("log.jsonl");
  nn::ViTConfig c = nn::ViTConfig::preset("vit-tiny");
  c.image_size = 32, c.patch_size = 8, c.hidden_size = 32, c.num_attention_heads = 4;
  c.intermediate_size = 64, c.num_hidden_layers = 2, c.num_labels = 10;
  io::save_config(cfg, c);
  CliRun r =
      kiln_cli("train --config " + cfg + " --steps 4 --warmup 1 --batch-size 8 --log-json " + log);
  ASSERT_EQ(r.status, 0) << r.output;
  // The reference script's default mode is jax, and so is kiln's.
  EXPECT_NE(r.output.find("kiln train: mode jit (jax)"), std::string::npos) << r.output;
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

// `kiln train --device cuda` on a ViT-Tiny (vit-tiny's width and heads, two
// of its twelve layers, at 32 x 32 pixels, so that the CUDA emulator runs
// each step in about a second) in each mode, in tf32 and bf16: the losses of
// the cpu's fp32 run, to tf32's and bf16's rounding. A GPU test.
TEST(Cli, GpuVitTinyTrainsInEveryModeAsOnTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  const std::string cfg = temp_path("vit-tiny-2.json");
  std::ofstream(cfg) << R"({"model_type": "vit", "hidden_size": 192, "num_hidden_layers": 2,
    "num_attention_heads": 3, "intermediate_size": 768, "image_size": 32, "patch_size": 16})";
  auto losses = [&](const std::string& flags) {
    const std::string log = temp_path("gpu-losses.jsonl");
    CliRun r = kiln_cli("train --config " + cfg + " --batch-size 2 --steps 2 --warmup 1 " + flags +
                        " --log-json " + log);
    EXPECT_EQ(r.status, 0) << flags << ":\n" << r.output;
    std::vector<double> out;
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) out.push_back(j["loss"].get<double>());
    }
    std::filesystem::remove(log);
    return out;
  };
  const std::vector<double> cpu = losses("--device cpu --precision fp32");
  ASSERT_EQ(cpu.size(), 2u);
  for (const char* mode : {"eager", "lazy", "jit"})
    for (auto [precision, tol] : {std::pair{"tf32", 5e-3}, std::pair{"bf16", 3e-2}}) {
      SCOPED_TRACE(std::string(mode) + " " + precision);
      const std::vector<double> gpu =
          losses(std::string("--device cuda --mode ") + mode + " --precision " + precision);
      ASSERT_EQ(gpu.size(), cpu.size());
      for (size_t i = 0; i < cpu.size(); ++i)
        EXPECT_NEAR(gpu[i], cpu[i], tol * cpu[i]) << "step " << i + 1;
    }
  std::filesystem::remove(cfg);
}

#ifdef KILN_CUDA_EMULATION
// A build that runs the CUDA backend on kiln's CUDA emulator shows no CUDA
// device to a user who has not asked for emulated ones, and says how to.
TEST(Cli, AnEmulationBuildShowsNoCudaDeviceUnlessAskedFor) {
  const std::string cli = test_util::kiln_cli_path();
  CliRun r = kiln_cli_raw("env KILN_CUDA_EMULATOR=0 " + cli + " train --device cuda --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--device cuda: no usable CUDA driver or GPU (cudaErrorNoDevice: this "
                          "kiln runs its CUDA backend on kiln's CUDA emulator"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("KILN_CUDA_EMULATOR=2 gives it two emulated devices"), std::string::npos)
      << r.output;
  CliRun info = kiln_cli_raw("env KILN_CUDA_EMULATOR=2 " + cli + " info");
  ASSERT_EQ(info.status, 0) << info.output;
  EXPECT_NE(info.output.find("cuda:1 (kiln CUDA emulator (sm_90))"), std::string::npos)
      << info.output;
}
#endif

// The reference script's first three lines, byte for byte (its f-strings
// leave a space after the mode and the batch size), with the mode as spelled,
// and its flags as argparse takes them: abbreviated and with `=`.
TEST(Cli, TrainPrintsTheReferenceScriptsHeader) {
  std::string cfg = temp_path("header.json");
  nn::ViTConfig c = nn::ViTConfig::preset("vit-tiny");
  c.image_size = 16, c.patch_size = 8, c.hidden_size = 16, c.num_attention_heads = 2;
  c.intermediate_size = 32, c.num_hidden_layers = 1, c.num_labels = 5;
  io::save_config(cfg, c);
  struct Case {
    std::string flags, header, mode;
  } cases[] = {
      {"--batch-size 4", "Mode: jax \nBatch size: 4 \nCompile model: False\n", "jit (jax)"},
      {"--mode pytorch --batch 4 --compile",
       "Mode: pytorch \nBatch size: 4 \nCompile model: True\n",
       "eager (pytorch) with --compile-model"},
      {"--mode=torch_xla --batch-size=4 --compile-model",
       "Mode: torch_xla \nBatch size: 4 \nCompile model: True\n", "lazy (torch_xla),"},
      {"--mode eager --batch-size 4", "Mode: eager \nBatch size: 4 \nCompile model: False\n",
       "eager (pytorch),"},
  };
  for (auto& k : cases) {
    CliRun r = kiln_cli("train --config " + cfg + " --steps 2 --warmup 1 " + k.flags);
    ASSERT_EQ(r.status, 0) << k.flags << ":\n" << r.output;
    EXPECT_EQ(r.output.substr(0, k.header.size()), k.header) << k.flags << ":\n" << r.output;
    EXPECT_NE(r.output.find("kiln train: mode " + k.mode), std::string::npos) << k.flags << ":\n"
                                                                              << r.output;
  }
  std::filesystem::remove(cfg);
}

// config.json as transformers writes it for a model beyond the default:
// `kiln train` takes it in every mode, and `kiln grad` computes transformers'
// regression loss from float labels.
TEST(Cli, TrainAndGradTakeTransformersConfigsBeyondTheDefault) {
  std::string cfg = temp_path("beyond.json");
  std::ofstream(cfg) << R"({"model_type": "vit", "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 2, "intermediate_size": 32, "hidden_act": "quick_gelu",
    "image_size": [18, 13], "patch_size": [5, 4], "qkv_bias": false,
    "pruned_heads": {"0": [1]}, "problem_type": "multi_label_classification",
    "id2label": {"0": "a", "1": "b", "2": "c"}, "attn_implementation": "sdpa",
    "encoder_stride": 16, "torch_dtype": "float32"})";
  for (const char* mode : {"eager", "lazy", "jit"}) {
    CliRun r =
        kiln_cli("train --config " + cfg + " --steps 2 --warmup 1 --batch-size 4 --mode " + mode);
    ASSERT_EQ(r.status, 0) << mode << ":\n" << r.output;
    EXPECT_NE(r.output.find("18x13 images (NCHW) of random data, 3 labels "
                            "(multi_label_classification)"),
              std::string::npos)
        << r.output;
  }
  std::filesystem::remove(cfg);

  std::string dir = std::string(KILN_FIXTURES_DIR) + "/vit_configs/regression/";
  std::string out = temp_path("grad.safetensors");
  CliRun g = kiln_cli("grad --config " + dir + "config.json --weights " + dir +
                      "model.safetensors --batch " + dir + "golden.safetensors --out " + out);
  ASSERT_EQ(g.status, 0) << g.output;
  float loss = io::load_safetensors(out).tensors.at("loss").item<float>();
  float want = io::load_safetensors(dir + "golden.safetensors").tensors.at("loss").item<float>();
  EXPECT_NEAR(loss, want, 1e-5 * want);
  std::filesystem::remove(out);
}

// On a terminal (util-linux `script` provides one) kiln train draws a
// progress bar that rewrites one line; without one it prints plain lines.
TEST(Cli, ProgressBarOnATerminal) {
  if (std::system("script -qec true /dev/null > /dev/null 2>&1") != 0)
    GTEST_SKIP()
        << "no terminal to be had here (util-linux script missing, or no pseudo-terminals)";
  std::string cfg = temp_path("tty.json");
  nn::ViTConfig c = nn::ViTConfig::preset("vit-tiny");
  c.image_size = 16, c.patch_size = 8, c.hidden_size = 16, c.num_attention_heads = 2;
  c.intermediate_size = 32, c.num_hidden_layers = 1, c.num_labels = 5;
  io::save_config(cfg, c);
  std::string train = test_util::kiln_cli_path() + " train --config " + cfg +
                      " --steps 3 --warmup 1 --batch-size 4";
  CliRun tty = kiln_cli_raw("script -qec '" + train + "' /dev/null");
  ASSERT_EQ(tty.status, 0) << tty.output;
  EXPECT_NE(tty.output.find("\r\033[K[#"), std::string::npos) << tty.output;
  EXPECT_NE(tty.output.find("img/s  ETA"), std::string::npos) << tty.output;
  CliRun plain = kiln_cli_raw(train);
  ASSERT_EQ(plain.status, 0) << plain.output;
  EXPECT_EQ(plain.output.find("\033[K"), std::string::npos) << plain.output;
  EXPECT_NE(plain.output.find("step 2/3  loss"), std::string::npos) << plain.output;
  std::filesystem::remove(cfg);
}

TEST(Cli, DropoutGivesTheSameLossesInEveryMode) {
  std::string cfg = temp_path("dropout.json");
  nn::ViTConfig c = nn::ViTConfig::preset("vit-tiny");
  c.image_size = 32, c.patch_size = 8, c.hidden_size = 32, c.num_attention_heads = 4;
  c.intermediate_size = 64, c.num_hidden_layers = 1, c.num_labels = 10;
  c.hidden_dropout_prob = 0.1;
  io::save_config(cfg, c);
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

// KILN_FALLBACK runs the named fused primitives (or all) as their fallbacks
// of basic primitives: the same losses to rounding, said under KILN_DEBUG;
// a name that is not such a primitive is an error naming the variable.
TEST(Cli, FallbacksForcedByTheEnvironmentTrainAsTheKernelsDo) {
  std::string cfg = temp_path("fallback.json");
  nn::ViTConfig c = nn::ViTConfig::preset("vit-tiny");
  c.image_size = 32, c.patch_size = 8, c.hidden_size = 32, c.num_attention_heads = 4;
  c.intermediate_size = 64, c.num_hidden_layers = 1, c.num_labels = 10;
  io::save_config(cfg, c);
  auto losses = [&](const std::string& env, const std::string& mode, std::string* output) {
    std::string log = temp_path(mode + "-fallback.jsonl");
    CliRun r =
        kiln_cli_raw(env + " " + test_util::kiln_cli_path() + " train --config " + cfg +
                     " --steps 3 --warmup 1 --batch-size 4 --mode " + mode + " --log-json " + log);
    EXPECT_EQ(r.status, 0) << env << " " << mode << ":\n" << r.output;
    if (output) *output = r.output;
    std::vector<double> out;
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);)
      if (line.find("\"summary\"") == std::string::npos)
        out.push_back(std::stod(line.substr(line.find("\"loss\"") + 7)));
    std::filesystem::remove(log);
    return out;
  };
  for (std::string mode : {"eager", "jit"}) {
    SCOPED_TRACE(mode);
    const std::vector<double> kernels = losses("", mode, nullptr);
    std::string said;
    const std::vector<double> fallbacks = losses("KILN_FALLBACK=all KILN_DEBUG=1", mode, &said);
    ASSERT_EQ(kernels.size(), 3u);
    ASSERT_EQ(fallbacks.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(fallbacks[i], kernels[i], 1e-4);
    EXPECT_NE(said.find("[fallback] Attention on cpu runs its fallback of basic primitives "
                        "(KILN_FALLBACK)"),
              std::string::npos)
        << said;
  }
  CliRun bad = kiln_cli_raw("KILN_FALLBACK=Attention,Nope " + test_util::kiln_cli_path() +
                            " train --config " + cfg + " --steps 1 --batch-size 2");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("[KILN_FALLBACK] 'Nope' is not a primitive with a fallback"),
            std::string::npos)
      << bad.output;
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

// A ResNet from its config.json through kiln train (BatchNorm's statistics
// saved in the checkpoint) and kiln eval, which gives the run's final
// accuracy from the checkpoint; bf16 mixed precision trains it as well.
TEST(Cli, AResNetTrainsAndEvaluatesOnFashionMnist) {
  if (!std::filesystem::exists(std::string(data::kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  std::string cfg = temp_path("resnet.json"), ckpt = temp_path("resnet-ckpt");
  std::ofstream(cfg) << R"({"model_type": "resnet", "embedding_size": 8, "hidden_sizes": [8, 16],
    "depths": [1, 1], "layer_type": "basic", "num_channels": 1, "num_labels": 10})";
  CliRun r = kiln_cli("train --data fashion-mnist --config " + cfg +
                      " --steps 20 --warmup 1 --batch-size 64 --mode jit --optimizer adamw"
                      " --lr 3e-3 --save " +
                      ckpt);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("28x28 images (NCHW) of fashion-mnist, 10 labels"), std::string::npos)
      << r.output;
  size_t at = r.output.find("final test accuracy ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string acc = r.output.substr(at + 20, r.output.find('%', at) - at - 20);
  EXPECT_GT(std::stod(acc), 15.0) << r.output;  // chance: 10%
  CliRun e = kiln_cli("eval --checkpoint " + ckpt + " --data fashion-mnist");
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find("(step 20) on fashion-mnist test"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("accuracy " + acc + "%"), std::string::npos) << e.output << r.output;
  EXPECT_NE(e.output.find("(10000 images"), std::string::npos) << e.output;
  // --samples N: N of the split's images, spread over it; N at or above the
  // split's size is all of it, and a negative N is refused naming the flag.
  CliRun s = kiln_cli("eval --checkpoint " + ckpt + " --data fashion-mnist --samples 250");
  ASSERT_EQ(s.status, 0) << s.output;
  EXPECT_NE(s.output.find("(250 images"), std::string::npos) << s.output;
  CliRun all = kiln_cli("eval --checkpoint " + ckpt + " --data fashion-mnist --samples 20000");
  ASSERT_EQ(all.status, 0) << all.output;
  EXPECT_NE(all.output.find("accuracy " + acc + "% (10000 images"), std::string::npos)
      << all.output;
  CliRun bad = kiln_cli("eval --checkpoint " + ckpt + " --data fashion-mnist --samples -3");
  EXPECT_NE(bad.status, 0) << bad.output;
  EXPECT_NE(bad.output.find("--samples"), std::string::npos) << bad.output;
  // bf16 mixed precision trains it too, in every mode.
  for (const char* mode : {"eager", "jit"}) {
    CliRun b = kiln_cli("train --data fashion-mnist --config " + cfg +
                        " --steps 20 --warmup 1 --batch-size 64 --optimizer adamw --lr 3e-3"
                        " --precision bf16 --mode " +
                        mode);
    ASSERT_EQ(b.status, 0) << b.output;
    at = b.output.find("final test accuracy ");
    ASSERT_NE(at, std::string::npos) << b.output;
    EXPECT_GT(std::stod(b.output.substr(at + 20)), 15.0) << b.output;
  }
  std::filesystem::remove(cfg);
  std::filesystem::remove_all(ckpt);
}

// Fashion-MNIST end to end with a tiny model: train with evaluation and a
// checkpoint, evaluate the checkpoint, plot the log.
// --eval-samples N evaluates on N of the test split's images: each
// evaluation counts N, in the report and in the log, and a bad N is refused
// naming the flag.
TEST(Cli, EvalSamplesEvaluatesNTestImages) {
  if (!std::filesystem::exists(std::string(data::kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  std::string cfg = temp_path("fm-es.json"), log = temp_path("fm-es.jsonl");
  nn::ViTConfig c = nn::ViTConfig::preset("vit-fmnist");
  c.hidden_size = 16, c.num_attention_heads = 2, c.intermediate_size = 32, c.num_hidden_layers = 1;
  c.patch_size = 7;
  io::save_config(cfg, c);
  const std::string train = "train --data fashion-mnist --config " + cfg +
                            " --steps 2 --warmup 1 --batch-size 32 --mode jit --eval-every 1";
  CliRun r = kiln_cli(train + " --eval-samples 100 --log-json " + log);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("on 100 test images"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("on 10000 test images"), std::string::npos) << r.output;
  // 100 images in batches of 32: three full batches and one of 4.
  EXPECT_NE(r.output.find("eval compiles: 2 (one per batch shape; 2 evaluations)"),
            std::string::npos)
      << r.output;
  std::ifstream in(log);
  int evals = 0;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("eval_samples")) continue;
    ++evals;
    EXPECT_EQ(j["eval_samples"].get<int64_t>(), 100) << line;
  }
  EXPECT_EQ(evals, 2);
  CliRun bad = kiln_cli(train + " --eval-samples -5");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("--eval-samples"), std::string::npos) << bad.output;
}

TEST(Cli, FashionMnistTrainEvalPlot) {
  if (!std::filesystem::exists(std::string(data::kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";
  std::string cfg = temp_path("fm.json"), log = temp_path("fm.jsonl"), ckpt = temp_path("fm-ckpt"),
              svg = temp_path("fm.svg"), png = temp_path("fm.png");
  nn::ViTConfig c = nn::ViTConfig::preset("vit-fmnist");
  c.hidden_size = 16, c.num_attention_heads = 2, c.intermediate_size = 32, c.num_hidden_layers = 1;
  c.patch_size = 7;
  io::save_config(cfg, c);
  CliRun r =
      kiln_cli("train --data fashion-mnist --config " + cfg +
               " --steps 30 --warmup 1 --batch-size 64 --mode jit --optimizer adamw --lr 3e-3"
               " --schedule cosine --lr-warmup 5 --eval-every 15 --precision bf16"
               " --save " +
               ckpt + " --log-json " + log);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("eval at step 15: loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("on 10000 test images"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bf16 mixed precision"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("saved step 30 to " + ckpt), std::string::npos) << r.output;
  // 10000 test images in batches of 64: 156 full batches and one of 16.
  EXPECT_NE(r.output.find("eval compiles: 2 (one per batch shape; 2 evaluations)"),
            std::string::npos)
      << r.output;
  size_t at = r.output.find("final test accuracy ");
  ASSERT_NE(at, std::string::npos) << r.output;
  double acc = std::stod(r.output.substr(at + 20));
  EXPECT_GT(acc, 12.0);  // 30 steps of a 1-layer ViT learn a little (chance: 10%)
  double loss = std::stod(r.output.substr(r.output.find("(loss ", at) + 6));
  EXPECT_LT(loss, 2.25);  // chance: ln 10 = 2.30
  CliRun e = kiln_cli("eval --checkpoint " + ckpt + " --data fashion-mnist --mode eager");
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find("(step 30) on fashion-mnist test"), std::string::npos) << e.output;
  CliRun p = kiln_cli("plot " + log + " -o " + svg);
  ASSERT_EQ(p.status, 0) << p.output;
  std::ifstream in(svg);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text.rfind("<?xml", 0), 0u);
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("<path"), std::string::npos);
  // The PNG: 1920 x 720 pixels, with the training loss's blue and the test
  // accuracy's green on white.
  p = kiln_cli("plot " + log + " -o " + png);
  ASSERT_EQ(p.status, 0) << p.output;
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  ASSERT_TRUE(png_image_begin_read_from_file(&image, png.c_str())) << image.message;
  image.format = PNG_FORMAT_RGB;
  std::vector<unsigned char> px(PNG_IMAGE_SIZE(image));
  ASSERT_TRUE(png_image_finish_read(&image, nullptr, px.data(), 0, nullptr)) << image.message;
  EXPECT_EQ(image.width, 1920u);
  EXPECT_EQ(image.height, 720u);
  auto count = [&](int r, int g, int b) {
    int64_t n = 0;
    for (size_t i = 0; i + 2 < px.size(); i += 3)
      n += px[i] == r && px[i + 1] == g && px[i + 2] == b;
    return n;
  };
  EXPECT_GT(count(255, 255, 255), int64_t(px.size() / 3 / 2));  // mostly background
  EXPECT_GT(count(0x1f, 0x77, 0xb4), 100);                      // training loss
  EXPECT_GT(count(0x2c, 0xa0, 0x2c), 100);                      // test accuracy
  for (auto& f : {cfg, log, svg, png}) std::filesystem::remove(f);
  std::filesystem::remove_all(ckpt);
}

// A log line whose fields have the wrong type is an error naming the file,
// the line and the field (it used to abort); a null loss (a NaN) is skipped.
TEST(Cli, PlotNamesABadFieldAndSkipsNonFiniteLosses) {
  std::string log = temp_path("bad.jsonl"), png = temp_path("bad.png");
  { std::ofstream(log) << "{\"step\": 1, \"loss\": 2.5}\n{\"step\": 2, \"loss\": \"x\"}\n"; }
  CliRun r = kiln_cli("plot " + log + " -o " + png);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("bad.jsonl:2: field 'loss' is \"x\", expected a number"),
            std::string::npos)
      << r.output;
  { std::ofstream(log) << "{\"step\": 1, \"loss\": 2.5}\n{\"step\": 2, \"loss\": null}\n"; }
  r = kiln_cli("plot " + log + " -o " + png);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(png));
  for (auto& f : {log, png}) std::filesystem::remove(f);
}

// Losses that differ by less than a tick step can represent: the axis used to
// add ticks until memory ran out (found by fuzz/plot_log_fuzz.cpp).
TEST(Cli, PlotDrawsLossesThatDifferBelowTheirPrecision) {
  std::string log = temp_path("narrow.jsonl"), svg = temp_path("narrow.svg");
  {
    std::ofstream(log) << "{\"step\": 1, \"loss\": 10000000000}\n"
                       << "{\"step\": 2, \"loss\": 10000000000.000002}\n";
  }
  CliRun r = kiln_cli("plot " + log + " -o " + svg);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(svg));
  for (auto& f : {log, svg}) std::filesystem::remove(f);
}

// An image folder of `classes`, 12 noise images each (20x24 RGB PNGs).
std::string image_folder(const std::string& name, const std::vector<std::string>& classes) {
  std::string root = temp_path(name);
  std::filesystem::remove_all(root);
  std::vector<uint8_t> rgb(20 * 24 * 3);
  uint32_t x = 12345;
  for (const std::string& c : classes) {
    std::filesystem::create_directories(root + "/" + c);
    for (int i = 0; i < 12; ++i) {
      for (auto& v : rgb) v = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
      png_image img{};
      img.version = PNG_IMAGE_VERSION;
      img.width = 24, img.height = 20, img.format = PNG_FORMAT_RGB;
      std::string file = root + "/" + c + "/" + std::to_string(i) + ".png";
      EXPECT_TRUE(png_image_write_to_file(&img, file.c_str(), 0, rgb.data(), 0, nullptr)) << file;
    }
  }
  return root;
}

// kiln train --init-from: a model that transformers saved, fine-tuned on an
// image folder (at lr 0, so that the saved weights show what it started
// from): the data's labels decide the classifier, and name the labels of
// every model trained on a folder.
TEST(Cli, TrainStartsFromAPretrainedModelAndTheDataNamesTheLabels) {
  const std::string fixtures = std::string(KILN_FIXTURES_DIR) + "/pretrained/";
  const std::string bees = image_folder("ants-bees", {"ants", "bees"});
  const std::string same = image_folder("cat-dog-tench", {"cat", "dog", "tench"});
  const std::string out = temp_path("finetuned");
  const std::string run = " --steps 2 --warmup 1 --batch-size 4 --lr 0 --mode eager --save " + out;
  auto saved = [&] { return io::load_safetensors(out + "/model.safetensors").tensors; };

  // Other labels: a new classifier for them, every other weight the checkpoint's.
  CliRun r =
      kiln_cli("train --init-from " + fixtures + "v5-classifier --data imagefolder:" + bees + run);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--init-from " + fixtures +
                          "v5-classifier: its classifier's 3 labels (cat, "
                          "dog, tench) are not the data's: a new one for 2 labels (ants, bees), "
                          "drawn as transformers does with ignore_mismatched_sizes"),
            std::string::npos)
      << r.output;
  io::Pretrained start = io::load_pretrained(fixtures + "v5-classifier");
  Params w = saved();
  EXPECT_EQ(w.at("classifier.weight").shape(), (Shape{2, 16}));
  for (auto& [name, p] : start.params) {
    if (name.rfind("classifier.", 0) == 0) continue;
    EXPECT_EQ(w.at(name).to_vector<float>(), p.to_vector<float>()) << name;
  }
  EXPECT_EQ(io::load_config<nn::ViTConfig>(out + "/config.json").id2label,
            (std::vector<std::string>{"ants", "bees"}));
  CliRun e = kiln_cli("eval --model " + out + " --data imagefolder:" + bees + " --mode eager");
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find(out + " on imagefolder:" + bees + " held-out: loss "), std::string::npos)
      << e.output;

  // Another image size: the position embeddings resampled once, the size saved.
  r = kiln_cli("train --init-from " + fixtures +
               "v5-classifier --image-size 24 --data imagefolder:" + bees + run);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("image size 16 -> 24: position embeddings resampled from 4 to 6 patches"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(saved().at("vit.embeddings.position_embeddings").shape(), (Shape{1, 37, 16}));
  EXPECT_EQ(io::load_config<nn::ViTConfig>(out + "/config.json").image_size, nn::Size2d(24));
  e = kiln_cli("eval --model " + fixtures +
               "v5-classifier --image-size 12x20 --data imagefolder:" + same + " --mode eager");
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find("resampled from 4 to 3x5 patches"), std::string::npos) << e.output;

  // The same labels: its classifier is kept.
  r = kiln_cli("train --init-from " + fixtures + "v4-classifier --data imagefolder:" + same + run);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("a new one"), std::string::npos) << r.output;
  EXPECT_EQ(saved().at("classifier.weight").to_vector<float>(),
            io::load_pretrained(fixtures + "v4-classifier")
                .params.at("classifier.weight")
                .to_vector<float>());

  // A headless ViTModel: its pooler left out, a classifier added; f16 weights converted.
  r = kiln_cli("train --init-from " + fixtures + "v4-headless --data imagefolder:" + bees + run);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("the pooler (pooler.dense.bias, pooler.dense.weight) is left out"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("it has no classifier: a new one for 2 labels (ants, bees)"),
            std::string::npos)
      << r.output;
  r = kiln_cli("train --init-from " + fixtures + "v4-f16 --data imagefolder:" + same + run);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("weights stored in f16, converted to f32"), std::string::npos)
      << r.output;

  // A model trained from scratch on a folder is named after its classes too.
  r = kiln_cli("train --config " + fixtures + "v5-classifier/config.json --data imagefolder:" +
               bees + " --steps 1 --warmup 0 --batch-size 4 --save " + out);
  ASSERT_NE(r.status, 0);  // 3 labels in the config, 2 classes in the folder
  EXPECT_NE(r.output.find("has 2 classes (sub-folders), the model has num_labels 3"),
            std::string::npos)
      << r.output;
  const std::string abc = image_folder("abc", {"a", "b", "c"});
  r = kiln_cli("train --config " + fixtures + "v5-classifier/config.json --data imagefolder:" +
               abc + " --steps 1 --warmup 0 --batch-size 4 --save " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(io::load_config<nn::ViTConfig>(out + "/config.json").id2label,
            (std::vector<std::string>{"a", "b", "c"}));
  for (const auto& d : {bees, same, abc, out}) std::filesystem::remove_all(d);
}

// A model trained on an image folder is saved with the preprocessor_config.json
// its evaluation used, so that kiln predict (and transformers) process images
// as it was evaluated: the defaults at its size from scratch, a pretrained
// model's own processor (resized with the model) when fine-tuned.
TEST(Cli, CheckpointsCarryTheirPreprocessingAndPredict) {
  const std::string fixtures = std::string(KILN_FIXTURES_DIR);
  const std::string abc = image_folder("abc-processed", {"a", "b", "c"});
  const std::string out = temp_path("processed");
  CliRun r = kiln_cli("train --config " + fixtures +
                      "/pretrained/v5-classifier/config.json --data imagefolder:" + abc +
                      " --augment --steps 2 --warmup 1 --batch-size 4 --mode eager --save " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  data::ImageProcessor p = io::load_image_processor(out);
  EXPECT_EQ(p.size, nn::Size2d(16));
  EXPECT_EQ(p.resample, data::Resample::bilinear);
  EXPECT_EQ(p.image_mean, (std::vector<double>{0.5, 0.5, 0.5}));
  r = kiln_cli("predict --model " + out + " --top-k 2 " + abc + "/b/3.png");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(abc + "/b/3.png: "), std::string::npos) << r.output;
  r = kiln_cli("eval --checkpoint " + out + " --data imagefolder:" + abc + " --mode eager");
  ASSERT_EQ(r.status, 0) << r.output;

  // Fine-tuned at another size: the pretrained processor (bicubic, ImageNet
  // statistics), at the new size; --resume keeps it.
  r = kiln_cli("train --init-from " + fixtures +
               "/predict/single --image-size 36 --data imagefolder:" + abc +
               " --augment --crop-scale 0.5,1 --flip-prob 0.2 --steps 2 --warmup 1 --batch-size 4 "
               "--mode eager "
               "--save " +
               out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("images processed to 36 (preprocessor_config.json's size)"),
            std::string::npos)
      << r.output;
  p = io::load_image_processor(out);
  EXPECT_EQ(p.size, nn::Size2d(36));
  EXPECT_EQ(p.resample, data::Resample::bicubic);
  EXPECT_EQ(p.image_mean, (std::vector<double>{0.485, 0.456, 0.406}));
  r = kiln_cli("train --resume " + out + " --data imagefolder:" + abc +
               " --steps 3 --warmup 1 --batch-size 4 --mode eager --save " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(io::image_processor_json(io::load_image_processor(out)), io::image_processor_json(p));

  r = kiln_cli("train --init-from " + fixtures + "/predict/single --data imagefolder:" + abc +
               " --augment --crop-scale 0.5 --steps 2");
  EXPECT_NE(r.status, 0);
  r = kiln_cli("train --init-from " + fixtures + "/predict/single --data imagefolder:" + abc +
               " --augment --crop-ratio 2,1 --steps 2");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--crop-ratio 2.000000,1.000000: expected MIN,MAX with 0 < MIN <= MAX"),
            std::string::npos)
      << r.output;
  for (const auto& d : {abc, out}) std::filesystem::remove_all(d);
}

std::vector<nlohmann::json> log_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The fine-tuning knobs through kiln train: the same run in every mode with
// label smoothing, the linear schedule and the Trainer's decay groups; a
// frozen backbone; a moving average evaluated and saved; the best checkpoint.
TEST(Cli, FineTuningKnobs) {
  const std::string fixtures = std::string(KILN_FIXTURES_DIR);
  const std::string abc = image_folder("abc-knobs", {"a", "b", "c"});
  const std::string out = temp_path("knobs"), log = temp_path("knobs.jsonl");
  const std::string init = " --init-from " + fixtures + "/predict/single --data imagefolder:" + abc;
  auto params = [&](const std::string& dir) {
    return io::load_safetensors(dir + "/model.safetensors").tensors;
  };

  std::vector<std::vector<double>> losses;
  for (const char* mode : {"eager", "lazy", "jit"}) {
    CliRun r = kiln_cli(
        "train" + init + " --steps 4 --warmup 1 --batch-size 4 --mode " + mode +
        " --optimizer adamw --lr 1e-3 --weight-decay 0.1 --exempt-from-decay --schedule linear "
        "--lr-warmup 2 --label-smoothing 0.1 --drop-path 0.2 --log-json " +
        log);
    ASSERT_EQ(r.status, 0) << mode << ":\n" << r.output;
    std::vector<double> l;
    for (auto& j : log_lines(log))
      if (j.contains("loss")) {
        l.push_back(j["loss"]);
        if (j["step"] == 1) {
          EXPECT_EQ(j["lr"], 0.0);  // transformers' warm-up starts at 0
        }
        if (j["step"] == 2) {
          EXPECT_NEAR(j["lr"].get<double>(), 5e-4, 1e-12);
        }
      }
    ASSERT_EQ(l.size(), 4u);
    losses.push_back(l);
    EXPECT_NE(r.output.find("top-5 100.00%"), std::string::npos) << r.output;  // 3 classes
  }
  for (size_t m = 1; m < losses.size(); ++m)
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(losses[m][i], losses[0][i], 2e-5) << m << " " << i;

  // Linear probing: only the classifier moves, in every mode.
  io::Pretrained start = io::load_pretrained(fixtures + "/predict/single");
  for (const char* mode : {"eager", "lazy", "jit"}) {
    CliRun r = kiln_cli("train" + init +
                        " --steps 3 --warmup 1 --batch-size 4 --lr 0.5 --freeze-backbone --mode " +
                        mode + " --save " + out);
    ASSERT_EQ(r.status, 0) << r.output;
    Params w = params(out);
    for (auto& [name, p] : start.params)
      if (name.rfind("classifier.", 0) != 0) {
        EXPECT_EQ(w.at(name).to_vector<float>(), p.to_vector<float>()) << mode << " " << name;
      }
    EXPECT_TRUE(io::load_safetensors(out + "/training_state.safetensors")
                    .tensors.empty());  // plain SGD on the head
  }

  // A moving average: evaluated beside the weights, saved as DIR/ema/.
  CliRun r =
      kiln_cli("train" + init +
               " --steps 4 --warmup 1 --batch-size 4 --lr 0.05 --ema 0.5 --eval-every 2 --mode jit "
               "--save " +
               out + " --log-json " + log);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("moving average of the weights: loss "), std::string::npos) << r.output;
  int evals = 0;
  for (auto& j : log_lines(log)) evals += j.contains("eval_ema_accuracy");
  EXPECT_EQ(evals, 2);
  io::Pretrained ema = io::load_pretrained(out + "/ema");
  EXPECT_TRUE(ema.has_processor);
  Params w = params(out);
  EXPECT_NE(ema.params.at("classifier.weight").to_vector<float>(),
            w.at("classifier.weight").to_vector<float>());
  // --resume continues the average from the optimizer state; without --ema
  // the state does not fit, and the error says so.
  r = kiln_cli("train" + init +
               " --steps 6 --warmup 1 --batch-size 4 --lr 0.05 --mode jit --resume " + out);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("which this run's optimizer does not keep: resume with the flags"),
            std::string::npos)
      << r.output;
  r = kiln_cli("train" + init +
               " --steps 5 --warmup 1 --batch-size 4 --lr 0.05 --ema 0.5 --mode jit --resume " +
               out + " --save " + out);
  ASSERT_EQ(r.status, 0) << r.output;

  // --save-best: the checkpoint of the most accurate evaluation.
  std::filesystem::remove_all(out);
  r = kiln_cli(
      "train" + init +
      " --steps 6 --warmup 1 --batch-size 4 --lr 0.3 --eval-every 1 --save-best --mode jit "
      "--save " +
      out + " --log-json " + log);
  ASSERT_EQ(r.status, 0) << r.output;
  double best = -1;
  int64_t best_step = 0;
  for (auto& j : log_lines(log))
    if (j.contains("eval_accuracy") && j["eval_accuracy"].get<double>() > best)
      best = j["eval_accuracy"], best_step = j["step"];
  std::ifstream t(out + "/trainer.json");
  nlohmann::json trainer = nlohmann::json::parse(t);
  EXPECT_EQ(trainer["step"], best_step);
  EXPECT_EQ(trainer["best_accuracy"], best);  // a resumed run starts from it
  r = kiln_cli("train" + init + " --steps 2 --save-best");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--save-best goes with --save DIR"), std::string::npos) << r.output;
  for (const auto& d : {abc, out, log}) std::filesystem::remove_all(d);
}

// --accumulate N: N batches of B give the update of one batch of N·B, in
// every mode (no dropout: its masks are drawn per batch), clipping after the
// average.
TEST(Cli, AccumulationIsOneLargerBatch) {
  const std::string fixtures = std::string(KILN_FIXTURES_DIR);
  const std::string abc = image_folder("abc-accumulate", {"a", "b", "c"});
  const std::string a = temp_path("acc-a"), b = temp_path("acc-b"), log = temp_path("acc.jsonl");
  const std::string run = "train --init-from " + fixtures +
                          "/predict/single --data imagefolder:" + abc +
                          " --steps 3 --warmup 1 --optimizer sgd --momentum 0.9 --lr 0.05";
  auto losses = [&] {
    std::vector<double> l;
    for (auto& j : log_lines(log))
      if (j.contains("loss")) l.push_back(j["loss"]);
    return l;
  };
  for (const std::string mode :
       {"eager", "lazy", "jit", "jit --clip-norm 0.5", "eager --compile-model"}) {
    SCOPED_TRACE(mode);
    CliRun r =
        kiln_cli(run + " --batch-size 8 --mode " + mode + " --save " + a + " --log-json " + log);
    ASSERT_EQ(r.status, 0) << r.output;
    std::vector<double> la = losses();
    r = kiln_cli(run + " --batch-size 4 --accumulate 2 --mode " + mode + " --save " + b +
                 " --log-json " + log);
    ASSERT_EQ(r.status, 0) << r.output;
    std::vector<double> lb = losses();
    ASSERT_EQ(la.size(), 3u);
    ASSERT_EQ(lb.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(la[i], lb[i], 1e-5) << i;
    Params pa = io::load_safetensors(a + "/model.safetensors").tensors;
    Params pb = io::load_safetensors(b + "/model.safetensors").tensors;
    double worst = 0;
    for (auto& [name, x] : pa) {
      auto u = x.to_vector<float>(), v = pb.at(name).to_vector<float>();
      for (size_t i = 0; i < u.size(); ++i) worst = std::max(worst, double(std::fabs(u[i] - v[i])));
    }
    EXPECT_LT(worst, 2e-5);
    EXPECT_GT(losses().front(), 0);
    // The samples of a step: both runs read 8 per step.
    EXPECT_EQ(nlohmann::json::parse(std::ifstream(b + "/trainer.json"))["data_position"], 6);
  }
  for (const auto& d : {abc, a, b, log}) std::filesystem::remove_all(d);
}

// kiln grad takes a config.json of any model type kiln has: a ResNet's
// gradients and the BatchNorm statistics after its training-mode forward
// match transformers'; an unknown model_type names the types kiln has.
TEST(Cli, GradTakesEveryModelTypeAndWritesTheState) {
  std::string dir = std::string(KILN_FIXTURES_DIR) + "/resnet_bottleneck_golden/",
              out = temp_path("resnet_grads.safetensors");
  CliRun r = kiln_cli("grad --config " + dir + "config.json --weights " + dir +
                      "model.safetensors --batch " + dir + "batch.safetensors --out " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  auto got = io::load_safetensors(out).tensors;
  auto want = io::load_safetensors(dir + "expected.safetensors").tensors;
  EXPECT_NEAR(got.at("loss").item<double>(), want.at("loss").item<double>(), 1e-5);
  int grads = 0, state = 0;
  for (auto& [name, v] : got) {
    grads += name.starts_with("grad.");
    state += name.starts_with("state.");
    if (name.starts_with("state.") && name.ends_with("num_batches_tracked")) {
      EXPECT_EQ(v.item<int64_t>(), 1) << name;
    }
    if (name.starts_with("state.") && name.ends_with("running_mean")) {
      auto a = v.to_vector<float>(), b = want.at(name).to_vector<float>();
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << name;
    }
  }
  EXPECT_GT(grads, 0);
  EXPECT_GT(state, 0);
  EXPECT_NE(r.output.find(std::to_string(state) + " state entries"), std::string::npos) << r.output;
  std::filesystem::remove(out);

  std::string bert = temp_path("bert.json");
  std::ofstream(bert) << R"({"model_type": "bert", "hidden_size": 8})";
  CliRun b = kiln_cli("grad --config " + bert + " --weights " + dir + "model.safetensors --batch " +
                      dir + "batch.safetensors --out " + out);
  EXPECT_NE(b.status, 0);
  EXPECT_NE(
      b.output.find(bert + ": field 'model_type' is \"bert\", which kiln does not have; its "
                           "model types: \"convnext\", \"deit\", \"gpt2\", \"resnet\", \"vit\""),
      std::string::npos)
      << b.output;
  std::filesystem::remove(bert);
}

TEST(Cli, GradRejectsWeightsOfAnotherModel) {
  std::string dir = std::string(KILN_FIXTURES_DIR) + "/vit_golden/";
  std::string cfg = temp_path("other.json");
  nn::ViTConfig c = io::load_config<nn::ViTConfig>(dir + "config.json");
  c.intermediate_size = 128;
  io::save_config(cfg, c);
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
