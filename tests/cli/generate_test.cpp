// kiln generate and kiln grad on a language model: the command's text is the
// library's generate() decoded; sampling repeats by seed and mode; kiln
// grad's gradients are transformers' (the golden fixture); bad input gets
// clear errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "kiln/gpt2.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/model.h"
#include "kiln/tokenizer.h"
#include "kiln/train.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int status;
  std::string out, err;
};

CliRun kiln_cli(const std::string& args) {
  const std::string err =
      (fs::temp_directory_path() / ("kiln-generate-" + std::to_string(::getpid()) + ".err"))
          .string();
  FILE* p = popen((test_util::kiln_cli_path() + " " + args + " 2>" + err).c_str(), "r");
  CliRun r{};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  fs::remove(err);
  return r;
}

const std::string kFixtures = std::string(KILN_FIXTURES_DIR);

// A small GPT-2 of the fixture tokenizer's 1,200 tokens (or `vocab` ids, more
// than the tokenizer has), saved with it.
struct TinyLm {
  fs::path dir = fs::temp_directory_path() / ("kiln-tiny-lm-" + std::to_string(::getpid()));
  std::shared_ptr<const nn::Model> model;
  Params params;
  explicit TinyLm(int64_t vocab = 1200) {
    nn::GPT2Config c;
    c.vocab_size = vocab, c.n_positions = 48, c.n_embd = 32, c.n_layer = 2, c.n_head = 2;
    c.bos_token_id = c.eos_token_id = 0;  // <|endoftext|>
    model = nn::gpt2_model(c);
    params = model->init(random::Key(11));
    // Larger weights than init's, so that the continuation varies.
    for (auto& [n, a] : params) a = a * 20.0;
    io::save_pretrained(dir.string(), *model, params);
    fs::copy_file(kFixtures + "/tokenizer_golden/tokenizer.json", dir / "tokenizer.json");
  }
  ~TinyLm() { fs::remove_all(dir); }
};

std::string shell_quote(const std::string& s) {
  return "'" + s + "'";
}

TEST(Generate, PrintsTheLibrarysGreedyContinuation) {
  TinyLm lm;
  const std::string prompt = "the GNU General Public License";
  const data::Tokenizer tok = data::Tokenizer::from_folder(lm.dir.string());
  const std::vector<int32_t> ids = tok.encode(prompt);
  const Array want = nn::generate(*nn::as_gpt2(*lm.model), lm.params,
                                  Array::from_vector(ids, {1, static_cast<int64_t>(ids.size())}),
                                  {.max_new_tokens = 10, .eos_token_id = 0});
  const std::string text = tok.decode(want.to_vector<int32_t>());
  for (const char* mode : {"jit", "eager"}) {
    SCOPED_TRACE(mode);
    const CliRun r = kiln_cli("generate --model " + lm.dir.string() + " --prompt " +
                              shell_quote(prompt) + " --max-new-tokens 10 --mode " + mode);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, text + "\n");
    EXPECT_EQ(r.out.rfind(prompt, 0), 0u);
    EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
  }
}

TEST(Generate, SamplingRepeatsBySeedAndMode) {
  TinyLm lm;
  const std::string base = "generate --model " + lm.dir.string() +
                           " --prompt 'free software' --max-new-tokens 12 --ignore-eos "
                           "--temperature 1.5 --top-k 50 --top-p 0.95";
  const CliRun a = kiln_cli(base + " --seed 1"), b = kiln_cli(base + " --seed 1 --mode eager"),
               c = kiln_cli(base + " --seed 2");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(Generate, BadInputGetsClearErrors) {
  TinyLm lm;
  std::string long_prompt;
  for (int i = 0; i < 60; ++i) long_prompt += "license ";
  CliRun r = kiln_cli("generate --model " + lm.dir.string() + " --prompt '" + long_prompt + "'");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("more than the model's n_positions 48"), std::string::npos) << r.err;
  r = kiln_cli("generate --model " + lm.dir.string() + " --prompt 'a b' --max-new-tokens 100");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("more than the model's n_positions 48"), std::string::npos) << r.err;
  r = kiln_cli("generate --model " + kFixtures + "/predict/single --prompt hello");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("generate takes a language model (GPT2LMHeadModel)"), std::string::npos)
      << r.err;
  r = kiln_cli("generate --model " + kFixtures + "/gpt2_golden/tied --prompt hello");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("tokenizer.json"), std::string::npos) << r.err;
  r = kiln_cli("generate --model " + lm.dir.string() + " --prompt ''");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--prompt is empty"), std::string::npos) << r.err;
}

// A model whose vocab_size exceeds its tokenizer's: the sampled ids beyond
// the tokenizer have no text and are left out (transformers' decode skips
// them), and stderr says how many.
TEST(Generate, IdsBeyondTheTokenizerAreLeftOutOfTheText) {
  TinyLm lm(4800);
  const std::string prompt = "the GNU General Public License";
  const data::Tokenizer tok = data::Tokenizer::from_folder(lm.dir.string());
  const std::vector<int32_t> ids = tok.encode(prompt);
  const Array got = nn::generate(*nn::as_gpt2(*lm.model), lm.params,
                                 Array::from_vector(ids, {1, static_cast<int64_t>(ids.size())}),
                                 {.max_new_tokens = 20, .temperature = 1.0, .seed = 3});
  std::vector<int32_t> known;
  int64_t beyond = 0;
  for (int32_t id : got.to_vector<int32_t>()) {
    if (id < 1200)
      known.push_back(id);
    else
      ++beyond;
  }
  ASSERT_GT(beyond, 0) << "the draw has no id beyond the tokenizer: pick another seed";
  const CliRun r =
      kiln_cli("generate --model " + lm.dir.string() + " --prompt " + shell_quote(prompt) +
               " --max-new-tokens 20 --temperature 1 --seed 3 --ignore-eos");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, tok.decode(known) + "\n");
  EXPECT_NE(r.err.find(std::to_string(beyond) +
                       " generated ids are beyond the tokenizer's 1200 tokens (the model's "
                       "vocab_size is 4800)"),
            std::string::npos)
      << r.err;
}

// kiln eval of a language model on text: the library's held-out next-token
// loss, perplexity and accuracy, with the folder's tokenizer; --split train;
// LM flags for an image model and image data for an LM are errors.
TEST(Eval, ALanguageModelGivesTheLibrarysHeldOutLoss) {
  TinyLm lm;
  const fs::path cache = lm.dir.string() + "-cache";
  ::setenv("KILN_TOKEN_CACHE", cache.c_str(), 1);
  const std::string text = "/usr/share/common-licenses/GPL-3";
  train::TrainConfig cfg;
  cfg.model = lm.model;
  cfg.data = "text:" + text;
  cfg.seq_len = 24;
  cfg.tokenizer = lm.dir.string();
  const train::DataSplits splits = train::load_data(cfg);
  for (const char* split : {"test", "train"}) {
    SCOPED_TRACE(split);
    const auto& ds = std::string(split) == "train" ? splits.train : splits.eval;
    const train::EvalResult want =
        train::evaluate(lm.model, lm.params, {}, *ds, 8, nn::Layout::NCHW, true);
    const CliRun r = kiln_cli("eval --model " + lm.dir.string() + " --data text:" + text +
                              " --seq-len 24 --split " + split);
    ASSERT_EQ(r.status, 0) << r.err;
    char buf[64];
    std::snprintf(buf, sizeof buf, "loss %.4f (perplexity %.2f)", want.loss, std::exp(want.loss));
    EXPECT_NE(r.out.find(buf), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("on " + std::to_string(want.tokens) + " tokens"), std::string::npos)
        << r.out;
  }
  CliRun r = kiln_cli("eval --model " + kFixtures + "/predict/single --data text:" + text +
                      " --seq-len 24");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--seq-len goes with a language model"), std::string::npos) << r.err;
  r = kiln_cli("eval --model " + lm.dir.string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("is a language model; expected text:PATH or tokens:PATH"), std::string::npos)
      << r.err;
  ::unsetenv("KILN_TOKEN_CACHE");
  fs::remove_all(cache);
}

// kiln grad on input_ids and labels: transformers' loss and gradients.
TEST(Grad, ALanguageModelsBatchGivesTransformersGradients) {
  const std::string g = kFixtures + "/gpt2_golden/tied/";
  const std::string out =
      (fs::temp_directory_path() / ("kiln-grad-lm-" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  const CliRun r = kiln_cli("grad --config " + g + "config.json --weights " + g +
                            "model.safetensors --batch " + g + "batch.safetensors --out " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  const Params got = io::load_safetensors(out).tensors;
  const Params want = io::load_safetensors(g + "expected.safetensors").tensors;
  fs::remove(out);
  EXPECT_NEAR(got.at("loss").item<double>(), want.at("loss").item<double>(), 1e-5);
  EXPECT_LT(test_util::max_relative_error(got.at("logits"), want.at("logits")), 1e-5);
  int grads = 0;
  for (const auto& [n, a] : got)
    if (n.rfind("grad.", 0) == 0) {
      ++grads;
      EXPECT_LT(test_util::max_relative_error(a, want.at(n)), 1e-4) << n;
    }
  EXPECT_EQ(grads, 28);
}

}  // namespace
}  // namespace kiln
