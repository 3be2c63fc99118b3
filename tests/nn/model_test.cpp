// The model interface and its registry: every family made from its
// config.json by model_type matches transformers' golden fixtures through
// the one interface (train::forward_backward, what `kiln grad` runs);
// config.json written back reads the same; head swaps; save_pretrained with
// the state; the errors of unknown types and weights without statistics.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>

#include <algorithm>
#include <filesystem>
#include <functional>

#include "../test_util.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/model.h"
#include "kiln/train.h"

namespace kiln {
namespace {

using test_util::error_of;

const std::string kFixtures = std::string(KILN_FIXTURES_DIR) + "/";

double relative_error(const Array& a, const Array& b, double floor = 1e-30) {
  auto x = astype(a, DType::f64).to_vector<double>(), y = astype(b, DType::f64).to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

TEST(Models, TheRegistryHoldsEveryFamilyAndItsPresets) {
  EXPECT_EQ(nn::model_types(),
            (std::vector<std::string>{"convnext", "deit", "gpt2", "resnet", "vit"}));
  const auto presets = nn::model_presets();
  for (const char* p : {"vit-base", "vit-tiny", "deit-tiny", "deit-small", "deit-base", "resnet-18",
                        "resnet-50", "convnext-tiny"})
    EXPECT_NE(std::find(presets.begin(), presets.end(), p), presets.end()) << p;
  struct Want {
    const char* preset;
    const char* type;
    const char* architecture;
    int64_t parameters;
  };
  // The parameter counts of microsoft/resnet-18, -50, facebook/convnext-tiny-224,
  // google/vit-base-patch16-224, and facebook/deit-tiny-patch16-224's 5,717,416
  // with DeiT's distillation token and its position embedding (2 x 192).
  for (const Want& w :
       {Want{"resnet-18", "resnet", "ResNetForImageClassification", 11689512},
        Want{"resnet-50", "resnet", "ResNetForImageClassification", 25557032},
        Want{"convnext-tiny", "convnext", "ConvNextForImageClassification", 28589128},
        Want{"deit-tiny", "deit", "DeiTForImageClassification", 5717800},
        Want{"vit-base", "vit", "ViTForImageClassification", 86567656}}) {
    auto m = nn::model_from_preset(w.preset);
    EXPECT_EQ(m->model_type(), w.type);
    EXPECT_EQ(m->architecture(), w.architecture);
    int64_t n = 0;
    for (auto& [name, shape] : m->parameter_shapes()) n += numel(shape);
    EXPECT_EQ(n, w.parameters) << w.preset;
  }
  const std::string e = error_of([] { nn::model_from_preset("resnet-51"); });
  EXPECT_NE(e.find("unknown preset \"resnet-51\""), std::string::npos) << e;
  EXPECT_NE(e.find("\"convnext-tiny\""), std::string::npos) << e;
}

TEST(Models, AnUnknownModelTypeNamesTheTypesKilnHas) {
  const std::string types = "\"convnext\", \"deit\", \"gpt2\", \"resnet\", \"vit\"";
  std::string e = error_of([] { nn::model_from_config(R"({"model_type": "bert"})", "b.json"); });
  EXPECT_NE(e.find("b.json: field 'model_type' is \"bert\", which kiln does not have; its model "
                   "types: " +
                   types),
            std::string::npos)
      << e;
  e = error_of([] { nn::model_from_config(R"({"hidden_size": 8})", "n.json"); });
  EXPECT_NE(e.find("n.json: no field 'model_type', expected one of kiln's model types: " + types),
            std::string::npos)
      << e;
  e = error_of([] { nn::model_from_config(R"({"model_type": 3})", "t.json"); });
  EXPECT_NE(e.find("t.json: field 'model_type' is 3"), std::string::npos) << e;
  e = error_of([] { nn::model_from_config("{", "j.json"); });
  EXPECT_NE(e.find("j.json: not valid JSON"), std::string::npos) << e;
  // A family's own errors still name the field.
  e = error_of(
      [] { nn::model_from_config(R"({"model_type": "resnet", "layer_type": "wide"})", "r.json"); });
  EXPECT_NE(e.find("r.json: field 'layer_type' is \"wide\", expected \"basic\" or \"bottleneck\""),
            std::string::npos)
      << e;
}

struct Fixture {
  std::string dir, batch, expected;
  const char* architecture;
  // The bound on the bf16 gradients' error against the f32 reference, as a
  // fraction of the whole gradient's norm; 0: every gradient within 2%.
  double bf16_grads = 0;
};

void PrintTo(const Fixture& f, std::ostream* os) {
  *os << f.dir;
}

class ModelGolden : public ::testing::TestWithParam<Fixture> {};

// Through the interface alone, each family's training-mode forward and
// backward pass matches transformers: logits, loss, every gradient and the
// running statistics after the forward.
TEST_P(ModelGolden, ForwardBackwardMatchesTransformers) {
  const Fixture& f = GetParam();
  const std::string dir = kFixtures + f.dir + "/";
  const auto model = io::load_model_config(dir + "config.json");
  EXPECT_EQ(model->architecture(), f.architecture);
  const Params weights = io::load_safetensors(dir + "model.safetensors").tensors;
  const Params batch = io::load_safetensors(kFixtures + f.batch).tensors;
  const Params expected = io::load_safetensors(dir + f.expected).tensors;
  const train::GradResult r = train::forward_backward(*model, weights, batch.at("pixel_values"),
                                                      batch.at("labels"), nn::Layout::NCHW);
  EXPECT_LT(relative_error(r.logits, expected.at("logits")), 1e-5);
  const double want = expected.at("loss").item<double>();
  EXPECT_NEAR(r.loss.item<double>(), want, 1e-5 * want);
  // Gradients that are zero in exact arithmetic (the attention's key biases)
  // are measured against 0.1% of the whole gradient's norm.
  double total = 0;
  for (auto& [n, e] : expected)
    if (n.starts_with("grad.")) total += sum(square(astype(e, DType::f64))).item<double>();
  EXPECT_EQ(r.grads.size(), model->parameter_shapes().size());
  for (auto& [n, g] : r.grads)
    EXPECT_LT(relative_error(g, expected.at("grad." + n), 1e-3 * std::sqrt(total)), 1e-4) << n;
  EXPECT_EQ(r.state.size(), model->state_shapes().size());
  for (auto& [n, s] : r.state) {
    if (n.ends_with("num_batches_tracked"))
      EXPECT_EQ(s.item<int64_t>(), expected.at("state." + n).item<int64_t>()) << n;
    else
      EXPECT_LT(relative_error(s, expected.at("state." + n)), 1e-5) << n;
  }
}

// bf16 mixed precision (the convolutions' and matmuls' operands rounded to
// bf16, their results and everything else f32) through the interface, for
// every family, against the same f32 reference: logits, loss and running
// statistics within 2% relative, f32 master gradients within 2% each. Not
// so a ResNet's: BatchNorm over a batch of 4 (the fixtures') subtracts the
// gradient's mean and its projection on the normalized activations, most of
// it, and what is left carries the bf16 rounding of the convolutions'
// operands many times over. torch's autocast (bf16, torch 2.15, on the cpu)
// is 9.0% and 32.6% off there (the whole gradient; 0.49% on ConvNeXt), so a
// ResNet's gradients are held to 1.5x that (kiln: 7.0% and 40.0%).
TEST_P(ModelGolden, Bf16MixedPrecisionStaysWithinTwoPercent) {
  const Fixture& f = GetParam();
  const std::string dir = kFixtures + f.dir + "/";
  const auto model = io::load_model_config(dir + "config.json");
  const Params weights = io::load_safetensors(dir + "model.safetensors").tensors;
  const Params batch = io::load_safetensors(kFixtures + f.batch).tensors;
  const Params expected = io::load_safetensors(dir + f.expected).tensors;
  const train::GradResult r = train::forward_backward(
      *model, weights, batch.at("pixel_values"), batch.at("labels"), nn::Layout::NCHW, DType::bf16);
  const double logits_err = relative_error(r.logits, expected.at("logits"));
  EXPECT_LT(logits_err, 2e-2);
  EXPECT_GT(logits_err, 1e-5);  // bf16 did run: f32 is within 1e-5
  const double want = expected.at("loss").item<double>();
  EXPECT_NEAR(r.loss.item<double>(), want, 2e-2 * want);
  double total = 0;
  for (auto& [n, e] : expected)
    if (n.starts_with("grad.")) total += sum(square(astype(e, DType::f64))).item<double>();
  double num = 0;
  for (auto& [n, g] : r.grads) {
    EXPECT_EQ(g.dtype(), DType::f32) << n;  // f32 master gradients
    const Array d = astype(g, DType::f64) - astype(expected.at("grad." + n), DType::f64);
    num += sum(square(d)).item<double>();
    if (f.bf16_grads > 0) continue;
    // As in the ViT's bf16 test: a key bias's exact gradient is zero and
    // what is computed is rounding noise against the floor.
    const bool zero = n.find("attention.attention.key.bias") != std::string::npos;
    EXPECT_LT(relative_error(g, expected.at("grad." + n), 1e-3 * std::sqrt(total)),
              zero ? 6e-2 : 2e-2)
        << n;
  }
  EXPECT_LT(std::sqrt(num / total), f.bf16_grads > 0 ? f.bf16_grads : 2e-2);
  for (auto& [n, s] : r.state) {
    if (!n.ends_with("num_batches_tracked")) {
      EXPECT_LT(relative_error(s, expected.at("state." + n)), 2e-2) << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, ModelGolden,
    ::testing::Values(Fixture{"vit_golden", "vit_golden/batch.safetensors", "expected.safetensors",
                              "ViTForImageClassification"},
                      Fixture{"deit_golden/deit", "deit_golden/batch.safetensors",
                              "expected.safetensors", "DeiTForImageClassification"},
                      Fixture{"deit_golden/deit_with_teacher", "deit_golden/batch.safetensors",
                              "expected.safetensors", "DeiTForImageClassificationWithTeacher"},
                      Fixture{"resnet_basic_golden", "resnet_basic_golden/batch.safetensors",
                              "expected.safetensors", "ResNetForImageClassification", 0.135},
                      Fixture{"resnet_bottleneck_golden",
                              "resnet_bottleneck_golden/batch.safetensors", "expected.safetensors",
                              "ResNetForImageClassification", 0.49},
                      Fixture{"convnext_golden", "convnext_golden/batch.safetensors",
                              "expected.safetensors", "ConvNextForImageClassification"}),
    [](const auto& info) {
      std::string n = info.param.dir;
      for (char& c : n)
        if (c == '/') c = '_';
      return n;
    });

// config.json written by a model reads back as the same model, and a head
// swap changes only the classifier and the labels.
TEST(Models, ConfigsRoundTripAndHeadsSwap) {
  for (const char* preset : {"vit-tiny", "deit-tiny", "resnet-18", "resnet-50", "convnext-tiny"}) {
    SCOPED_TRACE(preset);
    const auto m = nn::model_from_preset(preset);
    const std::string text = m->config_json();
    const auto back = nn::model_from_config(text, "config.json");
    EXPECT_EQ(back->config_json(), text);
    EXPECT_EQ(back->parameter_shapes(), m->parameter_shapes());
    EXPECT_EQ(back->state_shapes(), m->state_shapes());

    const auto swapped = m->with_labels({"cat", "dog", "emu"});
    EXPECT_EQ(swapped->num_labels(), 3);
    EXPECT_EQ(swapped->label_names(), (std::vector<std::string>{"cat", "dog", "emu"}));
    const auto a = m->parameter_shapes(), b = swapped->parameter_shapes();
    ASSERT_EQ(a.size(), b.size());
    int changed = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      if (a[i].second != b[i].second) {
        ++changed;
        EXPECT_NE(a[i].first.find("classifier"), std::string::npos) << a[i].first;
        EXPECT_EQ(b[i].second[0], 3) << a[i].first;
      }
    }
    EXPECT_EQ(changed, 2);
    EXPECT_NE(swapped->config_json().find("\"2\": \"emu\""), std::string::npos);
  }
}

// save_pretrained keeps the state beside the parameters, as transformers
// does (num_batches_tracked stays i64), and what it writes loads back.
TEST(Models, SavePretrainedKeepsTheStateAndLoadsBack) {
  const std::string src = kFixtures + "resnet_basic_golden/";
  const auto model = io::load_model_config(src + "config.json");
  const std::pair<Params, Params> split =
      model->split(io::load_safetensors(src + "model.safetensors").tensors, "fixture");
  const Params& params = split.first;
  const Params& state = split.second;
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kiln_model_save_" + std::to_string(::getpid())))
          .string();
  io::save_pretrained(dir, *model, params, state);
  const auto back = io::load_model_config(dir + "/config.json");
  EXPECT_EQ(back->config_json(), model->config_json());
  auto [p2, s2] = back->split(io::load_safetensors(dir + "/model.safetensors").tensors, "saved");
  EXPECT_NO_THROW(back->check(p2, s2, "saved"));
  for (auto& [n, v] : state) {
    EXPECT_EQ(s2.at(n).dtype(), v.dtype()) << n;
    EXPECT_LT(relative_error(s2.at(n), v), 1e-7) << n;
  }
  std::filesystem::remove_all(dir);

  // Weights of a BatchNorm model without its running statistics.
  Params bare = params;
  const std::string e = error_of([&] { model->split(bare, "w.safetensors"); });
  EXPECT_NE(e.find("w.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("running_mean'"), std::string::npos) << e;
  EXPECT_NE(e.find("running statistics"), std::string::npos) << e;
  // Weights of another family.
  const auto vit = nn::model_from_preset("vit-tiny");
  const std::string other = error_of([&] { vit->check(params, {}, "w.safetensors"); });
  EXPECT_NE(other.find("[w.safetensors] missing parameter 'vit."), std::string::npos) << other;
}

// FLOPs per training image against the published forward counts
// (multiply-adds x 2): ResNet-50 4.1 G MACs, ConvNeXt-T 4.5 G, ViT-B/16 17.6 G.
TEST(Models, TrainingFlopsMatchThePublishedCounts) {
  auto forward_gmacs = [](const char* preset) {
    const auto m = nn::model_from_preset(preset);
    return m->train_flops_per_example(224) / 3 / 2 / 1e9;
  };
  EXPECT_NEAR(forward_gmacs("resnet-50"), 4.1, 0.1);
  EXPECT_NEAR(forward_gmacs("resnet-18"), 1.8, 0.05);
  EXPECT_NEAR(forward_gmacs("convnext-tiny"), 4.5, 0.1);
  EXPECT_NEAR(forward_gmacs("vit-base"), 17.6, 0.2);
}

// Drop path draws the same masks from a key held in an array (what a
// compiled step passes) as from the key itself, and none with drop off.
TEST(Models, ConvNextDrawsTheSameFromAKeyArray) {
  const auto m = nn::model_from_config(
      R"({"model_type": "convnext", "hidden_sizes": [8, 16], "depths": [2, 2], "num_labels": 3,
          "drop_path_rate": 0.8, "layer_scale_init_value": 0, "image_size": 32})",
      "c.json");
  const Params p = m->init(random::Key(1));
  const Array x = random::normal(random::Key(2), {4, 3, 32, 32});
  const Array key = random::key_array(random::Key(7));
  const auto a = m->apply(p, {}, x, {.train = true, .key = key}).logits;
  const auto b = m->apply(p, {}, x, {.train = true, .key = key}).logits;
  const auto c =
      m->apply(p, {}, x, {.train = true, .key = random::key_array(random::Key(8))}).logits;
  const auto off = m->apply(p, {}, x, {.train = true, .drop = false, .key = key}).logits;
  const auto eval = m->apply(p, {}, x).logits;
  EXPECT_EQ(relative_error(a, b), 0.0);
  EXPECT_GT(relative_error(a, c), 1e-3);
  EXPECT_EQ(relative_error(off, eval), 0.0);
  EXPECT_GT(relative_error(a, eval), 1e-3);
  EXPECT_TRUE(m->stochastic());
}

// A ViT with drop path (with_drop_path, --drop-path): off in evaluation
// (the same logits as without), drawn per key in training, kept in
// config.json; rates of 1 and more are errors.
TEST(Models, AViTsDropPathIsOffInEvaluationAndKeptInItsConfig) {
  const auto m = nn::model_from_config(
      R"({"model_type": "vit", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
          "intermediate_size": 32, "image_size": 16, "patch_size": 8, "num_labels": 3})",
      "v.json");
  EXPECT_FALSE(m->stochastic());
  const auto d = m->with_drop_path(0.6);
  EXPECT_TRUE(d->stochastic());
  const Params p = m->init(random::Key(1));
  const Array x = random::normal(random::Key(2), {8, 3, 16, 16});
  const Array key = random::key_array(random::Key(7));
  const auto eval = m->apply(p, {}, x).logits;
  EXPECT_EQ(relative_error(d->apply(p, {}, x).logits, eval), 0.0);
  EXPECT_EQ(relative_error(m->apply(p, {}, x, {.train = true, .key = key}).logits, eval), 0.0);
  const auto a = d->apply(p, {}, x, {.train = true, .key = key}).logits;
  EXPECT_GT(relative_error(a, eval), 1e-3);
  EXPECT_EQ(relative_error(d->apply(p, {}, x, {.train = true, .key = key}).logits, a), 0.0);
  const auto again = nn::model_from_config(d->config_json(), "saved.json");
  EXPECT_EQ(again->config_json(), d->config_json());
  EXPECT_EQ(relative_error(again->apply(p, {}, x, {.train = true, .key = key}).logits, a), 0.0);
  EXPECT_THROW(m->with_drop_path(1.0), Error);
}

// A new ViT for another image size (`--image-size`); a size its patches do
// not fit, or a model that takes any size, is an error naming the origin.
TEST(Models, AViTIsMadeForAnotherImageSize) {
  const auto m = nn::model_from_preset("vit-tiny");
  const auto r = m->with_image_size(nn::Size2d{64, 32}, "--image-size 64x32");
  EXPECT_EQ(r->image_size(), (nn::Size2d{64, 32}));
  EXPECT_EQ(r->parameter_shapes().size(), m->parameter_shapes().size());
  EXPECT_NE(
      test_util::error_of([&] { m->with_image_size(8, "--image-size 8"); }).find("--image-size 8"),
      std::string::npos);
  const auto resnet = nn::model_from_preset("resnet-18");
  EXPECT_NE(test_util::error_of([&] {
              resnet->with_image_size(64, "--image-size 64");
            }).find("takes images of any size"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
