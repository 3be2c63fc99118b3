// kiln io: pretrained models as transformers saves them (a folder) or as the
// Hugging Face Hub cache holds them, read into their family's names (a ViT's
// headless and transformers 5 names converted); and a classifier for new
// labels.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "internal.h"
#include "kiln/io.h"

namespace kiln::io {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

void check_model_file_name(const std::string& name, const std::string& where,
                           const std::string& origin) {
  if (name.empty() || name.size() > 255 || name == "." || name == ".." ||
      name.find('/') != std::string::npos || name.find('\\') != std::string::npos ||
      name.find('\0') != std::string::npos)
    fail(origin, where + " names the file \"" + name.substr(0, 80) +
                     (name.size() > 80 ? "...\"" : "\"") +
                     ", expected a file name in the model's folder (no folders, no '..')");
}
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kOrigin = "model";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// transformers 5's module names in memory (its save_pretrained writes 4.x's),
// per encoder layer: 5.x -> 4.x.
constexpr std::pair<const char*, const char*> kV5Names[] = {
    {"attention.q_proj.", "attention.attention.query."},
    {"attention.k_proj.", "attention.attention.key."},
    {"attention.v_proj.", "attention.attention.value."},
    {"attention.o_proj.", "attention.output.dense."},
    {"mlp.fc1.", "intermediate.dense."},
    {"mlp.fc2.", "output.dense."}};

// A checkpoint's tensor name in ViTForImageClassification's: ViTModel's lack
// the "vit." prefix; transformers 5's encoder is "layers.N" with new modules.
std::string classifier_name(std::string name) {
  if (starts_with(name, "classifier.")) return name;
  if (!starts_with(name, "vit.")) name = "vit." + name;
  const std::string layers = "vit.layers.";
  if (starts_with(name, layers)) {
    size_t dot = name.find('.', layers.size());
    if (dot == std::string::npos) return name;
    std::string rest = name.substr(dot + 1);
    for (const auto& [v5, v4] : kV5Names)
      if (starts_with(rest, v5)) {
        rest = v4 + rest.substr(std::strlen(v5));
        break;
      }
    name = "vit.encoder.layer." + name.substr(layers.size(), dot - layers.size()) + "." + rest;
  }
  return name;
}

// `path`, once it is checked that its links lead inside `root` (a
// repository's folder of the Hub cache; "": anywhere).
std::string confined(const std::string& path, const std::string& root) {
  if (root.empty()) return path;
  std::error_code ec;
  fs::path real = fs::canonical(path, ec);
  if (ec) fail(kOrigin, path + ": cannot resolve (" + ec.message() + ")");
  fs::path base = fs::canonical(root, ec);
  auto rel = real.lexically_relative(base);
  if (ec || rel.empty() || *rel.begin() == "..")
    fail(kOrigin, path + " leads to " + real.string() + ", outside " + root +
                      " (a link out of the Hub cache's repository folder)");
  return path;
}

// Whether `path` exists (a broken link does not); an error that is not "no
// such file" (too long a name, a loop of links, no permission) names it.
bool exists(const std::string& path) {
  std::error_code ec;
  const bool there = fs::exists(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
    fail(kOrigin, path + ": " + ec.message());
  return there;
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return exists(path) && fs::is_directory(path, ec);
}

// The weights of `dir`: model.safetensors, or the shards its index lists.
// `root`: where links may lead (the Hub repository's folder), or "" for none.
Params load_weights(const std::string& dir, const std::string& root) {
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (exists(single)) return load_safetensors(confined(single, root)).tensors;
  if (!exists(index_path)) {
    std::string others;
    for (const char* f :
         {"pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack"})
      if (exists(dir + "/" + f)) others += std::string(others.empty() ? "" : ", ") + f;
    fail(kOrigin, dir + ": no model.safetensors or model.safetensors.index.json" +
                      (others.empty() ? std::string()
                                      : " (it has " + others +
                                            ": kiln reads safetensors only; transformers converts "
                                            "with from_pretrained(...).save_pretrained(DIR))"));
  }
  json index;
  try {
    index = json::parse(read_file(confined(index_path, root), kOrigin));
  } catch (const json::exception& e) {
    fail(kOrigin, index_path + ": not valid JSON (" + e.what() + ")");
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail(kOrigin, index_path + ": expected an object with \"weight_map\": {tensor: file}");
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto& [tensor, file] : index["weight_map"].items()) {
    if (!file.is_string())
      fail(kOrigin, index_path + ": weight_map[\"" + tensor + "\"] is " + file.dump() +
                        ", expected a file name");
    check_model_file_name(file.get<std::string>(), index_path + ": weight_map[\"" + tensor + "\"]",
                          kOrigin);
    by_file[file.get<std::string>()].push_back(tensor);
  }
  if (by_file.empty()) fail(kOrigin, index_path + ": weight_map lists no tensor");
  Params out;
  for (auto& [file, tensors] : by_file) {
    const std::string path = dir + "/" + file;
    if (!exists(path)) fail(kOrigin, index_path + " lists " + file + ", which is not in " + dir);
    Params shard = load_safetensors(confined(path, root)).tensors;
    for (const std::string& t : tensors) {
      auto it = shard.find(t);
      if (it == shard.end())
        fail(kOrigin, index_path + " puts tensor '" + t + "' in " + file + ", which lacks it");
      out.emplace(t, it->second);
    }
  }
  return out;
}

std::string list(const std::vector<std::string>& names, size_t most = 4) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < most; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > most) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

// "org/name" or "name", each part of letters, digits, '-', '_' and '.', not
// starting with '.' (huggingface_hub's repository ids).
bool is_repo_id(const std::string& id) {
  size_t slash = id.find('/');
  auto part_ok = [](const std::string& p) {
    return !p.empty() && p.size() <= 96 && p[0] != '.' &&
           p.find_first_not_of(
               "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") ==
               std::string::npos &&
           p.find("..") == std::string::npos && p.find("--") == std::string::npos;
  };
  if (slash == std::string::npos) return part_ok(id);
  return part_ok(id.substr(0, slash)) && part_ok(id.substr(slash + 1));
}

// Where a model's files are: its folder, and where their links may lead
// (a Hub repository's folder; "" for a folder of the user's: anywhere).
struct Source {
  std::string dir, root;
};

// The snapshot of a Hub id "org/name[@revision]" in the local cache.
Source hub_snapshot(const std::string& src) {
  std::string id = src, revision = "main";
  if (size_t at = src.find('@'); at != std::string::npos) {
    id = src.substr(0, at);
    revision = src.substr(at + 1);
  }
  if (!is_repo_id(id) || revision.empty() || revision.find("..") != std::string::npos ||
      revision.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./") !=
          std::string::npos)
    fail(kOrigin, src + ": not a folder, and not a Hub id (org/name or org/name@revision)");
  std::string folder = "models--" + id;
  for (size_t p; (p = folder.find('/')) != std::string::npos;) folder.replace(p, 1, "--");
  const std::string cache = hub_cache_dir(), repo = cache + "/" + folder;
  // Not in the cache: downloaded into it, unless HF_HUB_OFFLINE says not to.
  auto download = [&](const std::string& why) -> Source {
    if (hub_offline())
      fail(kOrigin, src + ": not a folder, and not in the Hugging Face cache (" + why +
                        "), and HF_HUB_OFFLINE is set. Unset it to let kiln download the model, "
                        "set HF_HUB_CACHE or HF_HOME to the cache it is in, or pass the model's "
                        "folder");
    std::fprintf(stderr, "%s: not in the Hugging Face cache (%s): downloading it\n", src.c_str(),
                 why.c_str());
    return {hub_download(id, revision), repo};
  };
  if (!is_directory(repo)) return download(repo + " does not exist");
  std::string commit = revision;
  const std::string ref = repo + "/refs/" + revision;
  if (exists(ref)) {
    // A commit hash: the first bytes are enough (a link out of the repository is refused).
    std::ifstream in(confined(ref, repo));
    char buf[64] = {};
    in.read(buf, sizeof buf);
    commit.assign(buf, static_cast<size_t>(in.gcount()));
    commit.erase(commit.find_last_not_of(" \n\r\t") + 1);
  } else if (revision.size() != 40 ||
             revision.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return download("the cache has no revision '" + revision + "': " + ref + " does not exist");
  }
  if (commit.size() != 40 || commit.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail(kOrigin, ref + ": expected a commit hash (40 hex digits) and a newline");
  const std::string snapshot = repo + "/snapshots/" + commit;
  if (!is_directory(snapshot)) return download(snapshot + " does not exist");
  if (!exists(snapshot + "/config.json")) return download(snapshot + " has no config.json");
  if (!exists(snapshot + "/model.safetensors") &&
      !exists(snapshot + "/model.safetensors.index.json") &&
      !exists(snapshot + "/pytorch_model.bin"))
    return download(snapshot + " has no weights");
  return {snapshot, repo};
}

}  // namespace

void widen_to_f32(Params& params) {
  for (auto& [name, a] : params) {
    if (a.dtype() == DType::f32 || !is_floating(a.dtype())) continue;
    std::vector<float> v(a.size());
    a.copy_to_host(v.data(), DType::f32);
    a = Array::from_data(v.data(), a.shape(), DType::f32);
  }
}

std::string hub_cache_dir() {
  // As huggingface_hub's constants: a leading ~ is the home folder.
  auto home = [](std::string p) {
    return p.rfind("~/", 0) == 0 || p == "~" ? env("HOME") + p.substr(1) : p;
  };
  for (const char* var : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"})
    if (!env(var).empty()) return home(env(var));
  if (!env("HF_HOME").empty()) return home(env("HF_HOME")) + "/hub";
  std::string xdg = env("XDG_CACHE_HOME");
  if (xdg.empty()) xdg = env("HOME") + "/.cache";
  return home(xdg) + "/huggingface/hub";
}

namespace {

// A filesystem error that no check turned into a kiln::Error (a race with
// another process, an unreadable folder): one, naming the source.
template <typename F>
auto guarded(const std::string& src, F&& f) {
  try {
    return f();
  } catch (const fs::filesystem_error& e) {
    fail(kOrigin, src + ": " + e.what());
  }
}

Source resolve_unguarded(const std::string& src) {
  if (src.empty()) fail(kOrigin, "no model given (a folder or a Hub id)");
  if (is_directory(src)) return {src, ""};
  if (exists(src)) fail(kOrigin, src + ": a file; expected the model's folder or a Hub id");
  return hub_snapshot(src);
}

// The notes of weights stored in other floating-point types.
void note_dtypes(Pretrained& m, const std::set<std::string>& dtypes) {
  if (dtypes.empty()) return;
  std::string names;
  for (const auto& d : dtypes) names += (names.empty() ? "" : ", ") + d;
  m.notes.push_back("weights stored in " + names + ", converted to f32");
}

// preprocessor_config.json, or ViTImageProcessor's defaults at the model's size.
void read_processor(Pretrained& m) {
  std::error_code ec;
  m.has_processor = fs::exists(fs::path(m.dir) / "preprocessor_config.json", ec);
  if (m.has_processor)
    m.processor = load_image_processor(m.dir, &m.notes);
  else
    m.processor.size = m.model->image_size();  // the defaults, at the model's size
}

// A model of a family other than ViT (DeiT, ResNet, ConvNeXt, ...): its
// weights under the names the family has, the parameters and the state
// (BatchNorm's running statistics, which a saved BatchNorm must have).
Pretrained load_family(Pretrained m, const std::string& config_path, const std::string& root) {
  Params raw = load_weights(m.dir, root);
  std::map<std::string, Shape> params, state;
  for (auto& [name, shape] : m.model->parameter_shapes()) params.emplace(name, shape);
  for (auto& [name, shape] : m.model->state_shapes()) state.emplace(name, shape);
  const std::set<std::string> head = m.model->head_parameters();
  std::vector<std::string> unused;
  std::set<std::string> dtypes;
  for (auto& [stored, a] : raw) {
    const std::string name = m.model->weight_name(stored);
    if (name.empty()) continue;  // not a weight (a saved causal mask, a tied head)
    const bool is_param = params.count(name), is_state = state.count(name);
    if (!is_param && !is_state) {
      unused.push_back(stored);
      continue;
    }
    if (m.params.count(name) || m.state.count(name))
      fail(kOrigin,
           m.dir + ": tensors '" + stored + "' and another are both read as '" + name + "'");
    const Shape& want = is_param ? params.at(name) : state.at(name);
    if (is_param && !is_floating(a.dtype()))
      fail(kOrigin, m.dir + ": tensor '" + name + "' is " + name_of(a.dtype()) +
                        ", expected floating-point weights");
    if (a.shape() != want)
      fail(kOrigin, m.dir + ": tensor '" + name + "' has shape " + str(a.shape()) + ", but " +
                        config_path + " (" + m.model->architecture() + ") asks for " + str(want));
    if (is_floating(a.dtype()) && a.dtype() != DType::f32) dtypes.insert(name_of(a.dtype()));
    (is_param ? m.params : m.state).emplace(name, a);
  }
  widen_to_f32(m.params);
  widen_to_f32(m.state);
  std::vector<std::string> missing, missing_state;
  for (auto& [name, shape] : params)
    if (!m.params.count(name) && !head.count(name)) missing.push_back(name);
  for (auto& [name, shape] : state)
    if (!m.state.count(name)) missing_state.push_back(name);
  if (!missing.empty())
    fail(kOrigin, m.dir + ": the weights lack " + list(missing) + " (" + config_path +
                      " asks for them: weights of another model?)");
  if (!missing_state.empty())
    fail(kOrigin, m.dir + ": the weights lack " + list(missing_state) +
                      ": a BatchNorm saved without its running statistics cannot be evaluated");
  int heads = 0;
  for (const auto& name : head) heads += m.params.count(name);
  if (heads != 0 && heads != static_cast<int>(head.size()))
    fail(kOrigin, m.dir + ": the weights have part of the classifier (" + std::to_string(heads) +
                      " of its " + std::to_string(head.size()) + " tensors)");
  m.has_classifier = heads > 0 || m.model->num_labels() == 0;
  if (!m.has_classifier) m.notes.push_back("no classifier in the weights (a headless checkpoint)");
  note_dtypes(m, dtypes);
  if (!unused.empty()) m.notes.push_back("tensors it has no use for, left out: " + list(unused));
  if (m.model->causal_lm()) return m;  // no images, no processor
  read_processor(m);
  return m;
}

Pretrained load_unguarded(const std::string& src) {
  Pretrained m;
  const Source source = resolve_unguarded(src);
  m.dir = source.dir;
  const std::string& root = source.root;
  const std::string config_path = m.dir + "/config.json";
  if (!exists(config_path))
    fail(kOrigin, m.dir + ": no config.json (not a folder written by save_pretrained?)");
  const std::string text = read_file(confined(config_path, root), "config");
  // A ViT (model_type "vit", or none: kiln's first checkpoints) is read with
  // its conversions (headless ViTModel names, transformers 5's); every other
  // family by the registry.
  const bool vit = text.find("\"model_type\"") == std::string::npos ||
                   nn::model_from_config(text, config_path)->model_type() == "vit";
  if (!vit) {
    m.model = nn::model_from_config(text, config_path);
    return load_family(std::move(m), config_path, root);
  }
  m.model = nn::model_from_config(text, config_path, "vit");
  Params raw = load_weights(m.dir, root);

  // What ViTForImageClassification has, classifier included when the config has labels.
  std::map<std::string, Shape> expected;
  for (auto& [name, shape] : m.model->parameter_shapes()) expected.emplace(name, shape);
  std::vector<std::string> pooler, unused, converted_from;
  std::set<std::string> dtypes;
  for (auto& [name, a] : raw) {
    const std::string ours = classifier_name(name);
    if (starts_with(ours, "vit.pooler.")) {
      pooler.push_back(name);
      continue;
    }
    auto it = expected.find(ours);
    if (it == expected.end()) {
      unused.push_back(name);
      continue;
    }
    if (!is_floating(a.dtype()))
      fail(kOrigin, m.dir + ": tensor '" + name + "' is " + name_of(a.dtype()) +
                        ", expected floating-point weights");
    if (a.shape() != it->second)
      fail(kOrigin, m.dir + ": tensor '" + name + "' has shape " + str(a.shape()) +
                        ", but config.json (" + m.model->config_summary() + ") asks for " +
                        str(it->second));
    if (a.dtype() != DType::f32) dtypes.insert(name_of(a.dtype()));
    if (!m.params.emplace(ours, a).second)
      fail(kOrigin, m.dir + ": two tensors are '" + ours + "' (one of them '" + name + "')");
  }
  widen_to_f32(m.params);
  std::vector<std::string> missing;
  for (auto& [name, shape] : expected)
    if (!m.params.count(name) && !starts_with(name, "classifier.")) missing.push_back(name);
  if (!missing.empty())
    fail(kOrigin, m.dir + ": the weights lack " + list(missing) + " (config.json asks for " +
                      m.model->config_summary() + ")");
  const bool weight = m.params.count("classifier.weight"), bias = m.params.count("classifier.bias");
  if (weight != bias)
    fail(kOrigin, m.dir + ": the weights have classifier." + (weight ? "weight" : "bias") +
                      " without classifier." + (weight ? "bias" : "weight"));
  m.has_classifier = weight || m.model->num_labels() == 0;
  if (!m.has_classifier) m.notes.push_back("no classifier in the weights (a ViTModel checkpoint)");
  note_dtypes(m, dtypes);
  if (!pooler.empty())
    m.notes.push_back("the pooler (" + list(pooler, 2) +
                      ") is left out: ViTForImageClassification does not use it");
  if (!unused.empty()) m.notes.push_back("tensors it has no use for, left out: " + list(unused));
  if (m.model->causal_lm()) return m;  // no images, no processor
  read_processor(m);
  return m;
}

}  // namespace

std::string resolve_model_source(const std::string& src) {
  return guarded(src, [&] { return resolve_unguarded(src).dir; });
}

Pretrained load_pretrained(const std::string& src) {
  return guarded(src, [&] { return load_unguarded(src); });
}

// The family's own head, drawn by its init_head.
void adapt_classifier(Pretrained& m, const std::vector<std::string>& labels,
                      const random::Key& key) {
  const std::vector<std::string> had = m.model->label_names();
  const bool same = labels.empty() || labels == had;
  if (m.has_classifier && same) return;
  bool unnamed = true;
  for (size_t i = 0; i < had.size(); ++i) unnamed &= had[i] == "LABEL_" + std::to_string(i);
  if (m.has_classifier && unnamed && labels.size() == had.size()) {
    m.model = m.model->with_labels(labels);
    m.notes.push_back("its classifier's labels are unnamed (" + list(had) +
                      "): kept, as the data's " + std::to_string(labels.size()) + " labels (" +
                      list(labels) + ")");
    return;
  }
  if (!labels.empty()) m.model = m.model->with_labels(labels);
  const std::set<std::string> head = m.model->head_parameters();
  for (const auto& name : head) m.params.erase(name);
  if (m.model->num_labels() > 0) {
    const Params fresh = m.model->init_head(key);
    for (const auto& name : head) m.params[name] = fresh.at(name);
    eval(m.params);
  }
  const std::vector<std::string> names = m.model->label_names();
  m.notes.push_back(std::string(m.has_classifier
                                    ? "its classifier's " + std::to_string(had.size()) +
                                          " labels (" + list(had) + ") are not the data's"
                                    : "it has no classifier") +
                    ": a new one for " + std::to_string(names.size()) + " labels (" + list(names) +
                    "), drawn as transformers does with ignore_mismatched_sizes");
  m.has_classifier = true;
}

namespace {

// The processor of `m` making pixel values of `image_size` (a centre crop
// keeps its ratio to the resize).
void resize_processor(Pretrained& m, nn::Size2d image_size) {
  data::ImageProcessor& p = m.processor;
  auto scaled = [](int64_t v, int64_t to, int64_t from) {
    return std::max<int64_t>(1, std::llround(static_cast<double>(v) * static_cast<double>(to) /
                                             static_cast<double>(from)));
  };
  if (p.do_center_crop) {  // the resize keeps its ratio to the crop
    if (p.shortest_edge > 0) {
      p.shortest_edge = scaled(p.shortest_edge, image_size.height, p.crop_size.height);
      if (p.longest_edge > 0)
        p.longest_edge = std::max(p.shortest_edge,
                                  scaled(p.longest_edge, image_size.height, p.crop_size.height));
    } else {
      p.size = {scaled(p.size.height, image_size.height, p.crop_size.height),
                scaled(p.size.width, image_size.width, p.crop_size.width)};
    }
    p.crop_size = image_size;
  } else {
    p.shortest_edge = p.longest_edge = 0;
    p.size = image_size;
  }
}

}  // namespace

void set_image_size(Pretrained& m, nn::Size2d image_size) {
  if (!m.model->fixed_image_size()) {
    // A convolutional model takes any size: only its images change.
    if (image_size.height <= 0 || image_size.width <= 0)
      fail("image size " + nn::to_string(image_size), "expected a positive height and width");
    resize_processor(m, image_size);
    m.notes.push_back("image size " + nn::to_string(image_size) + ": images processed to it (" +
                      m.model->architecture() + " takes any size)");
    return;
  }
  // A ViT's or DeiT's: its parameters made for the new size by the family
  // (the position embeddings resampled to the new grid), then its images.
  const nn::Size2d was = m.model->image_size();
  m.model = m.model->resized(m.params, image_size, m.notes);
  if (image_size == was) return;
  resize_processor(m, image_size);
  const data::ImageProcessor& p = m.processor;
  if (m.model->num_channels() == 3)  // grey models take no ViTImageProcessor
    m.notes.back() += std::string("; images processed to ") + nn::to_string(image_size) +
                      " (preprocessor_config.json's " + (p.do_center_crop ? "crop_size)" : "size)");
}

}  // namespace kiln::io
