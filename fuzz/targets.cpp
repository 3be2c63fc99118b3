// kiln fuzz targets (targets.h): inputs that only a path can reach are
// written to a per-process scratch directory first.
#include "targets.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <stdexcept>

#include "command_line.h"
#include "kiln/data.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/tokenizer.h"
#include "kiln/train.h"
#include "plot.h"

namespace kiln::fuzz {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// An output that a target got and should not have: a bug, never an Error.
void expect(bool ok, const std::string& what) {
  if (!ok) throw std::logic_error("fuzz target: " + what);
}

// A directory of this process's own, removed at exit: in $TMPDIR when set
// (scripts/fuzz.sh sets it), else in memory (/dev/shm) where there is one.
class Scratch {
 public:
  Scratch() {
    const char* tmpdir = std::getenv("TMPDIR");
    std::error_code ec;
    std::string base = tmpdir && *tmpdir                  ? tmpdir
                       : fs::is_directory("/dev/shm", ec) ? "/dev/shm"
                                                          : fs::temp_directory_path().string();
    std::string pattern = base + "/kiln-fuzz-XXXXXX";
    if (!::mkdtemp(pattern.data()))
      throw std::runtime_error("fuzz target: cannot create a directory like " + pattern);
    dir_ = pattern;
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  fs::path dir_;
};

const Scratch& scratch() {
  static const Scratch s;
  return s;
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("fuzz target: cannot write " + path);
}

std::string read_whole(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

void feed_safetensors(std::string_view bytes) {
  io::SafetensorsFile f = io::parse_safetensors(bytes, "input.safetensors");
  for (auto& [name, a] : f.tensors) {
    expect(a.nbytes() == static_cast<size_t>(a.size()) * size_of(a.dtype()),
           "tensor '" + name + "' holds " + std::to_string(a.nbytes()) + " bytes for " +
               std::to_string(a.size()) + " elements");
    // Reading every byte lets ASan see a buffer smaller than its shape.
    const auto* p = static_cast<const unsigned char*>(a.raw());
    unsigned sum = 0;
    for (size_t i = 0; i < a.nbytes(); ++i) sum += p[i];
    (void)sum;
  }
}

void feed_config(std::string_view bytes) {
  if (bytes.find("\"model_type\"") != std::string_view::npos) {
    // The registry (kiln train --config, kiln grad): the model, its FLOPs,
    // its config written back, a head swap.
    const std::shared_ptr<const nn::Model> m = nn::model_from_config(bytes, "config.json");
    int64_t params = 0;
    for (auto& [name, shape] : m->parameter_shapes()) params += numel(shape);
    expect(params > 0, "a model of " + std::to_string(params) + " parameters");
    (void)m->train_flops_per_example(224);
    (void)m->config_json();
    (void)m->with_labels({"a", "b"})->head_parameters();
  }
  if (bytes.find("\"convnext\"") != std::string_view::npos) {
    const nn::ConvNextConfig cfg = nn::ConvNextConfig::from_json(bytes, "config.json");
    int64_t params = 0;
    for (auto& [name, shape] : nn::ConvNextForImageClassification(cfg).parameter_shapes())
      params += numel(shape);
    expect(params > 0, "a model of " + std::to_string(params) + " parameters");
    return;
  }
  if (bytes.find("\"resnet\"") != std::string_view::npos) {
    const nn::ResNetConfig cfg = nn::ResNetConfig::from_json(bytes, "config.json");
    int64_t params = 0;
    for (auto& [name, shape] : nn::ResNetForImageClassification(cfg).parameter_shapes())
      params += numel(shape);
    expect(params > 0, "a model of " + std::to_string(params) + " parameters");
    return;
  }
  const bool deit = bytes.find("\"deit\"") != std::string_view::npos;
  nn::ViTConfig cfg = deit ? nn::ViTConfig::from_json(bytes, "config.json", "deit")
                           : nn::ViTConfig::from_json(bytes, "config.json");
  // What kiln computes from a config before it allocates anything.
  int64_t params = 0;
  for (auto& [name, shape] :
       nn::ViTForImageClassification(cfg, deit ? nn::ViTVariant::DeiT : nn::ViTVariant::ViT)
           .parameter_shapes())
    params += numel(shape);
  expect(params > 0, "a model of " + std::to_string(params) + " parameters");
  (void)cfg.train_flops_per_image();
}

void feed_idx(std::string_view bytes) {
  std::string path = scratch().path("input-idx-ubyte");
  write_file(path, bytes);
  data::IdxArray a = data::read_idx(path);
  expect(static_cast<size_t>(numel(a.shape)) == a.data.size(),
         "shape " + str(a.shape) + " with " + std::to_string(a.data.size()) + " bytes");
}

void feed_image(std::string_view bytes) {
  // An image folder of one class and one file, read as `kiln train
  // --data imagefolder:PATH --augment` reads it: header, decode, resize, crop, flip.
  static const std::string root = [] {
    std::string r = scratch().path("images");
    fs::create_directories(r + "/class");
    return r;
  }();
  // The decoder goes by the bytes, the folder by the name: always .png.
  write_file(root + "/class/image.png", bytes);
  data::ImageFolderOptions opt{.root = root, .image_size = 8, .channels = 3, .augment = true};
  data::ImageFolder folder(opt);
  std::vector<float> pixels(3 * 8 * 8);
  int32_t label = -1;
  folder.get(0, 0, pixels.data(), &label);
  expect(label == 0, "label " + std::to_string(label) + " for the only class");
  std::vector<uint8_t> b(bytes.begin(), bytes.end());
  data::Image grey = data::decode_image(b, 1, "image.png");
  expect(grey.pixels.size() == static_cast<size_t>(grey.width * grey.height),
         std::to_string(grey.pixels.size()) + " grey pixels for " + std::to_string(grey.width) +
             "x" + std::to_string(grey.height));
  // And as `kiln predict` reads it: RGB, then a checkpoint's processing.
  data::Image rgb = data::decode_image(b, 3, "image.png");
  expect(rgb.width == grey.width && rgb.height == grey.height, "RGB and grey sizes differ");
  data::ImageProcessor proc{.size = {5, 7},
                            .resample = data::Resample::bicubic,
                            .do_center_crop = true,
                            .crop_size = {6, 4}};
  std::vector<float> values(3 * 6 * 4);
  proc.pixel_values(rgb, values.data());
}

void feed_preprocessor(std::string_view bytes) {
  data::ImageProcessor p = io::parse_image_processor(bytes, "preprocessor_config.json");
  // What kiln writes reads back the same.
  data::ImageProcessor q = io::parse_image_processor(io::image_processor_json(p), "saved");
  expect(io::image_processor_json(q) == io::image_processor_json(p),
         "a saved processor reads back differently");
  // Applied to a small image, where its output stays small.
  data::Image img{13, 7, 3, std::vector<uint8_t>(13 * 7 * 3)};
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>(i * 37);
  nn::Size2d s = p.output_size(img.width, img.height);
  expect(s.height > 0 && s.width > 0, "an empty output size");
  nn::Size2d r = p.do_resize ? p.size : nn::Size2d{img.height, img.width};
  if (s.height * s.width > (1 << 20) || r.height * r.width > (1 << 20) || p.shortest_edge > 1024)
    return;
  std::vector<float> values(static_cast<size_t>(3 * s.height * s.width));
  p.pixel_values(img, values.data());
}

void feed_tokenizer(std::string_view bytes) {
  const size_t sep = bytes.find(kFileSeparator);
  const std::string_view file = bytes.substr(0, sep);
  // At most 512 bytes of text: BPE's cost grows with the square of a word.
  const std::string_view text =
      sep == std::string_view::npos
          ? std::string_view("The quick brown fox's 42 jumps  over\n the lazy dog.")
          : bytes.substr(sep + kFileSeparator.size(), 512);
  const data::Tokenizer tok = data::Tokenizer::from_json(file, "tokenizer.json");
  const std::vector<int32_t> ids = tok.encode(text);
  for (int32_t id : ids) expect(id >= 0 && id < tok.vocab_size(), "an id outside the vocabulary");
  (void)tok.decode(ids);
}

const std::vector<std::string>& tiny_checkpoint_files() {
  static const std::vector<std::string> files = [] {
    nn::ViTConfig cfg{.hidden_size = 4,
                      .num_hidden_layers = 1,
                      .num_attention_heads = 2,
                      .intermediate_size = 8,
                      .image_size = 4,
                      .patch_size = 2,
                      .num_channels = 1,
                      .num_labels = 3};
    io::Checkpoint ck{
        .model = nn::vit_model(cfg), .optimizer = "adamw", .seed = 7, .data_position = 5};
    ck.params = nn::ViTForImageClassification(cfg).init(random::Key(7));
    ck.state = optim::AdamW(optim::AdamWOptions{}).init(ck.params);
    ck.state.step = 5;
    std::string staged = io::stage_checkpoint(scratch().path("tiny-checkpoint"), ck);
    std::vector<std::string> out;
    for (const char* name : kCheckpointFiles) out.push_back(read_whole(staged + "/" + name));
    fs::remove_all(staged);
    return out;
  }();
  return files;
}

// Splits an input at kFileSeparator into the files `names` of a fresh folder
// `dir`: a file the input does not reach comes from `defaults`, an empty part
// leaves it out.
template <size_t N>
void write_folder(std::string_view bytes, const std::string& dir, const char* const (&names)[N],
                  const std::vector<std::string>& defaults) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    size_t end = bytes.find(kFileSeparator, start);
    parts.push_back(bytes.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + kFileSeparator.size();
  }
  fs::remove_all(dir);
  fs::create_directory(dir);
  for (size_t i = 0; i < N; ++i) {
    std::string_view part = i < parts.size() ? parts[i] : std::string_view(defaults[i]);
    if (!part.empty()) write_file(dir + "/" + names[i], part);
  }
}

void feed_checkpoint(std::string_view bytes) {
  const std::string dir = scratch().path("checkpoint");
  write_folder(bytes, dir, kCheckpointFiles, tiny_checkpoint_files());
  io::load_checkpoint(dir);
}

const std::vector<std::string>& tiny_pretrained_files() {
  static const std::vector<std::string> files = [] {
    const std::vector<std::string>& ck = tiny_checkpoint_files();
    Params model = io::parse_safetensors(ck[3], "model.safetensors").tensors, first, second;
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    for (auto& [name, a] : model) {
      const bool head = name.rfind("classifier.", 0) == 0;
      (head ? second : first).emplace(name, a);
      index["weight_map"][name] = kPretrainedFiles[head ? 3 : 2];
    }
    std::vector<std::string> out = {index.dump(2), ck[2]};
    for (const Params* shard : {&first, &second}) {
      std::string path = scratch().path("tiny-shard.safetensors");
      io::save_safetensors(path, *shard);
      out.push_back(read_whole(path));
      fs::remove(path);
    }
    return out;
  }();
  return files;
}

void feed_pretrained(std::string_view bytes) {
  const std::string dir = scratch().path("pretrained");
  write_folder(bytes, dir, kPretrainedFiles, tiny_pretrained_files());
  io::Pretrained m = io::load_pretrained(dir);
  // What loaded is a whole model of its config, in f32 (the classifier aside).
  for (auto& [name, shape] : m.model->parameter_shapes()) {
    auto it = m.params.find(name);
    if (it == m.params.end()) {
      expect(name.rfind("classifier.", 0) == 0 && !m.has_classifier,
             "a loaded model lacks " + name);
      continue;
    }
    expect(it->second.shape() == shape && it->second.dtype() == DType::f32,
           "loaded '" + name + "' is not f32 of the config's shape");
  }
}

void feed_plot_log(std::string_view bytes) {
  std::string log = scratch().path("log.jsonl");
  write_file(log, bytes);
  tools::plot_log(log, scratch().path("plot.svg"));
}

void feed_command_line(std::string_view bytes) {
  std::vector<std::string> args{"kiln"};
  // Lines (or NUL-separated pieces: an argv string ends at a NUL) are arguments.
  std::string arg;
  for (char c : bytes) {
    if (c == '\n' || c == '\0') {
      args.push_back(arg);
      arg.clear();
    } else {
      arg += c;
    }
  }
  if (!arg.empty()) args.push_back(arg);
  std::ostream discard(nullptr);
  cli::CommandLine cl = cli::parse_command_line(args, discard, discard);
  // `kiln train` checks its flags before it loads data or trains: so does this.
  if (cl.command == cli::Command::train) train::validate(cli::train_config(cl.train));
}

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {{"safetensors", feed_safetensors},
                                          {"config", feed_config},
                                          {"idx", feed_idx},
                                          {"image", feed_image},
                                          {"checkpoint", feed_checkpoint},
                                          {"plot_log", feed_plot_log},
                                          {"command_line", feed_command_line},
                                          {"pretrained", feed_pretrained},
                                          {"preprocessor", feed_preprocessor},
                                          {"tokenizer", feed_tokenizer}};
  return all;
}

int run_harness(void (*feed)(std::string_view), const uint8_t* data, size_t size) {
  try {
    feed(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const Error&) {
    // Bad input, said so: what kiln should do.
  }
  return 0;
}

}  // namespace kiln::fuzz
