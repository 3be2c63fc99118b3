// Pretrained models as transformers 4.x and 5.x save them (fixtures written by
// tools/golden/make_pretrained_golden.py): classifier and headless, sharded,
// F16 and BF16 weights; the Hub cache's layout; a new classifier for new
// labels; and an error naming the file, tensor or path for each bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "../test_util.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(KILN_FIXTURES_DIR) + "/pretrained/";

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// max |a - b| / max |b|, in double.
// A loaded ViT's config.
const nn::ViTConfig& vit_config(const io::Pretrained& m) {
  return nn::as_vit(*m.model)->config();
}

// What the loaded model computes on the fixture's pixel_values: the logits,
// or without a classifier the final [CLS] features.
Array computed(io::Pretrained m, const Params& expected) {
  nn::ViTConfig c = vit_config(m);
  if (!m.has_classifier) {
    c.num_labels = 0;
    c.id2label.clear();
  }
  return nn::ViTForImageClassification(c).apply(m.params, expected.at("pixel_values"));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// A scratch folder, removed afterwards.
class Scratch {
 public:
  Scratch()
      : dir_(fs::temp_directory_path() /
             ("kiln-pretrained-test-" + std::to_string(::getpid()) + "-" + std::to_string(n_++))) {
    fs::create_directories(dir_);
  }
  ~Scratch() { fs::remove_all(dir_); }
  std::string path(const std::string& name = "") const { return (dir_ / name).string(); }
  // A copy of a fixture folder.
  std::string copy(const std::string& fixture) const {
    fs::copy(kDir + fixture, path(fixture), fs::copy_options::recursive);
    return path(fixture);
  }

 private:
  static inline int n_ = 0;
  fs::path dir_;
};

// Restores the variables the Hub cache reads, whatever a test did to them.
class EnvGuard {
 public:
  EnvGuard() {
    for (const char* v : kVars)
      if (const char* x = std::getenv(v)) saved_[v] = x;
  }
  ~EnvGuard() {
    for (const char* v : kVars) {
      auto it = saved_.find(v);
      if (it == saved_.end())
        unsetenv(v);
      else
        setenv(v, it->second.c_str(), 1);
    }
  }

 private:
  static constexpr const char* kVars[] = {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                                          "HF_HOME",      "XDG_CACHE_HOME",
                                          "HOME",         "HF_HUB_OFFLINE"};
  std::map<std::string, std::string> saved_;
};

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  size_t p = text.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  return p == std::string::npos ? text : text.replace(p, from.size(), to);
}

TEST(Pretrained, EveryTransformersSaveComputesWhatTransformersComputes) {
  for (const char* name : {"v4-classifier", "v4-f16", "v5-classifier", "v5-sharded", "v5-bf16"}) {
    SCOPED_TRACE(name);
    io::Pretrained m = io::load_pretrained(kDir + name);
    EXPECT_TRUE(m.has_classifier);
    EXPECT_EQ(vit_config(m).id2label, (std::vector<std::string>{"cat", "dog", "tench"}));
    for (auto& [n, p] : m.params) EXPECT_EQ(p.dtype(), DType::f32) << n;
    Params expected = io::load_safetensors(kDir + name + "/expected.safetensors").tensors;
    EXPECT_LT(test_util::max_relative_error(computed(m, expected), expected.at("logits")), 1e-5);
  }
  EXPECT_HAS(io::load_pretrained(kDir + "v4-f16").notes.at(0),
             "weights stored in f16, converted to f32");
  EXPECT_HAS(io::load_pretrained(kDir + "v5-bf16").notes.at(0),
             "weights stored in bf16, converted to f32");
  EXPECT_TRUE(io::load_pretrained(kDir + "v5-classifier").notes.empty());
}

TEST(Pretrained, HeadlessCheckpointsLeaveThePoolerOut) {
  for (const char* name : {"v4-headless", "v5-headless"}) {
    SCOPED_TRACE(name);
    io::Pretrained m = io::load_pretrained(kDir + name);
    EXPECT_FALSE(m.has_classifier);
    EXPECT_FALSE(m.params.count("classifier.weight"));
    EXPECT_TRUE(m.params.count("vit.embeddings.cls_token"));  // "embeddings.cls_token" on disk
    std::string notes;
    for (auto& n : m.notes) notes += n + "\n";
    EXPECT_HAS(notes, "no classifier in the weights (a ViTModel checkpoint)");
    EXPECT_HAS(notes, "the pooler (pooler.dense.bias, pooler.dense.weight) is left out");
    Params expected = io::load_safetensors(kDir + name + "/expected.safetensors").tensors;
    EXPECT_LT(test_util::max_relative_error(computed(m, expected), expected.at("features")), 1e-5);
  }
}

// A state_dict that transformers 5 holds in memory (vit.layers.N.attention.q_proj ...),
// saved by safetensors itself.
TEST(Pretrained, Transformers5InMemoryNamesAreRead) {
  io::Pretrained m = io::load_pretrained(kDir + "v5-state-dict");
  EXPECT_TRUE(m.has_classifier);
  EXPECT_TRUE(m.notes.empty());
  Params expected = io::load_safetensors(kDir + "v5-state-dict/expected.safetensors").tensors;
  EXPECT_LT(test_util::max_relative_error(computed(m, expected), expected.at("logits")), 1e-5);
}

TEST(Pretrained, NewLabelsGetANewClassifierAsTransformersDraws) {
  const random::Key key(7);
  io::Pretrained m = io::load_pretrained(kDir + "v5-classifier");
  const Array kept = m.params.at("classifier.weight");
  io::adapt_classifier(m, {}, key);  // the checkpoint's labels
  io::adapt_classifier(m, {"cat", "dog", "tench"}, key);
  EXPECT_TRUE(m.notes.empty());
  EXPECT_EQ(m.params.at("classifier.weight").to_vector<float>(), kept.to_vector<float>());

  io::adapt_classifier(m, {"0", "1", "2", "3", "4"}, key);
  EXPECT_EQ(vit_config(m).num_labels, 5);
  EXPECT_EQ(vit_config(m).label_name(4), "4");
  EXPECT_EQ(m.params.at("classifier.weight").shape(), (Shape{5, 16}));
  EXPECT_EQ(m.params.at("classifier.bias").to_vector<float>(), std::vector<float>(5, 0.0f));
  // torch's trunc_normal_(std=initializer_range): bounds of ±2 absolute, so a
  // plain normal of std 0.02 here.
  double sum2 = 0;
  for (float v : m.params.at("classifier.weight").to_vector<float>()) sum2 += v * v;
  EXPECT_NEAR(std::sqrt(sum2 / 80), 0.02, 0.006);
  ASSERT_EQ(m.notes.size(), 1u);
  EXPECT_HAS(m.notes[0],
             "its classifier's 3 labels (cat, dog, tench) are not the data's: a new "
             "one for 5 labels (0, 1, 2, 3, ... (5 in all))");
  nn::ViTForImageClassification(vit_config(m)).check(m.params, "adapted");

  // Same count, other names: a new classifier too.
  io::Pretrained n = io::load_pretrained(kDir + "v4-classifier");
  io::adapt_classifier(n, {"cat", "dog", "trout"}, key);
  EXPECT_EQ(n.notes.size(), 1u);
  EXPECT_NE(n.params.at("classifier.weight").to_vector<float>(),
            io::load_pretrained(kDir + "v4-classifier")
                .params.at("classifier.weight")
                .to_vector<float>());

  // transformers' made-up names (LABEL_i) name nothing: the classifier is kept, renamed.
  io::Pretrained u = io::load_pretrained(kDir + "v5-classifier");
  {
    nn::ViTConfig c = vit_config(u);
    c.id2label.clear();
    u.model = nn::vit_model(c);
  }
  io::adapt_classifier(u, {"x", "y", "z"}, key);
  EXPECT_EQ(u.params.at("classifier.weight").to_vector<float>(), kept.to_vector<float>());
  EXPECT_EQ(vit_config(u).id2label, (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_HAS(u.notes.at(0),
             "its classifier's labels are unnamed (LABEL_0, LABEL_1, LABEL_2): kept, "
             "as the data's 3 labels (x, y, z)");

  // A headless checkpoint gets one for the data's labels, or for its config's.
  io::Pretrained h = io::load_pretrained(kDir + "v4-headless");
  io::adapt_classifier(h, {"a", "b"}, key);
  EXPECT_TRUE(h.has_classifier);
  EXPECT_HAS(h.notes.back(), "it has no classifier: a new one for 2 labels (a, b)");
  nn::ViTForImageClassification(vit_config(h)).check(h.params, "adapted");
  io::Pretrained g = io::load_pretrained(kDir + "v5-headless");
  io::adapt_classifier(g, {}, key);
  EXPECT_EQ(vit_config(g).num_labels, 3);  // its config's id2label
}

// --image-size: the position embeddings and the logits at other resolutions
// against transformers' interpolate_pos_encoding (torch's bicubic), with
// torch 1.13 (4.x) and torch 2.11 (5.x).
TEST(Pretrained, ANewImageSizeResamplesThePositionEmbeddingsAsTransformersDoes) {
  const std::pair<int64_t, int64_t> sizes[] = {{24, 24}, {12, 20}, {8, 8}, {28, 16}};
  for (const char* name : {"v4-classifier", "v5-classifier"}) {
    Params want = io::load_safetensors(kDir + name + "/resampled.safetensors").tensors;
    for (auto [h, w] : sizes) {
      const std::string key = std::to_string(h) + "x" + std::to_string(w);
      SCOPED_TRACE(std::string(name) + " at " + key);
      io::Pretrained m = io::load_pretrained(kDir + name);
      io::set_image_size(m, nn::Size2d{h, w});
      EXPECT_EQ(vit_config(m).image_size, (nn::Size2d{h, w}));
      EXPECT_LT(test_util::max_relative_error(m.params.at("vit.embeddings.position_embeddings"),
                                              want.at("position_embeddings_" + key)),
                1e-6);
      Array logits = nn::ViTForImageClassification(vit_config(m))
                         .apply(m.params, want.at("pixel_values_" + key));
      EXPECT_LT(test_util::max_relative_error(logits, want.at("logits_" + key)), 1e-5);
      ASSERT_EQ(m.notes.size(), 1u);
      EXPECT_HAS(m.notes[0], "image size 16 -> " + nn::to_string(nn::Size2d{h, w}) +
                                 ": position embeddings resampled from 4 to " +
                                 nn::to_string(nn::Size2d{h / 4, w / 4}) + " patches");
    }
  }
  // A size with the same grid of patches changes nothing but the size.
  io::Pretrained m = io::load_pretrained(kDir + "v5-classifier");
  const std::vector<float> pos =
      m.params.at("vit.embeddings.position_embeddings").to_vector<float>();
  io::set_image_size(m, nn::Size2d(18));
  EXPECT_EQ(m.params.at("vit.embeddings.position_embeddings").to_vector<float>(), pos);
  EXPECT_HAS(m.notes.at(0), "image size 16 -> 18: the same grid of 4 patches");
  EXPECT_HAS(error_of([&] { io::set_image_size(m, nn::Size2d(2)); }), "patch");
  EXPECT_HAS(
      error_of([&] {
        nn::resample_position_embeddings(zeros({1, 5, 3}), nn::Size2d(3), nn::Size2d(2));
      }),
      "position embeddings of shape (1,5,3) for a grid of 3 patches, expected (1,10,hidden)");
}

TEST(Pretrained, HubIdsAreReadFromTheHubCacheLayout) {
  Scratch s;
  const std::string commit = "0123456789abcdef0123456789abcdef01234567";
  const std::string repo = s.path("hub/models--org--tiny-vit");
  fs::create_directories(repo + "/refs");
  fs::create_directories(repo + "/blobs");
  fs::create_directories(repo + "/snapshots/" + commit);
  write(repo + "/refs/main", commit);
  write(repo + "/refs/v1", commit + "\n");
  // huggingface_hub's layout: snapshot files are links to content-addressed blobs.
  for (const char* f : {"config.json", "model.safetensors"}) {
    fs::copy_file(kDir + "v5-classifier/" + f, repo + "/blobs/blob-" + f);
    fs::create_symlink(std::string("../../blobs/blob-") + f,
                       repo + "/snapshots/" + commit + "/" + f);
  }
  EnvGuard env;
  setenv("HF_HUB_CACHE", s.path("hub").c_str(), 1);
  setenv("HF_HUB_OFFLINE", "1",
         1);  // what is missing is an error, not a download (tests/io/hub_test.cpp)
  EXPECT_EQ(io::hub_cache_dir(), s.path("hub"));
  for (const std::string& id : std::vector<std::string>{
           "org/tiny-vit", "org/tiny-vit@main", "org/tiny-vit@v1", "org/tiny-vit@" + commit}) {
    SCOPED_TRACE(id);
    io::Pretrained m = io::load_pretrained(id);
    EXPECT_EQ(m.dir, repo + "/snapshots/" + commit);
    EXPECT_TRUE(m.has_classifier);
  }
  EXPECT_HAS(error_of([] { io::load_pretrained("org/tiny-vit@v2"); }),
             "org/tiny-vit@v2: not a folder, and not in the Hugging Face cache (the cache has no "
             "revision 'v2': " +
                 repo + "/refs/v2 does not exist), and HF_HUB_OFFLINE is set");
  EXPECT_HAS(error_of([] { io::load_pretrained("org/other"); }),
             "org/other: not a folder, and not in the Hugging Face cache (" + s.path("hub") +
                 "/models--org--other does not exist)");
  EXPECT_HAS(error_of([] { io::load_pretrained("org/../etc"); }), "not a Hub id");
  EXPECT_HAS(error_of([] { io::load_pretrained("org--x/tiny-vit"); }), "not a Hub id");
  EXPECT_HAS(error_of([] { io::load_pretrained("org/" + std::string(300, 'a')); }), "not a Hub id");
  EXPECT_HAS(error_of([] { io::load_pretrained("org/tiny-vit@../x"); }), "not a Hub id");
  // A ref that is not a commit; links that lead out of the repository's folder.
  write(repo + "/refs/bad", "not a commit hash\n");
  EXPECT_HAS(error_of([] { io::load_pretrained("org/tiny-vit@bad"); }),
             repo + "/refs/bad: expected a commit hash (40 hex digits)");
  write(s.path("secret"), commit);
  fs::create_symlink(s.path("secret"), repo + "/refs/linked");
  EXPECT_HAS(error_of([] { io::load_pretrained("org/tiny-vit@linked"); }),
             "(a link out of the Hub cache's repository folder)");
  fs::copy_file(kDir + "v5-classifier/model.safetensors", s.path("outside.safetensors"));
  fs::remove(repo + "/snapshots/" + commit + "/model.safetensors");
  fs::create_symlink(s.path("outside.safetensors"),
                     repo + "/snapshots/" + commit + "/model.safetensors");
  EXPECT_HAS(error_of([] { io::load_pretrained("org/tiny-vit"); }),
             "outside " + repo + " (a link out of the Hub cache's repository folder)");
  // As huggingface_hub: HF_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME, the home folder; ~ expanded.
  unsetenv("HF_HUB_CACHE");
  setenv("HOME", "/home/someone", 1);
  setenv("HF_HOME", "~/hf", 1);
  EXPECT_EQ(io::hub_cache_dir(), "/home/someone/hf/hub");
  setenv("HUGGINGFACE_HUB_CACHE", "/legacy", 1);
  EXPECT_EQ(io::hub_cache_dir(), "/legacy");
  unsetenv("HUGGINGFACE_HUB_CACHE");
  unsetenv("HF_HOME");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(io::hub_cache_dir(), "/xdg/huggingface/hub");
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(io::hub_cache_dir(), "/home/someone/.cache/huggingface/hub");
}

TEST(Pretrained, BadFoldersGetAnErrorNamingTheFileOrTensor) {
  Scratch s;
  // A shard name out of the folder.
  std::string sharded = s.copy("v5-sharded");
  write(sharded + "/model.safetensors.index.json",
        R"({"weight_map": {"vit.layernorm.weight": "../model-00001-of-00003.safetensors"}})");
  EXPECT_HAS(error_of([&] { io::load_pretrained(sharded); }),
             "weight_map[\"vit.layernorm.weight\"] names the file "
             "\"../model-00001-of-00003.safetensors\", "
             "expected a file name in the model's folder");
  write(sharded + "/model.safetensors.index.json",
        R"({"weight_map": {"vit.layernorm.weight": ")" + std::string(300, 'x') + R"("}})");
  EXPECT_HAS(error_of([&] { io::load_pretrained(sharded); }),
             "expected a file name in the model's folder");
  write(sharded + "/model.safetensors.index.json",
        R"({"weight_map": {"vit.layernorm.weight": "gone.safetensors"}})");
  EXPECT_HAS(error_of([&] { io::load_pretrained(sharded); }),
             "lists gone.safetensors, which is not in");
  write(sharded + "/model.safetensors.index.json",
        R"({"weight_map": {"vit.layernorm.nothing": "model-00001-of-00003.safetensors"}})");
  EXPECT_HAS(
      error_of([&] { io::load_pretrained(sharded); }),
      "puts tensor 'vit.layernorm.nothing' in model-00001-of-00003.safetensors, which lacks it");
  write(sharded + "/model.safetensors.index.json", R"({"weight_map": [1]})");
  EXPECT_HAS(error_of([&] { io::load_pretrained(sharded); }),
             "expected an object with \"weight_map\"");
  write(sharded + "/model.safetensors.index.json", "{");
  EXPECT_HAS(error_of([&] { io::load_pretrained(sharded); }),
             "model.safetensors.index.json: not valid JSON");

  // Weights that do not fit the config: the tensor and both shapes.
  std::string dir = s.copy("v5-classifier");
  std::string text;
  {
    std::ifstream in(dir + "/config.json");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  write(dir + "/config.json", replaced(text, "\"image_size\": 16", "\"image_size\": 32"));
  EXPECT_HAS(
      error_of([&] { io::load_pretrained(dir); }),
      "tensor 'vit.embeddings.position_embeddings' has shape (1,17,16), but config.json "
      "(hidden_size 16, image_size 32, patch_size 4, 3 labels, 2 layers) asks for (1,65,16)");
  write(dir + "/config.json",
        replaced(text, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"));
  EXPECT_HAS(error_of([&] { io::load_pretrained(dir); }),
             "the weights lack vit.encoder.layer.2.attention.attention.key.bias");
  write(dir + "/config.json", text);

  // Other formats, and no folder at all.
  fs::rename(dir + "/model.safetensors", dir + "/pytorch_model.bin");
  EXPECT_HAS(error_of([&] { io::load_pretrained(dir); }),
             "no model.safetensors or model.safetensors.index.json (it has pytorch_model.bin: kiln "
             "reads safetensors only");
  fs::remove(dir + "/config.json");
  EXPECT_HAS(error_of([&] { io::load_pretrained(dir); }), "no config.json");
  EXPECT_HAS(error_of([&] { io::load_pretrained(dir + "/pytorch_model.bin"); }),
             "a file; expected the model's folder or a Hub id");
}

}  // namespace
}  // namespace kiln
