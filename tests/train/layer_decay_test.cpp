// Layer-wise learning-rate decay (--layer-decay): each family's parameter
// groups give every parameter the scale timm's param_groups_layer_decay
// gives its counterpart (tests/fixtures/layer_decay.json, written by
// tools/golden/make_layer_decay_golden.py from timm's ViT, ConvNeXt and
// ResNet); SGD and AdamW apply the scales as torch param groups with
// lr_scale do; kiln train takes --layer-decay in every mode alike.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "../test_util.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/model.h"
#include "kiln/optim.h"
#include "kiln/train.h"

namespace kiln {
namespace {

// Index n of the dotted name ("a.b.3.c": 3 at 2).
int64_t part(const std::string& name, size_t n) {
  std::stringstream s(name);
  std::string p;
  for (size_t i = 0; i <= n; ++i) std::getline(s, p, '.');
  return std::stoll(p);
}
bool starts(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// A timm parameter of the same group as a kiln (transformers) parameter.
std::string timm_vit(const std::string& n) {
  if (n == "vit.embeddings.cls_token") return "cls_token";
  if (n == "vit.embeddings.position_embeddings") return "pos_embed";
  if (starts(n, "vit.embeddings.patch_embeddings")) return "patch_embed.proj.weight";
  if (starts(n, "vit.encoder.layer."))
    return "blocks." + std::to_string(part(n, 3)) + ".norm1.weight";
  if (starts(n, "vit.layernorm.")) return "norm.weight";
  if (starts(n, "classifier.")) return "head.weight";
  return "?" + n;
}
std::string timm_convnext(const std::string& n) {
  if (starts(n, "convnext.embeddings.")) return "stem.0.weight";
  if (n.find(".downsampling_layer.") != std::string::npos)
    return "stages." + std::to_string(part(n, 3)) + ".downsample.1.weight";
  if (starts(n, "convnext.encoder.stages."))
    return "stages." + std::to_string(part(n, 3)) + ".blocks." + std::to_string(part(n, 5)) +
           ".conv_dw.weight";
  if (starts(n, "convnext.layernorm.")) return "head.norm.weight";
  if (starts(n, "classifier.")) return "head.fc.weight";
  return "?" + n;
}
std::string timm_resnet(const std::string& n) {
  if (starts(n, "resnet.embedder.")) return "conv1.weight";
  if (starts(n, "resnet.encoder.stages."))
    return "layer" + std::to_string(part(n, 3) + 1) + "." + std::to_string(part(n, 5)) +
           ".conv1.weight";
  if (starts(n, "classifier.")) return "fc.weight";
  return "?" + n;
}

TEST(LayerDecay, EveryFamilyGroupsItsParametersAsTimmDoes) {
  const nlohmann::json f = test_util::json_fixture("layer_decay.json");
  const double decay = f["layer_decay"].get<double>();
  struct Case {
    const char* family;
    std::string config;
    std::function<std::string(const std::string&)> timm;
  };
  const std::vector<Case> cases = {
      {"vit",
       R"({"model_type": "vit", "hidden_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2,
           "intermediate_size": 32, "image_size": 32, "patch_size": 8, "num_labels": 5})",
       timm_vit},
      {"convnext",
       R"({"model_type": "convnext", "hidden_sizes": [8, 16, 24, 32], "depths": [1, 2, 1, 1],
           "num_labels": 5})",
       timm_convnext},
      {"resnet",
       R"({"model_type": "resnet", "layer_type": "basic", "hidden_sizes": [64, 128, 256, 512],
           "depths": [2, 1, 1, 1], "num_labels": 5})",
       timm_resnet}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.family);
    const auto model = nn::model_from_config(c.config, std::string(c.family) + ".json");
    const auto scales = nn::layer_decay_scales(*model, decay);
    const nlohmann::json& want = f["scales"][c.family];
    EXPECT_EQ(scales.size(), model->parameter_shapes().size());
    std::set<double> seen;
    for (const auto& [name, scale] : scales) {
      const std::string t = c.timm(name);
      ASSERT_TRUE(want.contains(t)) << name << " -> " << t;
      EXPECT_NEAR(scale, want[t].get<double>(), 1e-12) << name << " -> " << t;
      seen.insert(scale);
    }
    // Every group of timm's is reached.
    std::set<double> timm_scales;
    for (const auto& [n, s] : want.items()) timm_scales.insert(s.get<double>());
    EXPECT_EQ(seen.size(), timm_scales.size());
  }
  const auto vit = nn::model_from_preset("vit-tiny");
  EXPECT_NE(
      [&] {
        try {
          nn::layer_decay_scales(*vit, 1.5);
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
        return std::string();
      }()
          .find("expected a value in (0, 1]"),
      std::string::npos);
}

// torch's param groups: group lr = lr · lr_scale, AdamW's decoupled decay
// by the group's lr.
TEST(LayerDecay, OptimizersScaleEachParametersLearningRate) {
  const Params params = {{"a", full({3}, 2.0)}, {"b", full({3}, 2.0)}};
  const Params grads = {{"a", full({3}, 0.5)}, {"b", full({3}, 0.5)}};
  optim::SGD sgd({.lr = 0.1, .weight_decay = 0.01, .lr_scale = {{"a", 0.25}}});
  auto [p, s] = sgd.update(grads, sgd.init(params), params);
  const double g = 0.5 + 0.01 * 2.0;
  EXPECT_NEAR(p.at("a").to_vector<float>()[0], 2.0 - 0.1 * 0.25 * g, 1e-6);
  EXPECT_NEAR(p.at("b").to_vector<float>()[0], 2.0 - 0.1 * g, 1e-6);

  const double lr = 0.01, wd = 0.05, c = 0.3;
  optim::AdamW adamw({.lr = lr, .weight_decay = wd, .lr_scale = {{"a", c}}});
  auto [q, t] = adamw.update(grads, adamw.init(params), params);
  // Step 1: m̂ = g, v̂ = g², so the step is lr · g / (|g| + eps).
  const double step = 0.5 / (0.5 + 1e-8);
  EXPECT_NEAR(q.at("a").to_vector<float>()[0], 2.0 * (1 - c * lr * wd) - c * lr * step, 1e-6);
  EXPECT_NEAR(q.at("b").to_vector<float>()[0], 2.0 * (1 - lr * wd) - lr * step, 1e-6);
}

// One SGD step of kiln train with --layer-decay moves each parameter by its
// scale times its move without decay, in eager and jit alike.
TEST(LayerDecay, TrainingScalesEachBlocksStep) {
  const auto model = nn::model_from_config(
      R"({"model_type": "vit", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
          "intermediate_size": 32, "image_size": 16, "patch_size": 8, "num_labels": 3})",
      "vit.json");
  auto run = [&](const std::string& mode, double layer_decay) {
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("kiln-layer-decay-" + std::to_string(::getpid()) + "-" + mode))
                                .string();
    std::filesystem::remove_all(dir);
    train::TrainConfig t;
    t.model = model;
    t.model_name = "tiny";
    t.batch_size = 4;
    t.mode = train::parse_mode(mode);
    t.steps = 1;
    t.warmup = 0;
    t.lr = 0.1;
    t.layer_decay = layer_decay;
    t.image_size = 16;
    t.workers = 0;
    t.save_dir = dir;
    train::run(t);
    Params params = io::load_checkpoint(dir).params;
    std::filesystem::remove_all(dir);
    return params;
  };
  const Params plain = run("eager", 0.0), decayed = run("eager", 0.5), jit = run("jit", 0.5);
  // kiln train draws the parameters from the first of three keys of its seed.
  const Params init = model->init(random::split(random::Key(0), 3)[0]);
  const auto scales = nn::layer_decay_scales(*model, 0.5);
  EXPECT_EQ(scales.at("vit.embeddings.cls_token"), 0.125);
  EXPECT_EQ(scales.at("vit.encoder.layer.1.output.dense.weight"), 0.5);
  EXPECT_EQ(scales.at("classifier.weight"), 1.0);
  for (const auto& [name, scale] : scales) {
    const auto p0 = init.at(name).to_vector<float>(), p1 = plain.at(name).to_vector<float>(),
               pd = decayed.at(name).to_vector<float>(), pj = jit.at(name).to_vector<float>();
    for (size_t i = 0; i < p0.size(); ++i) {
      EXPECT_NEAR(pd[i] - p0[i], scale * (p1[i] - p0[i]), 1e-6) << name;
      EXPECT_NEAR(pj[i], pd[i], 1e-6) << name;
    }
  }
}

}  // namespace
}  // namespace kiln
