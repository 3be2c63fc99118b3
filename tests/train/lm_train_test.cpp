// kiln train with a language model: a small GPT-2 learns the GNU GPL v3 (as
// Debian ships it) from text tokenized once and cached, alike in eager, lazy
// and jit; evaluation reports the next token's loss and accuracy; the
// checkpoint keeps the tokenizer and resumes; token files train too; bad data
// gets clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include "../test_util.h"
#include "kiln/gpt2.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/tokens.h"
#include "kiln/train.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test_util::error_of;

const std::string kTokenizer = std::string(KILN_FIXTURES_DIR) + "/tokenizer_golden";
const std::string kText = "/usr/share/common-licenses/GPL-3";

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("kiln-lm-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  return p.string();
}

// $KILN_TOKEN_CACHE pointed at a folder of its own, removed afterwards.
struct TokenCache {
  std::string dir;
  test_util::ScopedEnv env;
  explicit TokenCache(const std::string& name)
      : dir(temp_dir(name)), env("KILN_TOKEN_CACHE", dir.c_str()) {}
  ~TokenCache() { fs::remove_all(dir); }
};

std::shared_ptr<const nn::Model> tiny_gpt2() {
  nn::GPT2Config c;
  c.vocab_size = 1200, c.n_positions = 64, c.n_embd = 32, c.n_layer = 2, c.n_head = 2;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0;
  c.bos_token_id = c.eos_token_id = 0;
  return nn::gpt2_model(c);
}

train::TrainConfig lm_run(const std::string& mode) {
  train::TrainConfig t;
  t.model = tiny_gpt2();
  t.model_name = "tiny-gpt2";
  t.data = "text:" + kText;
  t.tokenizer = kTokenizer;
  t.seq_len = 32;
  t.batch_size = 8;
  t.mode = train::parse_mode(mode);
  t.optimizer = "adamw";
  t.lr = 3e-3;
  t.weight_decay = 0.01;
  t.steps = 40;
  t.warmup = 0;
  t.eval_every = 40;
  t.workers = 0;
  return t;
}

TEST(TrainLm, ASmallGpt2LearnsTextAlikeInEveryMode) {
  const TokenCache cache("cache");
  std::vector<double> first_losses, last_losses;
  for (const char* mode : {"eager", "lazy", "jit"}) {
    SCOPED_TRACE(mode);
    std::string seen;
    train::Callbacks cb{.on_data = [&](const std::string& d) { seen = d; }};
    train::TrainConfig t = lm_run(mode);
    t.steps = t.eval_every = 150;
    const train::TrainReport r = train::run(t, cb);
    EXPECT_NE(seen.find("text:" + kText + ": 1 file"), std::string::npos) << seen;
    ASSERT_EQ(r.steps.size(), 150u);
    first_losses.push_back(r.steps[0].loss);
    // From about log(1200) = 7.09 at the start to well below (5.27 here,
    // the held-out end of the licence 5.98).
    EXPECT_GT(r.steps[0].loss, 6.5);
    EXPECT_LT(r.steps.back().loss, 5.6);
    last_losses.push_back(r.steps.back().loss);
    ASSERT_EQ(r.evals.size(), 1u);
    const train::EvalResult& e = r.evals[0];
    EXPECT_LT(e.loss, 6.3);
    EXPECT_GT(e.accuracy, 0.03);  // chance: 1 / 1200
    EXPECT_GE(e.top5, e.accuracy);
    EXPECT_EQ(e.tokens, e.samples * 31);  // 31 predictions per block of 32
    EXPECT_GT(r.flops_per_step, 0);
  }
  EXPECT_NEAR(first_losses[1], first_losses[0], 1e-4);
  EXPECT_NEAR(first_losses[2], first_losses[0], 1e-4);
  EXPECT_NEAR(last_losses[1], last_losses[0], 1e-3);
  EXPECT_NEAR(last_losses[2], last_losses[0], 1e-3);
}

// An evaluation's next-token loss, accuracy and top-5 on blocks whose next
// token is, by construction, the one the model ranks r-th (r = 0..7 in
// turn: r = 0 a top-1 hit, r < 5 a top-5 hit), eager and compiled, in batches
// of two shapes; the loss against the logits' log-sum-exp on the host.
TEST(TrainLm, EvaluationCountsTheTokensTheModelRanksFirstAndInItsTopFive) {
  auto model = tiny_gpt2();
  const Params params = model->init(random::Key(5));
  const int64_t blocks = 5, t = 16, vocab = 1200;
  std::vector<int32_t> ids(blocks * t);
  std::mt19937 rng(7);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
  auto logits_of = [&] {
    Array x = Array::from_vector(ids, {blocks, t});
    return model->apply(params, {}, x, {.inference = true}).logits.to_vector<float>();
  };
  // Position p's logits read tokens 0..p only: token p + 1 is chosen from
  // them, in order, and they stay what they were.
  int hits = 0, top5 = 0;
  for (int64_t p = 0; p + 1 < t; ++p) {
    const std::vector<float> logits = logits_of();
    for (int64_t b = 0; b < blocks; ++b) {
      const float* row = logits.data() + (b * t + p) * vocab;
      std::vector<int32_t> order(vocab);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t i, int32_t j) { return row[i] > row[j]; });
      const int64_t rank = (b + p) % 8;
      ids[b * t + p + 1] = order[rank];
      hits += rank == 0;
      top5 += rank < 5;
    }
  }
  const std::vector<float> logits = logits_of();
  double loss = 0;
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t p = 0; p + 1 < t; ++p) {
      const float* row = logits.data() + (b * t + p) * vocab;
      double m = *std::max_element(row, row + vocab), z = 0;
      for (int64_t v = 0; v < vocab; ++v) z += std::exp(row[v] - m);
      loss += m + std::log(z) - row[ids[b * t + p + 1]];
    }
  const double predicted = static_cast<double>(blocks * (t - 1));
  ASSERT_GT(hits, 0);
  ASSERT_GT(top5, hits);
  ASSERT_LT(top5, predicted);
  data::TokenBlocks data(std::make_shared<const std::vector<int32_t>>(ids), t);
  for (bool compiled : {false, true}) {
    SCOPED_TRACE(compiled ? "compiled" : "eager");
    const train::EvalResult r = train::evaluate(model, params, {}, data, 2, {}, compiled);
    EXPECT_EQ(r.tokens, blocks * (t - 1));
    EXPECT_DOUBLE_EQ(r.accuracy, hits / predicted);
    EXPECT_DOUBLE_EQ(r.top5, top5 / predicted);
    EXPECT_NEAR(r.loss, loss / predicted, 1e-4 * loss / predicted);
  }
}

// The text is tokenized once: a second run reads the cache.
TEST(TrainLm, TheTextIsTokenizedOnce) {
  const TokenCache cache("cache-once");
  const std::string& dir = cache.dir;
  train::TrainConfig t = lm_run("jit");
  t.steps = 1;
  t.eval_every = 0;
  std::string first, second;
  train::run(t, {.on_data = [&](const std::string& d) { first = d; }});
  train::run(t, {.on_data = [&](const std::string& d) { second = d; }});
  EXPECT_NE(first.find("(tokenized; cached in " + dir), std::string::npos) << first;
  EXPECT_NE(second.find("(read from the cache " + dir), std::string::npos) << second;
}

// The checkpoint is a folder kiln generate reads (the tokenizer kept with
// the weights), and a run resumed from it continues where it stopped.
TEST(TrainLm, TheCheckpointKeepsTheTokenizerAndResumes) {
  const TokenCache cache("cache-ck");
  const std::string dir = temp_dir("ck");
  train::TrainConfig t = lm_run("jit");
  t.steps = 6;
  t.eval_every = 0;
  t.save_dir = dir;
  t.save_every = 3;
  const train::TrainReport whole = train::run(t);
  ASSERT_TRUE(fs::exists(dir + "/tokenizer.json"));
  const io::Pretrained m = io::load_pretrained(dir);
  ASSERT_TRUE(m.model->causal_lm());
  const data::Tokenizer tok = data::Tokenizer::from_folder(dir);
  const std::vector<int32_t> ids = tok.encode("the GNU General Public License");
  const Array out = nn::generate(*nn::as_gpt2(*m.model), m.params,
                                 Array::from_vector(ids, {1, static_cast<int64_t>(ids.size())}),
                                 {.max_new_tokens = 5});
  EXPECT_EQ(out.shape()[1], static_cast<int64_t>(ids.size()) + 5);
  // Stopped at step 3 and resumed: the same losses for steps 4-6 (without a
  // --tokenizer: the checkpoint's).
  const std::string half = temp_dir("half");
  t.save_dir = half;
  t.steps = 3;
  train::run(t);
  t.steps = 6;
  t.resume_dir = half;
  t.tokenizer.clear();
  const train::TrainReport rest = train::run(t);
  ASSERT_EQ(rest.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(rest.steps[i].loss, whole.steps[3 + i].loss, 1e-4);
  fs::remove_all(dir);
  fs::remove_all(half);
}

// llm.c's .bin files: one file (its last 10% held out), or nanoGPT's folder
// of train.bin and val.bin.
TEST(TrainLm, TokenFilesTrain) {
  const std::string dir = temp_dir("bin");
  fs::create_directories(dir);
  std::vector<int32_t> ids;
  for (int i = 0; i < 4000; ++i) ids.push_back((i * 7 + i / 13) % 1200);
  data::write_token_file(dir + "/train.bin", ids);
  data::write_token_file(dir + "/val.bin", std::vector<int32_t>(ids.begin(), ids.begin() + 640));
  for (const std::string& data : {"tokens:" + dir + "/train.bin", "tokens:" + dir}) {
    SCOPED_TRACE(data);
    train::TrainConfig t = lm_run("jit");
    t.data = data;
    t.tokenizer.clear();
    t.steps = 3;
    t.eval_every = 3;
    const train::TrainReport r = train::run(t);
    ASSERT_EQ(r.evals.size(), 1u);
    // One file: 125 blocks of 32, the last 12 held out; the folder: val.bin's 20.
    EXPECT_EQ(r.evals[0].samples, data.ends_with(".bin") ? 12 : 20);
  }
  fs::remove_all(dir);
}

// --init-from a folder transformers saved: its weights are where training
// starts (the first loss is the pretrained model's on that batch, far below
// a fresh model's), and the loss falls from there.
TEST(TrainLm, FineTunesAFolderTransformersSaved) {
  const std::string dir = temp_dir("finetune");
  fs::create_directories(dir);
  std::vector<int32_t> ids;
  for (int i = 0; i < 3000; ++i) ids.push_back((i * 5 + i / 7) % 97);
  data::write_token_file(dir + "/train.bin", ids);
  train::TrainConfig t = lm_run("jit");
  t.init_from = std::string(KILN_FIXTURES_DIR) + "/gpt2_golden/tied";
  t.model = nn::model_from_preset("gpt2-tiny");  // replaced by the pretrained model
  t.data = "tokens:" + dir + "/train.bin";
  t.tokenizer.clear();
  t.seq_len = 16;
  t.steps = 30;
  t.eval_every = 0;
  t.save_dir = dir + "/out";
  const train::TrainReport r = train::run(t);
  EXPECT_LT(r.steps.back().loss, r.steps.front().loss - 0.5);
  const io::Pretrained m = io::load_pretrained(dir + "/out");
  EXPECT_EQ(m.model->config_json(),
            io::load_pretrained(t.init_from).model->config_json());  // the same GPT-2
  fs::remove_all(dir);
}

TEST(TrainLm, BadDataGetsClearErrors) {
  const TokenCache cache("cache-bad");
  const std::string dir = temp_dir("bad");
  fs::create_directories(dir);
  auto error = [](train::TrainConfig t) { return error_of([&] { train::run(t); }); };
  train::TrainConfig t = lm_run("eager");
  t.tokenizer.clear();
  EXPECT_NE(error(t).find("needs a tokenizer: --tokenizer DIR"), std::string::npos);
  t = lm_run("eager");
  t.data = "tokens:" + dir + "/out.bin";
  data::write_token_file(dir + "/out.bin", {1, 2, 3, 1200, 5});
  EXPECT_NE(error(t).find("out.bin: token 3 is 1200, outside the model's vocabulary [0, 1200)"),
            std::string::npos);
  std::ofstream(dir + "/empty.txt").flush();
  t.data = "text:" + dir + "/empty.txt";
  EXPECT_NE(error(t).find("empty.txt: an empty text file: nothing to train on"), std::string::npos);
  t.data = "text:" + kText;
  t.seq_len = 65;
  EXPECT_NE(error(t).find("--seq-len 65: expected 2 ... 64 (the model's n_positions)"),
            std::string::npos);
  t.seq_len = 32;
  t.data = "random";
  EXPECT_NE(error(t).find("is a language model; expected text:PATH or tokens:PATH"),
            std::string::npos);
  t = lm_run("eager");
  t.mixup.mixup_alpha = 0.8;
  t.batch_size = 8;
  EXPECT_NE(error(t).find("--mixup/--cutmix is for image classifiers"), std::string::npos);
  // An image model on text.
  t = lm_run("eager");
  t.model = nn::model_from_preset("vit-tiny");
  t.model_name = "vit-tiny";
  EXPECT_NE(error(t).find("is text for a language model; --model vit-tiny is an image model"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
