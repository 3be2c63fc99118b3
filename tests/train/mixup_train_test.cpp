// kiln train with --mixup, --cutmix and --reprob: every mode erases and
// mixes the same batches by the same draws and trains to the same
// parameters; the loss is the cross-entropy against the soft targets; bad
// settings are clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/model.h"
#include "kiln/train.h"

namespace kiln {
namespace {

std::shared_ptr<const nn::Model> tiny_vit() {
  return nn::model_from_config(
      R"({"model_type": "vit", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
          "intermediate_size": 32, "image_size": 16, "patch_size": 8, "num_labels": 4})",
      "vit.json");
}

train::TrainConfig config(const std::string& mode) {
  train::TrainConfig t;
  t.model = tiny_vit();
  t.model_name = "tiny";
  t.batch_size = 6;
  t.mode = train::parse_mode(mode);
  t.steps = 3;
  t.warmup = 0;
  t.lr = 0.05;
  t.image_size = 16;
  t.workers = 0;
  t.label_smoothing = 0.1;
  t.mixup = {.mixup_alpha = 0.8, .cutmix_alpha = 1.0};
  t.erasing = {.prob = 0.5};
  return t;
}

std::pair<std::vector<double>, Params> run(train::TrainConfig t, const std::string& tag) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("kiln-mixup-" + std::to_string(::getpid()) + "-" + tag))
                              .string();
  std::filesystem::remove_all(dir);
  t.save_dir = dir;
  std::vector<double> losses;
  for (const auto& s : train::run(t).steps) losses.push_back(s.loss);
  Params p = io::load_checkpoint(dir).params;
  std::filesystem::remove_all(dir);
  return {losses, p};
}

TEST(MixupTraining, EveryModeMixesAlikeAndTrainsAlike) {
  auto [ref_losses, ref] = run(config("eager"), "eager");
  auto [plain_losses, plain] = run([] {
    train::TrainConfig t = config("eager");
    t.mixup = {};
    t.erasing = {};
    return t;
  }(), "plain");
  // Mixing changes the batches, hence the losses.
  ASSERT_EQ(ref_losses.size(), plain_losses.size());
  EXPECT_NE(ref_losses[0], plain_losses[0]);
  for (const std::string mode : {"lazy", "jit"}) {
    SCOPED_TRACE(mode);
    auto [losses, params] = run(config(mode), mode);
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_TRUE(std::isfinite(losses[i]));
      EXPECT_NEAR(losses[i], ref_losses[i], 1e-4 * std::abs(ref_losses[i]));
    }
    for (const auto& [name, v] : ref) {
      const auto a = v.to_vector<float>(), b = params.at(name).to_vector<float>();
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << name;
    }
  }
  // Accumulating two mixed batches per step.
  train::TrainConfig acc = config("jit");
  acc.accumulate = 2;
  for (double l : run(acc, "accumulate").first) EXPECT_TRUE(std::isfinite(l));
}

// The loss of a mixed batch is the soft-target cross-entropy: with no
// mixing drawn (prob 0) and no smoothing, it equals the plain run's.
TEST(MixupTraining, UnmixedBatchesGiveThePlainLoss) {
  train::TrainConfig t = config("eager");
  t.label_smoothing = 0;
  t.mixup.prob = 0;
  t.erasing = {};
  train::TrainConfig plain = t;
  plain.mixup = {};
  auto [mixed, p1] = run(t, "prob0");
  auto [unmixed, p2] = run(plain, "plain0");
  for (size_t i = 0; i < mixed.size(); ++i) EXPECT_NEAR(mixed[i], unmixed[i], 1e-5);
}

TEST(MixupTraining, BadSettingsAreClearErrors) {
  auto error_of = [](const train::TrainConfig& t) {
    try {
      train::validate(t);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  train::TrainConfig odd = config("eager");
  odd.batch_size = 5;
  EXPECT_NE(error_of(odd).find("--batch-size 5 must be even"), std::string::npos);
  train::TrainConfig regression = config("eager");
  regression.model = nn::model_from_config(
      R"({"model_type": "vit", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
          "intermediate_size": 32, "image_size": 16, "patch_size": 8, "num_labels": 1})",
      "vit.json");
  EXPECT_NE(error_of(regression).find("need single-label classification"), std::string::npos);
  train::TrainConfig bad = config("eager");
  bad.mixup.switch_prob = 1.5;
  EXPECT_NE(error_of(bad).find("--mixup-switch-prob"), std::string::npos);
}

}  // namespace
}  // namespace kiln
