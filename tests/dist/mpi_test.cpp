// Data-parallel training for real: `mpirun -np 2 kiln train` against one
// process at the same global batch (losses and parameters), the batch that
// does not divide, a rank that hangs or dies, and resuming a checkpoint of
// two ranks in one process. Skipped in a build without MPI.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct Shell {
  int status;
  std::string output;
  double seconds;
};

Shell shell(const std::string& command) {
  auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

#ifdef KILN_HAVE_MPI
// mpirun as CI runs it: as root (Open MPI refuses without being told), more
// ranks than cores allowed, ranks not pinned (two share the cores here).
std::string mpirun(int ranks, const std::string& env = "") {
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + env + " " +
         KILN_MPIEXEC + " -np " + std::to_string(ranks) +
         " --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 ";
}
#endif

class Dist : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef KILN_HAVE_MPI
    GTEST_SKIP() << "kiln was built without MPI";
#endif
    dir_ = fs::temp_directory_path() / ("kiln-dist-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    nn::ViTConfig c = nn::ViTConfig::preset("vit-tiny");
    c.image_size = 16, c.patch_size = 8, c.hidden_size = 16, c.num_attention_heads = 2;
    c.intermediate_size = 32, c.num_hidden_layers = 2, c.num_labels = 5;
    config_ = path("config.json");
    io::save_config(config_, c);
  }
  void TearDown() override { fs::remove_all(dir_); }

 public:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // kiln train's flags of the runs compared here: 5 steps of 32 images.
  std::string train(const std::string& flags, int steps = 5) const {
    return test_util::kiln_cli_path() + " train --config " + config_ + " --batch-size 32 --steps " +
           std::to_string(steps) + " --warmup 1 --lr 0.05 --threads 1 " + flags;
  }

  fs::path dir_;
  std::string config_;
};
#ifndef KILN_HAVE_MPI
std::string mpirun(int, const std::string& = "") { return ""; }
#endif

std::vector<double> losses(const std::string& log) {
  std::vector<double> out;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

// The attention's key bias is left out: a softmax does not change when the
// same value is added to every score, so its gradient is zero but for
// rounding, and AdamW (which divides by the gradient's RMS) turns that noise
// into steps of about lr of either sign.
void expect_params_near(const Params& got, const Params& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (auto& [name, x] : got) {
    if (name.find("attention.key.bias") != std::string::npos) continue;
    auto u = x.to_vector<float>(), v = want.at(name).to_vector<float>();
    ASSERT_EQ(u.size(), v.size()) << name;
    for (size_t i = 0; i < u.size(); ++i)
      ASSERT_NEAR(u[i], v[i], tol * std::max(1.0f, std::fabs(v[i]))) << name << "[" << i << "]";
  }
}

// The runs compared: SGD (momentum) and AdamW, eagerly and compiled.
const char* const kRuns[][2] = {{"sgd --momentum 0.9", "eager"},
                                {"sgd --momentum 0.9", "jit"},
                                {"adamw", "eager"},
                                {"adamw", "jit"}};
std::string run_flags(size_t i) {
  return std::string("--mode ") + kRuns[i][1] + " --optimizer " + kRuns[i][0];
}

// Two ranks at 16 images each are one process at 32: the same losses (the
// mean over the ranks is the global batch's) and parameters, to rounding.
void expect_as_one_process(const Dist& t, size_t i, const std::string& two) {
  SCOPED_TRACE(run_flags(i));
  const std::string name = "one" + std::to_string(i);
  Shell one = shell(t.train(run_flags(i) + " --save " + t.path(name) + " --log-json " +
                          t.path(name + ".jsonl")));
  ASSERT_EQ(one.status, 0) << one.output;
  std::vector<double> a = losses(t.path(name + ".jsonl")), b = losses(t.path(two + ".jsonl"));
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (size_t s = 0; s < a.size(); ++s) EXPECT_NEAR(b[s], a[s], 1e-5 * std::fabs(a[s]));
  expect_params_near(io::load_checkpoint(t.path(two)).params,
                     io::load_checkpoint(t.path(name)).params, 1e-4);
}

// On one host; --check-replicas finds the ranks identical after every step,
// and rank 0 alone prints.
TEST_F(Dist, TwoRanksTrainAsOneProcessDoes) {
  for (size_t i = 0; i < std::size(kRuns); ++i) {
    const std::string two = "two" + std::to_string(i);
    Shell r = shell(mpirun(2) + train(run_flags(i) + " --save " + path(two) + " --log-json " +
                                    path(two + ".jsonl") + " --check-replicas 1 --bucket-mb 0.01"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("data-parallel: 2 ranks, 16 samples of each batch per rank"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("gradient all-reduces: "), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("average step time"), r.output.rfind("average step time"));
    expect_as_one_process(*this, i, two);
  }
}

// On two hosts: two network namespaces joined by a veth pair, Open MPI over
// TCP between them (tests/dist/two_hosts.sh); needs root.
TEST_F(Dist, TwoRanksOnTwoHostsTrainAsOneProcessDoes) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  if (shell("command -v ip").status != 0) GTEST_SKIP() << "no ip (iproute2)";
  std::string line = "set -e";
  for (size_t i = 0; i < std::size(kRuns); ++i)
    line += "; $MPIRUN_TWO_HOSTS " + train(run_flags(i) + " --save " + path("two" +
            std::to_string(i)) + " --log-json " + path("two" + std::to_string(i) + ".jsonl"));
  line += "; $MPIRUN_TWO_HOSTS hostname -I";
  Shell r = shell(std::string("bash ") + KILN_SOURCE_DIR + "/tests/dist/two_hosts.sh run t" +
                std::to_string(::getpid() % 100000) + " '" + line + "'");
  if (r.status == 77) GTEST_SKIP() << r.output;  // no network namespaces here
  ASSERT_EQ(r.status, 0) << r.output;
  // The ranks ran on the two hosts' addresses.
  EXPECT_NE(r.output.find("10.77."), r.output.rfind("10.77.")) << r.output;
  for (size_t i = 0; i < std::size(kRuns); ++i) expect_as_one_process(*this, i, "two" + std::to_string(i));
}

// On two GPUs (two emulated ones in CI): the gradients go through NCCL, and
// two ranks train as one process on one GPU does.
TEST_F(Dist, TwoRanksOnTwoGpusTrainThroughNcclAsOneProcessDoes) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "fewer than two CUDA devices";
  const std::string two = "two-gpus";
  Shell r =
      shell(mpirun(2) + train("--device cuda --mode jit --optimizer sgd --momentum 0.9 --save " +
                                  path(two) + " --log-json " + path(two + ".jsonl") +
                                  " --check-replicas 1 --bucket-mb 0.01",
                              3));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("gradient all-reduces: "), std::string::npos) << r.output;
  Shell one = shell(train("--device cuda --mode jit --optimizer sgd --momentum 0.9 --save " +
                              path("one-gpu") + " --log-json " + path("one-gpu.jsonl"),
                          3));
  ASSERT_EQ(one.status, 0) << one.output;
  std::vector<double> a = losses(path("one-gpu.jsonl")), b = losses(path(two + ".jsonl"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t s = 0; s < a.size(); ++s) EXPECT_NEAR(b[s], a[s], 1e-5 * std::fabs(a[s]));
  expect_params_near(io::load_checkpoint(path(two)).params,
                     io::load_checkpoint(path("one-gpu")).params, 1e-4);
}

TEST_F(Dist, ABatchThatDoesNotDivideGetsAClearError) {
  Shell r = shell(mpirun(2) + test_util::kiln_cli_path() + " train --config " + config_ +
                  " --batch-size 3 --steps 2 --warmup 1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--batch-size 3 (the global batch) does not divide among 2 ranks"),
            std::string::npos)
      << r.output;
}

// A rank that stops making progress: the other one gives up after
// --dist-timeout, names it, and mpirun stops both; the checkpoint of the
// last save stays whole.
TEST_F(Dist, ARankThatHangsIsNamedAndTheRunStops) {
  Shell r = shell("timeout 120 " + mpirun(2, "KILN_DIST_FAULT=hang@1:4") +
                train("--dist-timeout 3 --save-every 1 --save " + path("ck")));
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.seconds, 60);
  EXPECT_NE(r.output.find("rank 1 never reached it"), std::string::npos) << r.output;
  io::Checkpoint ck = io::load_checkpoint(path("ck"));
  EXPECT_EQ(ck.state.step, 3);
}

// A rank that dies: mpirun stops the others at once and says which rank.
TEST_F(Dist, ARankThatDiesStopsTheRun) {
  Shell r = shell("timeout 120 " + mpirun(2, "KILN_DIST_FAULT=exit@1:3") +
                train("--save-every 1 --save " + path("ck")));
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.seconds, 60);
  // Open MPI's words: "Process name: [[job,1],1]  Exit code: 9" (rank 1).
  EXPECT_NE(r.output.find("],1]\n  Exit code:    9"), std::string::npos) << r.output;
  // Rank 0 may have been stopped while it saved step 2: the checkpoint is
  // step 1's or step 2's, whole either way.
  const int64_t saved = io::load_checkpoint(path("ck")).state.step;
  EXPECT_TRUE(saved == 1 || saved == 2) << saved;
}

// A checkpoint of two ranks resumes in one process (and the other way):
// 3 steps on 2 ranks then 2 in one process are 5 steps of one process.
TEST_F(Dist, ACheckpointResumesOnAnyNumberOfRanks) {
  const std::string flags = " --mode jit --optimizer adamw";
  Shell whole = shell(train(flags + " --save " + path("whole")));
  ASSERT_EQ(whole.status, 0) << whole.output;
  Shell first = shell(mpirun(2) + train(flags + " --save " + path("mid"), 3));
  ASSERT_EQ(first.status, 0) << first.output;
  Shell rest = shell(train(flags + " --resume " + path("mid") + " --save " + path("end")));
  ASSERT_EQ(rest.status, 0) << rest.output;
  expect_params_near(io::load_checkpoint(path("end")).params,
                     io::load_checkpoint(path("whole")).params, 1e-4);
  Shell back = shell(mpirun(2) + train(flags + " --resume " + path("mid") + " --save " +
                                     path("end2")));
  ASSERT_EQ(back.status, 0) << back.output;
  expect_params_near(io::load_checkpoint(path("end2")).params,
                     io::load_checkpoint(path("whole")).params, 1e-4);
}

}  // namespace
}  // namespace kiln
