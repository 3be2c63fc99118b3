// kiln io: HuggingFace config.json for ViT, ResNet and ConvNeXt.
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "kiln/io.h"

namespace kiln::io {
namespace {
using json = nlohmann::json;
// Fails naming the config file, a field and what is wrong with it.
using BadField = std::function<void(const std::string& field, const std::string& what)>;

// id2label's labels by id: keys the label ids 0 ... N-1 (transformers takes
// int(key): "07" is 7), each naming a label (a string, or a number written as
// one).
std::vector<std::string> parse_id2label(const json& v, const BadField& bad) {
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<std::string> labels(v.size());
  std::vector<bool> seen(v.size(), false);
  auto shown = [](const std::string& s) { return s.size() > 40 ? s.substr(0, 40) + "..." : s; };
  for (auto& [key, name] : v.items()) {
    int64_t id = -1;
    const size_t digits = key.find_first_not_of('0') == std::string::npos
                              ? 1
                              : key.size() - key.find_first_not_of('0');
    if (!key.empty() && digits <= 18 && key.find_first_not_of("0123456789") == std::string::npos)
      id = std::stoll(key.substr(key.size() - digits));
    if (id < 0 || id >= n || seen[id])
      bad("id2label", "has the key \"" + shown(key) + "\", expected the label ids 0 ... " +
                          std::to_string(n - 1) + ", each once");
    if (!name.is_string() && !name.is_number())
      bad("id2label", "has \"" + shown(key) + "\": " + shown(name.dump()) +
                          ", expected a label name (a string)");
    seen[id] = true;
    labels[id] = name.is_string() ? name.get<std::string>() : name.dump();
  }
  return labels;
}

// pruned_heads: {"layer": [heads]}.
std::map<int64_t, std::vector<int64_t>> parse_pruned_heads(const json& v, const BadField& bad) {
  const std::string shape = ", expected an object of layer: [heads], e.g. {\"0\": [1, 2]}";
  if (!v.is_object()) bad("pruned_heads", "is " + v.dump() + shape);
  std::map<int64_t, std::vector<int64_t>> pruned;
  for (auto& [key, heads] : v.items()) {
    int64_t layer = -1;
    try {
      size_t used = 0;
      layer = std::stoll(key, &used);
      if (used != key.size()) layer = -1;
    } catch (const std::exception&) {
    }
    if (layer < 0 || !heads.is_array())
      bad("pruned_heads", "has \"" + key + "\": " + heads.dump() + shape);
    for (const json& h : heads)
      if (!h.is_number_integer())
        bad("pruned_heads", "has \"" + key + "\": " + heads.dump() + shape);
    if (!heads.empty()) pruned[layer] = heads.get<std::vector<int64_t>>();
  }
  return pruned;
}

// hidden_act: one of transformers' ACT2FN names.
void parse_activation(const json& j, const BadField& bad, nn::Activation& dst) {
  if (!j.contains("hidden_act")) return;
  std::optional<nn::Activation> act;
  if (j["hidden_act"].is_string()) act = nn::activation_from_name(j["hidden_act"]);
  if (!act) {
    std::string names;
    for (const auto& n : nn::activation_names())
      names += (names.empty() ? "\"" : ", \"") + n + "\"";
    bad("hidden_act", "is " + j["hidden_act"].dump() +
                          ", expected one of transformers' activations (ACT2FN): " + names);
  }
  dst = *act;
}

// The labels: transformers (PretrainedConfig) takes the size of id2label
// when it is there (a num_labels beside it is overruled, with a warning),
// else num_labels, else 2; and problem_type.
void parse_labels(const json& j, const BadField& bad, int64_t& num_labels,
                  std::vector<std::string>& id2label, nn::ProblemType& problem) {
  num_labels = 2;
  if (j.contains("id2label")) {
    const json& v = j["id2label"];
    if (!v.is_object()) bad("id2label", "is " + v.dump() + ", expected an object");
    num_labels = static_cast<int64_t>(v.size());
    id2label = parse_id2label(v, bad);
  } else if (j.contains("num_labels")) {
    if (!j["num_labels"].is_number_integer())
      bad("num_labels", "is " + j["num_labels"].dump() + ", expected an integer");
    num_labels = j["num_labels"].get<int64_t>();
  }
  if (j.contains("problem_type") && !j["problem_type"].is_null()) {
    const json& v = j["problem_type"];
    if (v == "regression")
      problem = nn::ProblemType::Regression;
    else if (v == "single_label_classification")
      problem = nn::ProblemType::SingleLabel;
    else if (v == "multi_label_classification")
      problem = nn::ProblemType::MultiLabel;
    else
      bad("problem_type", "is " + v.dump() +
                              ", expected null, \"regression\", \"single_label_classification\" "
                              "or \"multi_label_classification\"");
  }
}

json parse_object(std::string_view text, const std::string& origin, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(origin, path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail(origin, path + ": expected a JSON object");
  return j;
}

}  // namespace

nn::ViTConfig load_vit_config(const std::string& path) {
  return parse_vit_config(read_file(path, "config"), path);
}

nn::ViTConfig parse_vit_config(std::string_view text, const std::string& path) {
  return parse_vit_family_config(text, path, "vit");
}

nn::ViTConfig load_deit_config(const std::string& path) {
  return parse_deit_config(read_file(path, "config"), path);
}

nn::ViTConfig parse_deit_config(std::string_view text, const std::string& path) {
  return parse_vit_family_config(text, path, "deit");
}

nn::ViTConfig parse_vit_family_config(std::string_view text, const std::string& path,
                                      const std::string& model_type) {
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
  if (j.contains("model_type") && j["model_type"] != model_type)
    bad("model_type", "is " + j["model_type"].dump() + ", expected \"" + model_type + "\"");
  nn::ViTConfig c;
  auto integer = [&](const char* f, int64_t& dst) {
    if (!j.contains(f)) return;
    if (!j[f].is_number_integer()) bad(f, "is " + j[f].dump() + ", expected an integer");
    dst = j[f].get<int64_t>();
  };
  // An integer (a square), or [height, width] as transformers' ViTPatchEmbeddings reads a pair.
  auto size2d = [&](const char* f, nn::Size2d& dst) {
    if (!j.contains(f)) return;
    const json& v = j[f];
    if (v.is_number_integer()) {
      dst = v.get<int64_t>();
    } else if (v.is_array() && v.size() == 2 && v[0].is_number_integer() &&
               v[1].is_number_integer()) {
      dst = {v[0].get<int64_t>(), v[1].get<int64_t>()};
    } else {
      bad(f, "is " + v.dump() + ", expected an integer or a list [height, width] of two integers");
    }
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
  size2d("image_size", c.image_size);
  size2d("patch_size", c.patch_size);
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
  parse_activation(j, bad, c.hidden_act);
  parse_labels(j, bad, c.num_labels, c.id2label, c.problem_type);
  if (j.contains("pruned_heads")) c.pruned_heads = parse_pruned_heads(j["pruned_heads"], bad);
  // Both of transformers' attention implementations for ViT compute
  // softmax(QKᵀ/√d)V, as kiln does; it has no others.
  for (const char* f : {"attn_implementation", "_attn_implementation"})
    if (j.contains(f) && !j[f].is_null() && j[f] != "eager" && j[f] != "sdpa")
      bad(f, "is " + j[f].dump() + ", expected \"eager\" or \"sdpa\" (transformers' " + model_type +
                 " has no other)");
  c.validate(origin + " " + path);
  return c;
}

nn::ResNetConfig load_resnet_config(const std::string& path) {
  return parse_resnet_config(read_file(path, "config"), path);
}

nn::ResNetConfig parse_resnet_config(std::string_view text, const std::string& path) {
  const std::string origin = "config";
  const json j = parse_object(text, origin, path);
  auto bad = [&](const std::string& field, const std::string& what) {
    fail(origin, path + ": field '" + field + "' " + what);
  };
  if (j.contains("model_type") && j["model_type"] != "resnet")
    bad("model_type", "is " + j["model_type"].dump() + ", expected \"resnet\"");
  nn::ResNetConfig c;
  auto integer = [&](const char* f, int64_t& dst) {
    if (!j.contains(f)) return;
    if (!j[f].is_number_integer()) bad(f, "is " + j[f].dump() + ", expected an integer");
    dst = j[f].get<int64_t>();
  };
  auto integers = [&](const char* f, std::vector<int64_t>& dst) {
    if (!j.contains(f)) return;
    const json& v = j[f];
    bool ok = v.is_array() && !v.empty();
    for (const json& e : v) ok = ok && e.is_number_integer();
    if (!ok) bad(f, "is " + v.dump() + ", expected a list of integers, one per stage");
    dst = v.get<std::vector<int64_t>>();
  };
  auto boolean = [&](const char* f, bool& dst) {
    if (!j.contains(f)) return;
    if (!j[f].is_boolean()) bad(f, "is " + j[f].dump() + ", expected true or false");
    dst = j[f].get<bool>();
  };
  integer("num_channels", c.num_channels);
  integer("embedding_size", c.embedding_size);
  integers("hidden_sizes", c.hidden_sizes);
  integers("depths", c.depths);
  if (j.contains("layer_type")) {
    if (j["layer_type"] != "basic" && j["layer_type"] != "bottleneck")
      bad("layer_type", "is " + j["layer_type"].dump() + ", expected \"basic\" or \"bottleneck\"");
    c.bottleneck = j["layer_type"] == "bottleneck";
  }
  parse_activation(j, bad, c.hidden_act);
  boolean("downsample_in_first_stage", c.downsample_in_first_stage);
  boolean("downsample_in_bottleneck", c.downsample_in_bottleneck);
  parse_labels(j, bad, c.num_labels, c.id2label, c.problem_type);
  c.validate(origin + " " + path);
  return c;
}

nn::ConvNextConfig load_convnext_config(const std::string& path) {
  return parse_convnext_config(read_file(path, "config"), path);
}

nn::ConvNextConfig parse_convnext_config(std::string_view text, const std::string& path) {
  const std::string origin = "config";
  const json j = parse_object(text, origin, path);
  auto bad = [&](const std::string& field, const std::string& what) {
    fail(origin, path + ": field '" + field + "' " + what);
  };
  if (j.contains("model_type") && j["model_type"] != "convnext")
    bad("model_type", "is " + j["model_type"].dump() + ", expected \"convnext\"");
  nn::ConvNextConfig c;
  auto integer = [&](const char* f, int64_t& dst) {
    if (!j.contains(f)) return;
    if (!j[f].is_number_integer()) bad(f, "is " + j[f].dump() + ", expected an integer");
    dst = j[f].get<int64_t>();
  };
  auto integers = [&](const char* f, std::vector<int64_t>& dst) {
    if (!j.contains(f) || j[f].is_null()) return;
    const json& v = j[f];
    bool ok = v.is_array() && !v.empty();
    for (const json& e : v) ok = ok && e.is_number_integer();
    if (!ok) bad(f, "is " + v.dump() + ", expected a list of integers, one per stage");
    dst = v.get<std::vector<int64_t>>();
  };
  auto real = [&](const char* f, double& dst) {
    if (!j.contains(f)) return;
    if (!j[f].is_number()) bad(f, "is " + j[f].dump() + ", expected a number");
    dst = j[f].get<double>();
  };
  integer("num_channels", c.num_channels);
  integer("patch_size", c.patch_size);
  integers("hidden_sizes", c.hidden_sizes);
  integers("depths", c.depths);
  if (j.contains("num_stages")) {
    int64_t stages = 0;
    integer("num_stages", stages);
    if (stages != static_cast<int64_t>(c.depths.size()))
      bad("num_stages", "is " + std::to_string(stages) + " for " + std::to_string(c.depths.size()) +
                            " depths: expected one depth per stage");
  }
  parse_activation(j, bad, c.hidden_act);
  real("initializer_range", c.initializer_range);
  real("layer_norm_eps", c.layer_norm_eps);
  real("layer_scale_init_value", c.layer_scale_init_value);
  real("drop_path_rate", c.drop_path_rate);
  integer("image_size", c.image_size);
  parse_labels(j, bad, c.num_labels, c.id2label, c.problem_type);
  c.validate(origin + " " + path);
  return c;
}

void save_vit_config(const std::string& path, const nn::ViTConfig& c) {
  json id2label = json::object(), label2id = json::object();
  for (int64_t i = 0; i < c.num_labels; ++i) {
    id2label[std::to_string(i)] = c.label_name(i);
    label2id[c.label_name(i)] = i;
  }
  auto size = [](const nn::Size2d& s) {
    return s.square() ? json(s.height) : json::array({s.height, s.width});
  };
  json j = {{"architectures", {"ViTForImageClassification"}},
            {"model_type", "vit"},
            {"hidden_size", c.hidden_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"intermediate_size", c.intermediate_size},
            {"hidden_act", nn::activation_name(c.hidden_act)},
            {"hidden_dropout_prob", c.hidden_dropout_prob},
            {"attention_probs_dropout_prob", c.attention_probs_dropout_prob},
            {"initializer_range", c.initializer_range},
            {"layer_norm_eps", c.layer_norm_eps},
            {"image_size", size(c.image_size)},
            {"patch_size", size(c.patch_size)},
            {"num_channels", c.num_channels},
            {"qkv_bias", c.qkv_bias},
            {"id2label", id2label},
            {"label2id", label2id},
            {"torch_dtype", "float32"}};
  // Only masked image modeling reads encoder_stride; ViTConfig's default is 16.
  if (c.patch_size.square()) j["encoder_stride"] = c.patch_size.height;
  if (c.problem_type != nn::ProblemType::Unset)
    j["problem_type"] = nn::problem_type_name(c.problem_type);
  if (!c.pruned_heads.empty()) {
    json pruned = json::object();
    for (const auto& [layer, heads] : c.pruned_heads) pruned[std::to_string(layer)] = heads;
    j["pruned_heads"] = pruned;
  }
  write_file_atomic(path, j.dump(2) + "\n");
}

}  // namespace kiln::io
