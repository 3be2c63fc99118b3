// config.json: every field transformers' ViTForImageClassification reads, the
// ones that change nothing it computes, and an error naming the field for
// each value kiln cannot honour.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "kiln/io.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class ConfigFile {
 public:
  ConfigFile()
      : dir_(fs::temp_directory_path() / ("kiln-config-test-" + std::to_string(::getpid()) + "-" +
                                          std::to_string(counter_++))) {
    fs::create_directories(dir_);
  }
  ~ConfigFile() { fs::remove_all(dir_); }
  std::string path() const { return (dir_ / "config.json").string(); }
  nn::ViTConfig load(const std::string& json) const {
    std::ofstream(path()) << json;
    return io::load_config<nn::ViTConfig>(path());
  }
  // The error load() raises, or "no error".
  std::string error(const std::string& json) const {
    try {
      load(json);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }

 private:
  static inline int counter_ = 0;
  fs::path dir_;
};

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(Config, ReadsTransformersConfig) {
  auto c =
      io::load_config<nn::ViTConfig>(std::string(KILN_FIXTURES_DIR) + "/vit_golden/config.json");
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.intermediate_size, 64);
  EXPECT_EQ(c.image_size, nn::Size2d(32));
  EXPECT_EQ(c.patch_size, nn::Size2d(8));
  EXPECT_EQ(c.num_labels, 10);  // from id2label
  EXPECT_EQ(c.problem_type, nn::ProblemType::Unset);
  EXPECT_TRUE(c.pruned_heads.empty());
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-12);
  EXPECT_TRUE(c.qkv_bias);
}

TEST(Config, ImageAndPatchSizesAreIntegersOrHeightWidthPairs) {
  ConfigFile f;
  auto c = f.load(R"({"image_size": [30, 20], "patch_size": [8, 6]})");
  EXPECT_EQ(c.image_size, nn::Size2d(30, 20));
  EXPECT_EQ(c.patch_size, nn::Size2d(8, 6));
  // Conv2d(stride = kernel) drops the remainder: 3 x 3 patches of 8 x 6.
  EXPECT_EQ(c.grid(), nn::Size2d(3, 3));
  EXPECT_EQ(c.num_patches(), 9);
  c = f.load(R"({"image_size": 36, "patch_size": [16, 8]})");
  EXPECT_EQ(c.grid(), nn::Size2d(2, 4));
  EXPECT_HAS(f.error(R"({"image_size": [30, 20, 3]})"),
             "field 'image_size' is [30,20,3], expected an integer or a list [height, width]");
  EXPECT_HAS(f.error(R"({"patch_size": 16.5})"), "field 'patch_size' is 16.5");
  EXPECT_HAS(f.error(R"({"image_size": [8, 8], "patch_size": [4, 16]})"),
             "patch_size 4x16 is larger than image_size 8 (height x width)");
  EXPECT_HAS(f.error(R"({"image_size": [0, 8]})"), "image_size (height) must be positive, got 0");
}

TEST(Config, ReadsEveryActivationOfTransformersAct2fn) {
  ConfigFile f;
  const std::vector<std::string> act2fn = {
      "gelu",          "gelu_10", "gelu_fast",  "gelu_new", "gelu_python", "gelu_pytorch_tanh",
      "gelu_accurate", "laplace", "leaky_relu", "linear",   "mish",        "quick_gelu",
      "relu",          "relu2",   "relu6",      "sigmoid",  "silu",        "swish",
      "tanh"};
  EXPECT_EQ(nn::activation_names(), act2fn);
  for (const auto& name : act2fn) {
    auto c = f.load(R"({"hidden_act": ")" + name + "\"}");
    EXPECT_EQ(nn::activation_name(c.hidden_act), name);
  }
  // ViTConfig's docstring names "selu", but ACT2FN has no such key.
  std::string err = f.error(R"({"hidden_act": "selu"})");
  EXPECT_HAS(err, "field 'hidden_act' is \"selu\", expected one of transformers' activations");
  EXPECT_HAS(err, "\"gelu\", \"gelu_10\"");
  EXPECT_HAS(f.error(R"({"hidden_act": 3})"), "field 'hidden_act' is 3");
}

TEST(Config, Id2labelDecidesTheNumberOfLabelsAsInTransformers) {
  ConfigFile f;
  EXPECT_EQ(f.load("{}").num_labels, 2);  // PretrainedConfig's default
  EXPECT_EQ(f.load(R"({"num_labels": 5})").num_labels, 5);
  // PretrainedConfig keeps id2label and overrules a disagreeing num_labels.
  EXPECT_EQ(f.load(R"({"num_labels": 5, "id2label": {"0": "cat", "1": "dog"}})").num_labels, 2);
  // No labels: the classifier is nn.Identity and the logits are the [CLS] features.
  auto c = f.load(R"({"num_labels": 0, "hidden_size": 24, "num_attention_heads": 4})");
  EXPECT_EQ(c.num_labels, 0);
  EXPECT_EQ(c.num_logits(), 24);
  EXPECT_HAS(f.error(R"({"num_labels": -1})"),
             "num_labels must be >= 0 (0: no classifier), got -1");
  EXPECT_HAS(f.error(R"({"id2label": ["cat"]})"),
             "field 'id2label' is [\"cat\"], expected an object");
}

TEST(Config, LabelNamesAreKeptAndSaved) {
  ConfigFile f;
  auto c = f.load(R"({"id2label": {"1": "dog", "0": "cat", "2": "tench"}, "label2id": {"x": 9}})");
  EXPECT_EQ(c.id2label, (std::vector<std::string>{"cat", "dog", "tench"}));
  EXPECT_EQ(c.label_name(2), "tench");
  // Without id2label, transformers' names.
  EXPECT_EQ(f.load(R"({"num_labels": 3})").label_name(1), "LABEL_1");
  io::save_config(f.path(), c);
  EXPECT_EQ(io::load_config<nn::ViTConfig>(f.path()).id2label, c.id2label);
  std::ifstream saved(f.path());
  std::string text((std::istreambuf_iterator<char>(saved)), std::istreambuf_iterator<char>());
  EXPECT_HAS(text, "\"tench\": 2");  // label2id
  // Keys are the ids 0 ... N-1, each once; names are strings.
  EXPECT_HAS(f.error(R"({"id2label": {"0": "a", "2": "b"}})"),
             "field 'id2label' has the key \"2\", expected the label ids 0 ... 1, each once");
  EXPECT_HAS(f.error(R"({"id2label": {"0": "a", "x": "b"}})"), "has the key \"x\"");
  EXPECT_HAS(f.error(R"({"id2label": {"0": "a", "-1": "b"}})"), "has the key \"-1\"");
  EXPECT_HAS(f.error(R"({"id2label": {"0": [7]}})"),
             "field 'id2label' has \"0\": [7], expected a label name (a string)");
  // As transformers' int(key): leading zeros; numbers name labels too.
  EXPECT_EQ(f.load(R"({"id2label": {"00": "a", "01": 7}})").id2label,
            (std::vector<std::string>{"a", "7"}));
}

TEST(Config, ProblemTypeDecidesTheLossOrTheLabelsDo) {
  ConfigFile f;
  auto c = f.load(R"({"problem_type": "multi_label_classification", "num_labels": 3})");
  EXPECT_EQ(c.problem_type, nn::ProblemType::MultiLabel);
  EXPECT_EQ(c.problem_for(DType::i64), nn::ProblemType::MultiLabel);
  EXPECT_EQ(f.load(R"({"problem_type": "regression"})").problem_type, nn::ProblemType::Regression);
  EXPECT_EQ(f.load(R"({"problem_type": null})").problem_type, nn::ProblemType::Unset);
  // Unset, as ViTForImageClassification.forward decides it: one label is
  // regression; integer labels are classes; anything else is multi-label.
  c = f.load(R"({"num_labels": 1})");
  EXPECT_EQ(c.problem_for(DType::i64), nn::ProblemType::Regression);
  c = f.load(R"({"num_labels": 3})");
  EXPECT_EQ(c.problem_for(DType::i32), nn::ProblemType::SingleLabel);
  EXPECT_EQ(c.problem_for(DType::f32), nn::ProblemType::MultiLabel);
  EXPECT_HAS(f.error(R"({"problem_type": "ranking"})"),
             "field 'problem_type' is \"ranking\", expected null, \"regression\", "
             "\"single_label_classification\" or \"multi_label_classification\"");
  EXPECT_HAS(f.error(R"({"problem_type": "single_label_classification", "num_labels": 0})"),
             "problem_type single_label_classification needs num_labels >= 1");
}

TEST(Config, PrunedHeadsNarrowTheirLayers) {
  ConfigFile f;
  auto c = f.load(R"({"num_hidden_layers": 3, "hidden_size": 32, "num_attention_heads": 4,
                      "pruned_heads": {"0": [1, 3], "2": [0, 0], "1": []}})");
  EXPECT_EQ(c.heads_in_layer(0), 2);
  EXPECT_EQ(c.heads_in_layer(1), 4);
  EXPECT_EQ(c.heads_in_layer(2), 3);  // a set, as transformers prunes it
  std::map<std::string, Shape> shapes;
  for (auto& [name, shape] : nn::ViTForImageClassification(c).parameter_shapes())
    shapes[name] = shape;
  EXPECT_EQ(shapes["vit.encoder.layer.0.attention.attention.query.weight"], (Shape{16, 32}));
  EXPECT_EQ(shapes["vit.encoder.layer.0.attention.output.dense.weight"], (Shape{32, 16}));
  EXPECT_EQ(shapes["vit.encoder.layer.1.attention.attention.key.weight"], (Shape{32, 32}));
  EXPECT_EQ(shapes["vit.encoder.layer.2.attention.attention.value.bias"], (Shape{24}));
  const std::string base =
      R"({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32, )";
  EXPECT_HAS(f.error(base + R"("pruned_heads": {"2": [0]}})"),
             "pruned_heads: layer 2 is outside [0, 2) (num_hidden_layers)");
  EXPECT_HAS(f.error(base + R"("pruned_heads": {"0": [4]}})"),
             "pruned_heads: layer 0: head 4 is outside [0, 4) (num_attention_heads)");
  EXPECT_HAS(f.error(base + R"("pruned_heads": {"1": [0, 1, 2, 3]}})"),
             "pruned_heads: layer 1: every one of its 4 heads is pruned; kiln needs at least one "
             "head per layer");
  EXPECT_HAS(f.error(base + R"("pruned_heads": {"first": [0]}})"),
             "field 'pruned_heads' has \"first\": [0], expected an object of layer: [heads]");
  EXPECT_HAS(f.error(base + R"("pruned_heads": [[0]]})"), "field 'pruned_heads' is [[0]]");
}

// Fields transformers reads that change nothing ViTForImageClassification
// computes: masked image modeling's encoder_stride, ViTModel's pooler (not
// built for classification), the attention implementation (eager and sdpa
// compute the same), the dtype (from_pretrained loads f32 unless told
// otherwise), output and serialization switches, and keys it merely stores.
TEST(Config, FieldsThatChangeNothingAreAccepted) {
  ConfigFile f;
  auto c = f.load(R"({
    "encoder_stride": 8, "pooler_output_size": 12, "pooler_act": "tanh",
    "attn_implementation": "sdpa", "_attn_implementation": "eager", "torch_dtype": "bfloat16",
    "use_bfloat16": true, "chunk_size_feed_forward": 4, "output_attentions": true,
    "output_hidden_states": true, "return_dict": false, "torchscript": true,
    "tie_word_embeddings": false, "gradient_checkpointing": true, "label2id": {"a": 0},
    "architectures": ["ViTForImageClassification"], "transformers_version": "4.46.3",
    "finetuning_task": "cats", "my_own_note": [1, 2, 3]})");
  EXPECT_EQ(c.hidden_size, 768);
  EXPECT_HAS(
      f.error(R"({"attn_implementation": "flash_attention_2"})"),
      "field 'attn_implementation' is \"flash_attention_2\", expected \"eager\" or \"sdpa\"");
  EXPECT_HAS(f.error(R"({"model_type": "bert"})"),
             "field 'model_type' is \"bert\", expected \"vit\"");
}

TEST(Config, DropoutOfOneIsAcceptedAsInTorch) {
  ConfigFile f;
  EXPECT_DOUBLE_EQ(f.load(R"({"hidden_dropout_prob": 1.0})").hidden_dropout_prob, 1.0);
  EXPECT_HAS(f.error(R"({"hidden_dropout_prob": 1.5})"),
             "hidden_dropout_prob must lie in [0, 1], got 1.5");
}

TEST(Config, OtherMalformedValuesNameTheField) {
  ConfigFile f;
  EXPECT_HAS(f.error(R"({"hidden_size": "big"})"),
             "field 'hidden_size' is \"big\", expected an integer");
  EXPECT_HAS(f.error(R"({"hidden_size": 100, "num_attention_heads": 12})"),
             "hidden_size 100 is not a multiple of num_attention_heads 12");
  EXPECT_HAS(f.error(R"({"qkv_bias": 1})"), "field 'qkv_bias' is 1, expected true or false");
  EXPECT_HAS(f.error("{not json"), "not valid JSON");
  EXPECT_HAS(f.error(R"({"hidden_size": "big"})"), f.path());
  EXPECT_EQ(f.error(R"({"hidden_act": "gelu_new", "num_labels": 3, "image_size": 30})"),
            "no error");
}

// Sizes whose products (parameter counts, shapes) would overflow 64 bits are
// refused before anything is derived from them (found by fuzz/config_fuzz.cpp).
TEST(Config, SizesThatWouldOverflowAreRefused) {
  ConfigFile f;
  EXPECT_HAS(f.error(R"({"image_size": 4611686018427387904, "patch_size": 1})"),
             "image_size (height) is 4611686018427387904, expected at most 1048576");
  EXPECT_HAS(f.error(R"({"num_hidden_layers": 100000000})"),
             "num_hidden_layers is 100000000, expected at most 4096");
  EXPECT_HAS(f.error(R"({"hidden_size": 1048576, "num_attention_heads": 1, "num_channels": 1048576,)"
                     R"( "image_size": 1048576, "patch_size": 1048576})"),
             "the patch projection (hidden_size x num_channels x patch height x width) has "
             "1.21e+24 elements, expected at most 2^40");
}

TEST(Config, RoundTripsThroughSave) {
  ConfigFile f;
  nn::ViTConfig c = nn::ViTConfig::preset("vit-small");
  c.hidden_act = nn::Activation::GeluNew;
  c.num_labels = 7;
  c.hidden_dropout_prob = 0.1;
  c.image_size = {30, 20};
  c.patch_size = {8, 6};
  c.problem_type = nn::ProblemType::MultiLabel;
  c.pruned_heads = {{0, {1, 2}}, {11, {5}}};
  io::save_config(f.path(), c);
  auto back = io::load_config<nn::ViTConfig>(f.path());
  EXPECT_EQ(back.hidden_size, 384);
  EXPECT_EQ(back.num_labels, 7);
  EXPECT_EQ(back.hidden_act, nn::Activation::GeluNew);
  EXPECT_DOUBLE_EQ(back.hidden_dropout_prob, 0.1);
  EXPECT_EQ(back.image_size, nn::Size2d(30, 20));
  EXPECT_EQ(back.patch_size, nn::Size2d(8, 6));
  EXPECT_EQ(back.problem_type, nn::ProblemType::MultiLabel);
  EXPECT_EQ(back.pruned_heads, c.pruned_heads);

  c = nn::ViTConfig::preset("vit-tiny");
  c.num_labels = 0;
  io::save_config(f.path(), c);
  back = io::load_config<nn::ViTConfig>(f.path());
  EXPECT_EQ(back.num_labels, 0);
  EXPECT_EQ(back.image_size, nn::Size2d(224));
  EXPECT_EQ(back.problem_type, nn::ProblemType::Unset);
}

}  // namespace
}  // namespace kiln
