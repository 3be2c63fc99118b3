// kiln nn: the config.json fields the model families share.
#include "config_json.h"

#include <optional>

namespace kiln::nn::config_json {

json parse_object(std::string_view text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("config", path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail("config", path + ": expected a JSON object");
  return j;
}

BadField bad_field(const std::string& path) {
  return [path](const std::string& field, const std::string& what) {
    fail("config", path + ": field '" + field + "' " + what);
  };
}

void expect_model_type(const json& j, const BadField& bad, const std::string& expected) {
  if (j.contains("model_type") && j["model_type"] != expected)
    bad("model_type", "is " + j["model_type"].dump() + ", expected \"" + expected + "\"");
}

void integer(const json& j, const BadField& bad, const char* f, int64_t& dst) {
  if (!j.contains(f)) return;
  if (!j[f].is_number_integer()) bad(f, "is " + j[f].dump() + ", expected an integer");
  dst = j[f].get<int64_t>();
}

void real(const json& j, const BadField& bad, const char* f, double& dst) {
  if (!j.contains(f)) return;
  if (!j[f].is_number()) bad(f, "is " + j[f].dump() + ", expected a number");
  dst = j[f].get<double>();
}

void boolean(const json& j, const BadField& bad, const char* f, bool& dst) {
  if (!j.contains(f)) return;
  if (!j[f].is_boolean()) bad(f, "is " + j[f].dump() + ", expected true or false");
  dst = j[f].get<bool>();
}

void integers(const json& j, const BadField& bad, const char* f, std::vector<int64_t>& dst) {
  if (!j.contains(f) || j[f].is_null()) return;
  const json& v = j[f];
  bool ok = v.is_array() && !v.empty();
  for (const json& e : v) ok = ok && e.is_number_integer();
  if (!ok) bad(f, "is " + v.dump() + ", expected a list of integers, one per stage");
  dst = v.get<std::vector<int64_t>>();
}

namespace {

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

}  // namespace

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

void parse_activation(const json& j, const BadField& bad, Activation& dst) {
  if (!j.contains("hidden_act")) return;
  std::optional<Activation> act;
  if (j["hidden_act"].is_string()) act = activation_from_name(j["hidden_act"]);
  if (!act) {
    std::string names;
    for (const auto& n : activation_names()) names += (names.empty() ? "\"" : ", \"") + n + "\"";
    bad("hidden_act", "is " + j["hidden_act"].dump() +
                          ", expected one of transformers' activations (ACT2FN): " + names);
  }
  dst = *act;
}

void parse_labels(const json& j, const BadField& bad, int64_t& num_labels,
                  std::vector<std::string>& id2label, ProblemType& problem) {
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
      problem = ProblemType::Regression;
    else if (v == "single_label_classification")
      problem = ProblemType::SingleLabel;
    else if (v == "multi_label_classification")
      problem = ProblemType::MultiLabel;
    else
      bad("problem_type", "is " + v.dump() +
                              ", expected null, \"regression\", \"single_label_classification\" "
                              "or \"multi_label_classification\"");
  }
}

std::string label_name(const std::vector<std::string>& id2label, int64_t i) {
  return i < static_cast<int64_t>(id2label.size()) ? id2label[i] : "LABEL_" + std::to_string(i);
}

std::vector<std::string> label_names(int64_t num_labels, const std::vector<std::string>& id2label) {
  std::vector<std::string> names;
  for (int64_t i = 0; i < num_labels; ++i) names.push_back(label_name(id2label, i));
  return names;
}

void write_labels(json& j, int64_t num_labels, const std::vector<std::string>& id2label,
                  ProblemType problem) {
  json ids = json::object(), names = json::object();
  for (int64_t i = 0; i < num_labels; ++i) {
    ids[std::to_string(i)] = label_name(id2label, i);
    names[label_name(id2label, i)] = i;
  }
  j["id2label"] = ids;
  j["label2id"] = names;
  if (problem != ProblemType::Unset) j["problem_type"] = problem_type_name(problem);
}

int64_t index_after(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && j - i < 9 && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || (j < name.size() && name[j] != '.')) return -1;
  return std::stoll(name.substr(i, j - i));
}

}  // namespace kiln::nn::config_json
