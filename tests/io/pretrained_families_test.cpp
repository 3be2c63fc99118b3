// Pretrained folders of every family (io::load_pretrained by config.json's
// model_type): a ResNet's weights and running statistics, DeiT with its
// teacher's head, a new classifier for the data's labels drawn by the
// family's init, and the errors of a BatchNorm without statistics and of
// weights of another family; then fine-tuning, evaluating and predicting
// from such folders with the kiln command.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <set>

#include "../test_util.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = std::string(KILN_FIXTURES_DIR) + "/";

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() /
               ("kiln-pretrained-families-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  return p.string();
}

bool same(const Array& a, const Array& b) {
  if (a.shape() != b.shape()) return false;
  auto x = astype(a, DType::f64).to_vector<double>(), y = astype(b, DType::f64).to_vector<double>();
  return x == y;
}

// A copy of a fixture's folder whose weights are `weights`.
std::string folder_with(const std::string& fixture, const Params& weights,
                        const std::string& name) {
  const std::string dir = temp_dir(name);
  fs::create_directories(dir);
  fs::copy_file(kFixtures + fixture + "/config.json", dir + "/config.json");
  io::save_safetensors(dir + "/model.safetensors", weights);
  return dir;
}

TEST(PretrainedFamilies, AResNetFolderHoldsItsWeightsAndStatistics) {
  const std::string dir = kFixtures + "resnet_bottleneck_golden";
  const io::Pretrained m = io::load_pretrained(dir);
  EXPECT_EQ(m.model->architecture(), "ResNetForImageClassification");
  EXPECT_TRUE(m.has_classifier);
  const Params file = io::load_safetensors(dir + "/model.safetensors").tensors;
  EXPECT_EQ(m.params.size() + m.state.size(), file.size());
  EXPECT_EQ(m.state.size(), m.model->state_shapes().size());
  for (auto& [name, v] : m.params) EXPECT_TRUE(same(v, file.at(name))) << name;
  for (auto& [name, v] : m.state) EXPECT_TRUE(same(v, file.at(name))) << name;
  EXPECT_NO_THROW(m.model->check(m.params, m.state, "loaded"));
  EXPECT_FALSE(m.has_processor);
  EXPECT_EQ(m.processor.size, nn::Size2d(224));  // ViTImageProcessor's defaults at 224

  const io::Pretrained deit = io::load_pretrained(kFixtures + "deit_golden/deit_with_teacher");
  EXPECT_EQ(deit.model->architecture(), "DeiTForImageClassificationWithTeacher");
  EXPECT_TRUE(deit.has_classifier);
  EXPECT_TRUE(deit.state.empty());
  const io::Pretrained convnext = io::load_pretrained(kFixtures + "convnext_golden");
  EXPECT_EQ(convnext.model->model_type(), "convnext");
  EXPECT_EQ(convnext.processor.size, nn::Size2d(32));  // its config's image_size
}

TEST(PretrainedFamilies, ANewClassifierForTheDataKeepsTheRest) {
  io::Pretrained m = io::load_pretrained(kFixtures + "resnet_basic_golden");
  const Params before = m.params;
  io::adapt_classifier(m, {"cat", "dog", "emu"}, random::Key(3));
  EXPECT_EQ(m.model->num_labels(), 3);
  EXPECT_EQ(m.model->label_names()[2], "emu");
  EXPECT_EQ(m.model->head_parameters(),
            (std::set<std::string>{"classifier.1.bias", "classifier.1.weight"}));
  EXPECT_NO_THROW(m.model->check(m.params, m.state, "adapted"));
  for (auto& [name, v] : m.params)
    if (name.rfind("classifier.", 0) != 0) {
      EXPECT_TRUE(same(v, before.at(name))) << name;
    }
  EXPECT_EQ(m.params.at("classifier.1.weight").shape(), (Shape{3, 16}));
  ASSERT_FALSE(m.notes.empty());
  EXPECT_NE(m.notes.back().find("a new one for 3 labels (cat, dog, emu)"), std::string::npos)
      << m.notes.back();

  // Unnamed labels (LABEL_i) of the data's number: the classifier stays.
  io::Pretrained k = io::load_pretrained(kFixtures + "resnet_basic_golden");
  std::vector<std::string> ten;
  for (int i = 0; i < 10; ++i) ten.push_back("class" + std::to_string(i));
  io::adapt_classifier(k, ten, random::Key(3));
  EXPECT_TRUE(same(k.params.at("classifier.1.weight"), before.at("classifier.1.weight")));
  EXPECT_EQ(k.model->label_names()[4], "class4");

  // A headless folder gets a classifier.
  Params headless =
      io::load_safetensors(kFixtures + "resnet_basic_golden/model.safetensors").tensors;
  headless.erase("classifier.1.weight");
  headless.erase("classifier.1.bias");
  const std::string dir = folder_with("resnet_basic_golden", headless, "headless");
  io::Pretrained h = io::load_pretrained(dir);
  EXPECT_FALSE(h.has_classifier);
  io::adapt_classifier(h, {"a", "b"}, random::Key(1));
  EXPECT_TRUE(h.has_classifier);
  EXPECT_EQ(h.params.at("classifier.1.bias").shape(), (Shape{2}));
  fs::remove_all(dir);
}

// A DeiT stays a DeiT: new labels get new heads (its teacher's too, drawn by
// the family's init), and another image size resamples the position
// embeddings past the class and distillation tokens as transformers'
// DeiTEmbeddings.interpolate_pos_encoding does, logits included (an earlier
// kiln made a default ViT-B of either).
TEST(PretrainedFamilies, ADeiTKeepsItsFamilyWithNewLabelsAndImageSizes) {
  for (const std::string variant : {"deit", "deit_with_teacher"}) {
    SCOPED_TRACE(variant);
    const std::string dir = kFixtures + "deit_golden/" + variant;
    const Params want = io::load_safetensors(dir + "/resampled.safetensors").tensors;
    for (const auto& [h, w] : {std::pair<int64_t, int64_t>{48, 48}, {24, 40}, {16, 16}}) {
      const std::string size = std::to_string(h) + "x" + std::to_string(w);
      SCOPED_TRACE(size);
      io::Pretrained m = io::load_pretrained(dir);
      const std::string architecture = m.model->architecture();
      io::set_image_size(m, nn::Size2d{h, w});
      EXPECT_EQ(m.model->architecture(), architecture);
      EXPECT_EQ(m.model->image_size(), (nn::Size2d{h, w}));
      EXPECT_LT(test_util::max_relative_error(m.params.at("deit.embeddings.position_embeddings"),
                                              want.at("position_embeddings_" + size)),
                1e-6);
      const Array logits =
          m.model->apply(m.params, m.state, want.at("pixel_values_" + size)).logits;
      EXPECT_LT(test_util::max_relative_error(logits, want.at("logits_" + size)), 1e-5);
    }
    io::Pretrained m = io::load_pretrained(dir);
    const Params before = m.params;
    const std::string architecture = m.model->architecture();
    io::adapt_classifier(m, {"cat", "dog", "fox"}, random::Key(2));
    EXPECT_EQ(m.model->architecture(), architecture);
    EXPECT_EQ(m.model->label_names(), (std::vector<std::string>{"cat", "dog", "fox"}));
    EXPECT_EQ(m.model->image_size(), nn::Size2d(32));
    EXPECT_NO_THROW(m.model->check(m.params, m.state, "adapted"));
    const std::set<std::string> head = m.model->head_parameters();
    EXPECT_EQ(head.size(), variant == "deit" ? 2u : 4u);
    for (auto& [name, v] : m.params) {
      if (head.count(name)) {
        EXPECT_EQ(v.shape()[0], 3) << name;
      } else {
        EXPECT_TRUE(same(v, before.at(name))) << name;
      }
    }
  }
}

TEST(PretrainedFamilies, MissingStatisticsAndAnotherFamilysWeightsAreNamed) {
  Params w = io::load_safetensors(kFixtures + "resnet_basic_golden/model.safetensors").tensors;
  w.erase("resnet.embedder.embedder.normalization.running_var");
  std::string dir = folder_with("resnet_basic_golden", w, "no-stats");
  std::string e = test_util::error_of([&] { io::load_pretrained(dir); });
  EXPECT_NE(e.find("the weights lack resnet.embedder.embedder.normalization.running_var: a "
                   "BatchNorm saved without its running statistics cannot be evaluated"),
            std::string::npos)
      << e;
  fs::remove_all(dir);

  const Params vit = io::load_safetensors(kFixtures + "vit_golden/model.safetensors").tensors;
  dir = folder_with("resnet_basic_golden", vit, "other-family");
  e = test_util::error_of([&] { io::load_pretrained(dir); });
  EXPECT_NE(e.find("the weights lack resnet."), std::string::npos) << e;
  EXPECT_NE(e.find("weights of another model?"), std::string::npos) << e;
  fs::remove_all(dir);

  w = io::load_safetensors(kFixtures + "resnet_basic_golden/model.safetensors").tensors;
  w["resnet.embedder.embedder.convolution.weight"] = zeros({8, 3, 3, 3});
  dir = folder_with("resnet_basic_golden", w, "bad-shape");
  e = test_util::error_of([&] { io::load_pretrained(dir); });
  EXPECT_NE(e.find("tensor 'resnet.embedder.embedder.convolution.weight' has shape (8,3,3,3)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("(ResNetForImageClassification) asks for (8,3,7,7)"), std::string::npos) << e;
  fs::remove_all(dir);
}

struct CliRun {
  int status;
  std::string output;
};

CliRun kiln(const std::string& args) {
  FILE* p = popen((test_util::kiln_cli_path() + " " + args + " 2>&1").c_str(), "r");
  CliRun r{};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  r.status = pclose(p);
  return r;
}

// Fine-tuning a ResNet folder on an image folder of two classes (a new
// classifier), evaluating the checkpoint, and predicting from it and from
// the pretrained folder itself.
// The decoding fixtures' images in an image folder of two classes, a and b.
std::string two_class_folder(const std::string& name) {
  const std::string images = temp_dir(name);
  int i = 0;
  for (const auto& e : fs::directory_iterator(kFixtures + "decode/images")) {
    const std::string cls = i++ % 2 ? "/b" : "/a";
    fs::create_directories(images + cls);
    fs::copy_file(e.path(), images + cls + "/" + e.path().filename().string());
  }
  return images;
}

TEST(PretrainedFamilies, AResNetFineTunesEvaluatesAndPredictsFromTheCommand) {
  const std::string images = two_class_folder("images"), ckpt = temp_dir("ckpt");
  const std::string model = kFixtures + "resnet_bottleneck_golden";
  CliRun t =
      kiln("train --init-from " + model + " --data imagefolder:" + images +
           " --skip-bad-images --image-size 32 --steps 3 --warmup 1 --batch-size 4 --save " + ckpt);
  ASSERT_EQ(t.status, 0) << t.output;
  EXPECT_NE(t.output.find("a new one for 2 labels (a, b)"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("32x32 images"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("final held-out accuracy"), std::string::npos) << t.output;
  const io::Checkpoint ck = io::load_checkpoint(ckpt);
  EXPECT_EQ(ck.model->label_names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ck.model_state.size(), ck.model->state_shapes().size());

  CliRun e = kiln("eval --checkpoint " + ckpt + " --data imagefolder:" + images);
  EXPECT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find("(step 3) on imagefolder:"), std::string::npos) << e.output;

  for (const std::string& src : {ckpt, model}) {
    CliRun p = kiln("predict --model " + src + " --top-k 2 --json " + images + "/a");
    EXPECT_EQ(p.status == 0 || p.output.find("failed") != std::string::npos, true) << p.output;
    EXPECT_NE(p.output.find("\"predictions\""), std::string::npos) << p.output;
    EXPECT_NE(p.output.find(src == ckpt ? "\"label\":\"a\"" : "\"label\":\"LABEL_"),
              std::string::npos)
        << p.output;
  }
  fs::remove_all(images);
  fs::remove_all(ckpt);
}

// A DeiT with its teacher's head fine-tuned from its folder at another image
// size, with the DeiT recipe's augmentation (random crops, flips, color
// jitter): still a DeiT of the data's labels, its checkpoint evaluated.
TEST(PretrainedFamilies, ADeiTFineTunesFromItsFolderOnAnImageFolder) {
  const std::string images = two_class_folder("deit-images"), ckpt = temp_dir("deit-ckpt");
  CliRun t = kiln("train --init-from " + kFixtures +
                  "deit_golden/deit_with_teacher --data imagefolder:" + images +
                  " --skip-bad-images --image-size 48 --augment --color-jitter 0.4 --steps 3 " +
                  "--warmup 1 --batch-size 4 --save " + ckpt);
  ASSERT_EQ(t.status, 0) << t.output;
  EXPECT_NE(t.output.find("a new one for 2 labels (a, b)"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("position embeddings resampled from 4 to 6 patches"), std::string::npos)
      << t.output;
  EXPECT_NE(t.output.find("48x48 images"), std::string::npos) << t.output;
  const io::Checkpoint ck = io::load_checkpoint(ckpt);
  EXPECT_EQ(ck.model->architecture(), "DeiTForImageClassificationWithTeacher");
  EXPECT_EQ(ck.model->label_names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ck.model->image_size(), nn::Size2d(48));
  CliRun e = kiln("eval --checkpoint " + ckpt + " --data imagefolder:" + images);
  EXPECT_EQ(e.status, 0) << e.output;
  fs::remove_all(images);
  fs::remove_all(ckpt);
}

}  // namespace
}  // namespace kiln
