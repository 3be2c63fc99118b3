// kiln io: HuggingFace config.json for ViT.
#include <nlohmann/json.hpp>

#include "kiln/io.h"

namespace kiln::io {
namespace {
using json = nlohmann::json;
}

nn::ViTConfig load_vit_config(const std::string& path) {
  return parse_vit_config(read_file(path, "config"), path);
}

nn::ViTConfig parse_vit_config(std::string_view text, const std::string& path) {
  const std::string origin = "config";
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(origin, path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail(origin, path + ": expected a JSON object");
  auto bad = [&](const std::string& field, const std::string& what) {
    fail(origin, path + ": field '" + field + "' " + what);
  };
  if (j.contains("model_type") && j["model_type"] != "vit")
    bad("model_type", "is " + j["model_type"].dump() + ", expected \"vit\"");
  nn::ViTConfig c;
  auto integer = [&](const char* f, int64_t& dst) {
    if (!j.contains(f)) return;
    if (!j[f].is_number_integer()) bad(f, "is " + j[f].dump() + ", expected an integer");
    dst = j[f].get<int64_t>();
  };
  auto real = [&](const char* f, double& dst) {
    if (!j.contains(f)) return;
    if (!j[f].is_number()) bad(f, "is " + j[f].dump() + ", expected a number");
    dst = j[f].get<double>();
  };
  integer("hidden_size", c.hidden_size);
  integer("num_hidden_layers", c.num_hidden_layers);
  integer("num_attention_heads", c.num_attention_heads);
  integer("intermediate_size", c.intermediate_size);
  integer("image_size", c.image_size);
  integer("patch_size", c.patch_size);
  integer("num_channels", c.num_channels);
  real("hidden_dropout_prob", c.hidden_dropout_prob);
  real("attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  real("initializer_range", c.initializer_range);
  real("layer_norm_eps", c.layer_norm_eps);
  if (j.contains("qkv_bias")) {
    if (!j["qkv_bias"].is_boolean())
      bad("qkv_bias", "is " + j["qkv_bias"].dump() + ", expected true or false");
    c.qkv_bias = j["qkv_bias"].get<bool>();
  }
  if (j.contains("hidden_act")) {
    std::string act = j["hidden_act"].is_string() ? j["hidden_act"].get<std::string>() : "";
    if (act == "gelu")
      c.hidden_act = nn::Activation::Gelu;
    else if (act == "gelu_new" || act == "gelu_pytorch_tanh")
      c.hidden_act = nn::Activation::GeluTanh;
    else if (act == "relu")
      c.hidden_act = nn::Activation::Relu;
    else
      bad("hidden_act",
          "is " + j["hidden_act"].dump() +
              ", expected one of \"gelu\", \"gelu_new\", \"gelu_pytorch_tanh\", \"relu\"");
  }
  // transformers: num_labels, else the size of id2label, else PretrainedConfig's 2.
  c.num_labels = 2;
  if (j.contains("id2label")) {
    if (!j["id2label"].is_object()) bad("id2label", "is not an object");
    c.num_labels = static_cast<int64_t>(j["id2label"].size());
  }
  integer("num_labels", c.num_labels);
  c.validate(origin + " " + path);
  return c;
}

void save_vit_config(const std::string& path, const nn::ViTConfig& c) {
  json id2label = json::object(), label2id = json::object();
  for (int64_t i = 0; i < c.num_labels; ++i) {
    id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
    label2id["LABEL_" + std::to_string(i)] = i;
  }
  const char* act = c.hidden_act == nn::Activation::Gelu       ? "gelu"
                    : c.hidden_act == nn::Activation::GeluTanh ? "gelu_pytorch_tanh"
                                                               : "relu";
  json j = {{"architectures", {"ViTForImageClassification"}},
            {"model_type", "vit"},
            {"hidden_size", c.hidden_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"intermediate_size", c.intermediate_size},
            {"hidden_act", act},
            {"hidden_dropout_prob", c.hidden_dropout_prob},
            {"attention_probs_dropout_prob", c.attention_probs_dropout_prob},
            {"initializer_range", c.initializer_range},
            {"layer_norm_eps", c.layer_norm_eps},
            {"image_size", c.image_size},
            {"patch_size", c.patch_size},
            {"num_channels", c.num_channels},
            {"qkv_bias", c.qkv_bias},
            {"encoder_stride", c.patch_size},
            {"id2label", id2label},
            {"label2id", label2id},
            {"torch_dtype", "float32"}};
  write_file_atomic(path, j.dump(2) + "\n");
}

}  // namespace kiln::io
