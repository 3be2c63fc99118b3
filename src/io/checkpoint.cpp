// kiln io: training checkpoints (transformers-loadable directory + state).
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "kiln/io.h"

namespace kiln::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
constexpr const char* kFormat = "kiln-checkpoint-1";

void sync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

fs::path parent_of(const std::string& dir) {
  fs::path p = fs::absolute(fs::path(dir)).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "dir/" -> "dir"
  return p.parent_path();
}

std::string trimmed(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

// An empty DIR.tmp (its parents made, an old one removed) to stage DIR in.
std::string staging_dir(const std::string& dir, const char* origin) {
  std::string tmp = dir + ".tmp";
  std::error_code ec;
  fs::create_directories(parent_of(dir), ec);
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec))
    fail(origin, tmp + ": cannot create the directory (" + ec.message() + ")");
  return tmp;
}

// What transformers' save_pretrained writes, into the existing folder `dir`:
// config.json, model.safetensors (the parameters in f32, the state as it is:
// num_batches_tracked is i64) and, when given, preprocessor_config.json.
void write_model_files(const std::string& dir, const nn::Model& model, const Params& params,
                       const Params& state, const std::optional<data::ImageProcessor>& processor) {
  write_file_atomic(dir + "/config.json", model.config_json());
  if (processor) save_image_processor(dir + "/preprocessor_config.json", *processor);
  Params weights;
  for (auto& [name, p] : params) weights.emplace(name, astype(p, DType::f32));
  for (auto& [name, v] : state)
    weights.emplace(name, is_floating(v.dtype()) ? astype(v, DType::f32) : v);
  save_safetensors(dir + "/model.safetensors", weights, {{"format", "pt"}});
}

}  // namespace

std::string stage_checkpoint(const std::string& dir_in, const Checkpoint& c) {
  std::string dir = trimmed(dir_in);
  std::string tmp = staging_dir(dir, "checkpoint");
  write_model_files(tmp, *c.model, c.params, c.model_state, c.processor);
  for (const auto& [name, contents] : c.files) {
    if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
      fail("checkpoint", "a file named '" + name + "': expected a plain file name");
    write_file_atomic(tmp + "/" + name, contents);
  }
  if (!c.ema.empty()) {
    std::error_code mk;
    if (!fs::create_directory(tmp + "/ema", mk))
      fail("checkpoint", tmp + "/ema: cannot create the directory (" + mk.message() + ")");
    write_model_files(tmp + "/ema", *c.model, c.ema, c.model_state, c.processor);
  }
  save_safetensors(tmp + "/training_state.safetensors", c.state.buffers,
                   {{"format", kFormat}, {"optimizer", c.optimizer}});
  json t{{"format", kFormat},
         {"step", c.state.step},
         {"seed", c.seed},
         {"data_position", c.data_position},
         {"optimizer", c.optimizer}};
  if (c.best_accuracy >= 0) t["best_accuracy"] = c.best_accuracy;
  write_file_atomic(tmp + "/trainer.json", t.dump(2) + "\n");
  sync_dir(tmp);
  return tmp;
}

void commit_checkpoint(const std::string& staged, const std::string& dir_in) {
  std::string dir = trimmed(dir_in);
  std::string old = dir + ".old";
  std::error_code ec;
  fs::remove_all(old, ec);
  if (fs::exists(dir)) {
    fs::rename(dir, old, ec);
    if (ec)
      fail("checkpoint",
           dir + ": cannot move the previous checkpoint aside (" + ec.message() + ")");
  }
  fs::rename(staged, dir, ec);
  if (ec)
    fail("checkpoint", dir + ": cannot rename " + staged + " into place (" + ec.message() + ")");
  sync_dir(parent_of(dir));
  fs::remove_all(old, ec);
}

void save_checkpoint(const std::string& dir, const Checkpoint& c) {
  commit_checkpoint(stage_checkpoint(dir, c), dir);
}

void save_pretrained(const std::string& dir_in, const nn::Model& model, const Params& params,
                     const Params& state, const std::optional<data::ImageProcessor>& processor) {
  model.check(params, state, "save_pretrained");
  const std::string dir = trimmed(dir_in);
  const std::string tmp = staging_dir(dir, "save_pretrained");
  write_model_files(tmp, model, params, state, processor);
  sync_dir(tmp);
  commit_checkpoint(tmp, dir);
}

Checkpoint load_checkpoint(const std::string& dir_in) {
  std::string dir = trimmed(dir_in);
  // A save killed between its two renames leaves the previous checkpoint in DIR.old.
  if (!fs::exists(dir + "/trainer.json") && fs::exists(dir + ".old/trainer.json")) dir += ".old";
  if (!fs::is_directory(dir)) fail("checkpoint", dir_in + ": no such checkpoint directory");
  for (const char* f : {"config.json", "model.safetensors", "trainer.json"})
    if (!fs::exists(dir + "/" + f))
      fail("checkpoint",
           dir + ": missing " + f + " (not a checkpoint written by kiln train --save?)");
  Checkpoint c;
  c.model = load_model_config(dir + "/config.json");
  const std::string weights = dir + "/model.safetensors";
  std::tie(c.params, c.model_state) = c.model->split(load_safetensors(weights).tensors, weights);
  widen_to_f32(c.params);  // kiln writes f32; a hand-made checkpoint may not
  if (fs::exists(dir + "/preprocessor_config.json")) c.processor = load_image_processor(dir);
  for (const char* f : {"tokenizer.json", "vocab.json", "merges.txt"})
    if (fs::exists(dir + "/" + f)) c.files[f] = read_file(dir + "/" + f, "checkpoint");
  c.model->check(c.params, c.model_state, weights);
  json t;
  std::string path = dir + "/trainer.json";
  try {
    t = json::parse(read_file(path, "checkpoint"));
  } catch (const json::exception& e) {
    fail("checkpoint", path + ": not valid JSON (" + e.what() + ")");
  }
  if (!t.is_object()) fail("checkpoint", path + ": expected a JSON object, got " + t.type_name());
  auto field = [&](const char* name) -> const json& {
    if (!t.contains(name)) fail("checkpoint", path + ": missing field '" + name + "'");
    return t.at(name);
  };
  auto text = [&](const char* name) {
    const json& v = field(name);
    if (!v.is_string())
      fail("checkpoint", path + ": field '" + name + "' is " + v.dump() + ", expected a string");
    return v.get<std::string>();
  };
  // A count: a JSON float (1e300) or a negative number would not convert.
  auto count = [&](const char* name, auto& dst) {
    const json& v = field(name);
    using T = std::remove_reference_t<decltype(dst)>;
    if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t{std::numeric_limits<T>::max()})
      fail("checkpoint", path + ": field '" + name + "' is " + v.dump() +
                             ", expected an integer in [0, " +
                             std::to_string(std::numeric_limits<T>::max()) + "]");
    dst = v.get<T>();
  };
  std::string format = text("format");
  if (format != kFormat)
    fail("checkpoint", path + ": format '" + format + "', expected '" + kFormat + "'");
  count("step", c.state.step);
  count("seed", c.seed);
  count("data_position", c.data_position);
  c.optimizer = text("optimizer");
  if (t.contains("best_accuracy")) {
    const json& v = t["best_accuracy"];
    if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= 1))
      fail("checkpoint",
           path + ": field 'best_accuracy' is " + v.dump() + ", expected a number in [0, 1]");
    c.best_accuracy = v.get<double>();
  }
  if (fs::exists(dir + "/training_state.safetensors"))
    c.state.buffers = load_safetensors(dir + "/training_state.safetensors").tensors;
  return c;
}

}  // namespace kiln::io
