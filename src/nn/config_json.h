// kiln nn (internal): reading and writing the fields of transformers'
// config.json that the model families share.
#pragma once
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/nn.h"

namespace kiln::nn::config_json {

using json = nlohmann::json;
// Fails naming the config file, a field and what is wrong with it.
using BadField = std::function<void(const std::string& field, const std::string& what)>;

// The text as a JSON object; errors name "config" and `path`.
json parse_object(std::string_view text, const std::string& path);
// A BadField that names "config" and `path`.
BadField bad_field(const std::string& path);
// Fails unless model_type is absent or `expected`.
void expect_model_type(const json& j, const BadField& bad, const std::string& expected);

// Typed fields, left as they are when absent.
void integer(const json& j, const BadField& bad, const char* f, int64_t& dst);
void real(const json& j, const BadField& bad, const char* f, double& dst);
void boolean(const json& j, const BadField& bad, const char* f, bool& dst);
// A non-empty list of integers, one per stage (null: left as it is).
void integers(const json& j, const BadField& bad, const char* f, std::vector<int64_t>& dst);

// hidden_act: one of transformers' ACT2FN names.
void parse_activation(const json& j, const BadField& bad, Activation& dst);
// The labels: transformers (PretrainedConfig) takes the size of id2label
// when it is there (a num_labels beside it is overruled, with a warning),
// else num_labels, else 2; and problem_type.
void parse_labels(const json& j, const BadField& bad, int64_t& num_labels,
                  std::vector<std::string>& id2label, ProblemType& problem);
// pruned_heads: {"layer": [heads]}.
std::map<int64_t, std::vector<int64_t>> parse_pruned_heads(const json& v, const BadField& bad);

// id2label, label2id and problem_type (when set) as save_pretrained writes them.
void write_labels(json& j, int64_t num_labels, const std::vector<std::string>& id2label,
                  ProblemType problem);
// label i's name: id2label[i], or transformers' LABEL_i.
std::string label_name(const std::vector<std::string>& id2label, int64_t i);
// Every label's name, in label order.
std::vector<std::string> label_names(int64_t num_labels, const std::vector<std::string>& id2label);

// The number after `prefix` in a parameter name ("vit.encoder.layer." in
// "vit.encoder.layer.3.output.dense.weight": 3), -1 where the name does not
// start with prefix and a number followed by '.' (or its end).
int64_t index_after(const std::string& name, const std::string& prefix);

}  // namespace kiln::nn::config_json
