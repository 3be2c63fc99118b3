// GPT-2 through the model interface: the registry (config.json's model_type
// "gpt2", the presets), pretrained folders as transformers saves them and as
// the first GPT-2 checkpoints name their tensors, and save_pretrained read
// back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "../test_util.h"
#include "kiln/gpt2.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/model.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test_util::error_of;

const std::string kGolden = std::string(KILN_FIXTURES_DIR) + "/gpt2_golden/";

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("kiln-gpt2-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& leaf) const { return (path / leaf).string(); }
};

TEST(Gpt2Family, RegisteredWithItsPresets) {
  for (const char* p : {"gpt2", "gpt2-medium", "gpt2-tiny"}) {
    const auto m = nn::model_from_preset(p);
    EXPECT_EQ(m->model_type(), "gpt2");
    EXPECT_EQ(m->architecture(), "GPT2LMHeadModel");
    EXPECT_TRUE(m->causal_lm());
    ASSERT_NE(nn::as_gpt2(*m), nullptr);
  }
  EXPECT_EQ(nn::as_gpt2(*nn::model_from_preset("gpt2-medium"))->config().n_layer, 24);
  EXPECT_EQ(nn::as_gpt2(*nn::model_from_preset("vit-tiny")), nullptr);
  EXPECT_FALSE(nn::model_from_preset("vit-tiny")->causal_lm());
  const auto m = nn::model_from_preset("gpt2-tiny");
  EXPECT_EQ(m->num_logits(), 50257);
  EXPECT_TRUE(m->head_parameters().empty());
  EXPECT_NE(error_of([&] {
              m->with_labels({"a", "b"});
            }).find("has no classifier"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              m->loss(zeros({1, 2, 50257}), zeros({1, 2}, DType::i64), 0.1);
            }).find("label smoothing"),
            std::string::npos);
  // Layer groups: embeddings, one per block, ln_f with the head.
  EXPECT_EQ(m->num_layer_groups(), 6);
  EXPECT_EQ(m->layer_group("transformer.wpe.weight"), 0);
  EXPECT_EQ(m->layer_group("transformer.h.2.mlp.c_fc.weight"), 3);
  EXPECT_EQ(m->layer_group("transformer.ln_f.bias"), 5);
}

TEST(Gpt2Family, LoadsFoldersTransformersSaved) {
  for (const char* v : {"tied", "untied"}) {
    SCOPED_TRACE(v);
    const io::Pretrained m = io::load_pretrained(kGolden + v);
    ASSERT_TRUE(m.model->causal_lm());
    const Params want = io::load_safetensors(kGolden + v + "/model.safetensors").tensors;
    EXPECT_EQ(m.params.size(), want.size());
    for (const auto& [n, a] : want)
      EXPECT_EQ(m.params.at(n).to_vector<float>(), a.to_vector<float>()) << n;
    EXPECT_TRUE(m.state.empty());
    EXPECT_TRUE(m.notes.empty()) << m.notes[0];
    // Its forward is the fixture's.
    const Params batch = io::load_safetensors(kGolden + v + "/batch.safetensors").tensors;
    const Params expected = io::load_safetensors(kGolden + v + "/expected.safetensors").tensors;
    const Array logits = m.model->apply(m.params, {}, batch.at("input_ids")).logits;
    EXPECT_LT(test_util::max_relative_error(logits, expected.at("logits")), 1e-5);
  }
}

// The first GPT-2 checkpoints (GPT2Model's names, no "transformer." prefix)
// stored each layer's causal mask, attn.bias, and some a tied lm_head.weight
// beside wte: read as transformers reads them.
TEST(Gpt2Family, LoadsGpt2ModelNamesMasksAndATiedHeadStoredTwice) {
  TempDir dir;
  const Params want = io::load_safetensors(kGolden + "tied/model.safetensors").tensors;
  Params old;
  for (const auto& [n, a] : want) old.emplace(n.substr(std::string("transformer.").size()), a);
  old.emplace("h.0.attn.bias", ones({1, 1, 40, 40}));
  old.emplace("h.1.attn.masked_bias", full({}, -1e4, DType::f32));
  old.emplace("lm_head.weight", want.at("transformer.wte.weight"));
  io::save_safetensors(dir / "model.safetensors", old);
  fs::copy_file(kGolden + "tied/config.json", dir / "config.json");
  const io::Pretrained m = io::load_pretrained(dir.path.string());
  ASSERT_EQ(m.params.size(), want.size());
  for (const auto& [n, a] : want)
    EXPECT_EQ(m.params.at(n).to_vector<float>(), a.to_vector<float>()) << n;
  EXPECT_TRUE(m.notes.empty());
  // A tensor of the wrong shape names itself.
  old["h.1.mlp.c_fc.weight"] = zeros({3, 3});
  io::save_safetensors(dir / "model.safetensors", old);
  EXPECT_NE(error_of([&] {
              io::load_pretrained(dir.path.string());
            }).find("tensor 'transformer.h.1.mlp.c_fc.weight' has shape (3,3)"),
            std::string::npos);
}

// save_pretrained writes what load_pretrained (and transformers) read back:
// config.json as GPT2Config, the tied head left out as transformers leaves it.
TEST(Gpt2Family, SavePretrainedReadsBack) {
  TempDir dir;
  const auto model = nn::model_from_preset("gpt2-tiny");
  const Params p = model->init(random::Key(3));
  io::save_pretrained(dir / "out", *model, p);
  const io::Pretrained back = io::load_pretrained(dir / "out");
  EXPECT_EQ(back.model->config_json(), model->config_json());
  ASSERT_EQ(back.params.size(), p.size());
  EXPECT_EQ(back.params.count("lm_head.weight"), 0u);
  for (const auto& [n, a] : p)
    EXPECT_EQ(back.params.at(n).to_vector<float>(), a.to_vector<float>()) << n;
  EXPECT_FALSE(fs::exists(dir / "out/preprocessor_config.json"));
}

}  // namespace
}  // namespace kiln
