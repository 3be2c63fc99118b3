// kiln nn: the model registry, and what every model shares.
#include "kiln/model.h"

#include <cmath>

#include <algorithm>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

namespace kiln::nn {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, ModelFamily> families;  // by model_type
};
Registry& registry() {
  static Registry r;
  return r;
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s;
}

void check_tree(const Params& tree, const std::vector<std::pair<std::string, Shape>>& shapes,
                const std::string& origin, const char* what) {
  std::set<std::string> expected;
  for (const auto& [name, shape] : shapes) {
    expected.insert(name);
    auto it = tree.find(name);
    if (it == tree.end()) fail(origin, std::string("missing ") + what + " '" + name + "'");
    if (it->second.shape() != shape)
      fail(origin, std::string(what) + " '" + name + "' has shape " + str(it->second.shape()) +
                       ", expected " + str(shape));
  }
  for (const auto& [name, v] : tree)
    if (!expected.count(name))
      fail(origin, std::string("unexpected ") + what + " '" + name + "' (not one of the model's)");
}

}  // namespace

void Model::check(const Params& params, const Params& state, const std::string& origin) const {
  check_tree(params, parameter_shapes(), origin, "parameter");
  check_tree(state, state_shapes(), origin, "state entry");
}

std::pair<Params, Params> Model::split(Params weights, const std::string& origin) const {
  Params state;
  for (const auto& [name, shape] : state_shapes()) {
    auto it = weights.find(name);
    if (it == weights.end())
      fail(origin, "no tensor '" + name + "': the " + architecture() +
                       " keeps its running statistics with its weights (a BatchNorm saved "
                       "without them cannot be evaluated)");
    state.emplace(name, it->second);
    weights.erase(it);
  }
  return {std::move(weights), std::move(state)};
}

std::shared_ptr<const Model> Model::with_image_size(Size2d /*size*/,
                                                    const std::string& origin) const {
  fail(origin, architecture() + " takes images of any size: there is no size to set");
}

std::shared_ptr<const Model> Model::with_drop_path(double /*rate*/) const {
  fail("--drop-path",
       architecture() + " has no stochastic depth (drop path) to set; ViT, DeiT and ConvNeXt have");
}

Params Model::init_head(const random::Key& key) const {
  const Params all = init(key);
  Params head;
  for (const auto& name : head_parameters()) head.emplace(name, all.at(name));
  return head;
}

std::shared_ptr<const Model> Model::resized(Params& /*params*/, Size2d size,
                                            std::vector<std::string>& /*notes*/) const {
  return with_image_size(size, "image size " + to_string(size));
}

std::set<std::string> Model::head_parameters() const {
  // The parameters whose shapes change with one label more.
  std::vector<std::string> names = label_names();
  names.push_back("LABEL_" + std::to_string(names.size()));
  std::map<std::string, Shape> more;
  for (const auto& [name, shape] : with_labels(names)->parameter_shapes())
    more.emplace(name, shape);
  std::set<std::string> head;
  for (const auto& [name, shape] : more) head.insert(name);
  for (const auto& [name, shape] : parameter_shapes()) {
    auto it = more.find(name);
    if (it != more.end() && it->second == shape) head.erase(name);
  }
  return head;
}

Array Model::loss(const Array& logits, const Array& labels, double label_smoothing) const {
  const std::string who = model_type();
  return classification_loss(logits, labels, num_labels(), problem_type(), label_smoothing,
                             who.c_str());
}

bool register_model_family(ModelFamily family) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.families.count(family.model_type))
    fail("models", "the model type \"" + family.model_type + "\" is registered twice");
  std::string type = family.model_type;
  r.families.emplace(std::move(type), std::move(family));
  return true;
}

std::vector<std::string> model_types() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> types;
  for (const auto& [type, f] : r.families) types.push_back(type);
  return types;
}

std::vector<std::string> model_presets() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [type, f] : r.families)
    names.insert(names.end(), f.presets.begin(), f.presets.end());
  std::sort(names.begin(), names.end());
  return names;
}

std::shared_ptr<const Model> model_from_config(std::string_view text, const std::string& origin,
                                               const std::string& missing_type) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("config", origin + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail("config", origin + ": expected a JSON object");
  const std::string known = quoted_list(model_types());
  if (!j.contains("model_type") && missing_type.empty())
    fail("config",
         origin + ": no field 'model_type', expected one of kiln's model types: " + known);
  if (j.contains("model_type") && !j["model_type"].is_string())
    fail("config", origin + ": field 'model_type' is " + j["model_type"].dump() +
                       ", expected one of kiln's model types: " + known);
  const std::string type =
      j.contains("model_type") ? j["model_type"].get<std::string>() : missing_type;
  ModelFamily family;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.families.find(type);
    if (it == r.families.end())
      fail("config", origin + ": field 'model_type' is \"" + type +
                         "\", which kiln does not have; its model types: " + known);
    family = it->second;
  }
  return family.from_config(text, origin);
}

std::shared_ptr<const Model> model_from_preset(const std::string& name) {
  ModelFamily family;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    for (const auto& [type, f] : r.families)
      if (std::find(f.presets.begin(), f.presets.end(), name) != f.presets.end()) family = f;
  }
  if (!family.from_preset)
    fail("model",
         "unknown preset \"" + name + "\"; kiln's presets: " + quoted_list(model_presets()));
  return family.from_preset(name);
}

std::map<std::string, double> layer_decay_scales(const Model& model, double decay) {
  if (!(decay > 0 && decay <= 1))
    fail("layer decay", std::to_string(decay) + ", expected a value in (0, 1]");
  const int64_t last = model.num_layer_groups() - 1;
  std::map<std::string, double> out;
  for (const auto& [name, shape] : model.parameter_shapes()) {
    const int64_t g = model.layer_group(name);
    if (g < 0 || g > last)
      fail("layer decay", model.model_type() + " puts '" + name + "' in layer group " +
                              std::to_string(g) + " of " + std::to_string(last + 1));
    out[name] = std::pow(decay, static_cast<double>(last - g));
  }
  return out;
}

}  // namespace kiln::nn
