// Golden parity with transformers' GPT2LMHeadModel (fixtures written by
// tools/golden/make_gpt2_golden.py): logits, the loss with -100 labels, every
// gradient of a tied and an untied model, 5 AdamW steps, greedy generation
// token for token; the KV cache against the full forward; sampling; the
// config; errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "../gpu_device.h"
#include "../test_util.h"
#include "kiln/gpt2.h"
#include "kiln/io.h"
#include "kiln/kiln.h"
#include "kiln/optim.h"

namespace kiln {
namespace {

using test_util::error_of;

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

double relative_error(const Array& a, const Array& b) {
  auto x = astype(a, DType::f64).to_vector<double>(), y = astype(b, DType::f64).to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

struct Golden {
  explicit Golden(const std::string& variant)
      : dir(std::string(KILN_FIXTURES_DIR) + "/gpt2_golden/" + variant + "/") {}
  std::string dir;
  nn::GPT2Config cfg =
      nn::GPT2Config::from_json(read_text(dir + "config.json"), dir + "config.json");
  nn::GPT2LMHeadModel model{cfg};
  Params weights = io::load_safetensors(dir + "model.safetensors").tensors;
  Params batch = io::load_safetensors(dir + "batch.safetensors").tensors;
  Params expected = io::load_safetensors(dir + "expected.safetensors").tensors;
  Array ids() const { return batch.at("input_ids"); }
  Array labels() const { return batch.at("labels"); }
};

class Gpt2Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Gpt2Golden, ConfigReadsAsTransformersWroteIt) {
  Golden g(GetParam());
  if (GetParam() == "tied") {
    EXPECT_TRUE(g.cfg.tie_word_embeddings);
    EXPECT_TRUE(g.cfg.scale_attn_by_inverse_layer_idx);
    EXPECT_EQ(g.cfg.activation_function, nn::Activation::GeluNew);
    EXPECT_EQ(g.cfg.inner(), 4 * g.cfg.n_embd);
  } else {
    EXPECT_FALSE(g.cfg.tie_word_embeddings);
    EXPECT_FALSE(g.cfg.scale_attn_weights);
    EXPECT_EQ(g.cfg.n_inner, 40);
    EXPECT_EQ(g.cfg.layer_norm_epsilon, 1e-6);
  }
  // Written and read back: the same config.
  const nn::GPT2Config back = nn::GPT2Config::from_json(g.cfg.to_json(), "round trip");
  EXPECT_EQ(back.to_json(), g.cfg.to_json());
  // The parameters transformers saved are exactly the model's.
  EXPECT_NO_THROW(g.model.check(g.weights, "fixture"));
  EXPECT_EQ(g.weights.size(), g.model.parameter_shapes().size());
}

TEST_P(Gpt2Golden, LogitsLossAndGradientsMatchTransformers) {
  Golden g(GetParam());
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused attention" : "eager attention");
    const nn::ModelOptions opt{.train = true, .fused_attention = fused};
    EXPECT_LT(relative_error(g.model.apply(g.weights, g.ids(), opt), g.expected.at("logits")),
              1e-5);
    auto [loss, grads] = value_and_grad([&](const Params& p) {
      return g.model.loss(g.model.apply(p, g.ids(), opt), g.labels());
    })(g.weights);
    const double want = g.expected.at("loss").item<double>();
    EXPECT_NEAR(loss.item<double>(), want, 1e-5 * want);
    ASSERT_EQ(grads.size(), g.weights.size());
    for (auto& [n, grad] : grads)
      EXPECT_LT(relative_error(grad, g.expected.at("grad." + n)), 1e-4) << n;
  }
}

TEST_P(Gpt2Golden, FiveAdamWStepsMatchTorchOptimAdamW) {
  Golden g(GetParam());
  optim::AdamW adamw({.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  Params params = g.weights;
  optim::State state = adamw.init(params);
  const auto want = g.expected.at("adamw_losses").to_vector<double>();
  ASSERT_EQ(want.size(), 5u);
  auto step = jit([&](const std::vector<Array>& in) {
    Params p;
    size_t i = 0;
    for (auto& [n, v] : g.weights) p.emplace(n, in[i++]);
    auto [loss, grads] = value_and_grad([&](const Params& q) {
      return g.model.loss(g.model.apply(q, g.ids(), {.train = true}), g.labels());
    })(p);
    std::vector<Array> out{loss};
    for (auto& [n, v] : grads) out.push_back(v);
    return out;
  });
  for (int s = 0; s < 5; ++s) {
    std::vector<Array> flat;
    for (auto& [n, v] : params) flat.push_back(v);
    const std::vector<Array> out = step(flat);
    Params grads;
    size_t i = 1;
    for (auto& [n, v] : params) grads.emplace(n, out[i++]);
    EXPECT_NEAR(out[0].item<double>(), want[s], 1e-5 * want[s]) << "step " << s;
    std::tie(params, state) = adamw.update(grads, state, params);
  }
}

// model.generate(do_sample=False), token for token, compiled on the KV cache
// and eagerly.
TEST_P(Gpt2Golden, GreedyGenerationEqualsTransformersGenerate) {
  Golden g(GetParam());
  const Array prompt = g.expected.at("prompt"), want = g.expected.at("generated");
  const int64_t n = want.shape()[1] - prompt.shape()[1];
  for (bool compiled : {true, false}) {
    SCOPED_TRACE(compiled ? "compiled" : "eager");
    const Array got =
        nn::generate(g.model, g.weights, prompt, {.max_new_tokens = n, .compiled = compiled});
    EXPECT_EQ(got.dtype(), prompt.dtype());
    EXPECT_EQ(got.shape(), want.shape());
    EXPECT_EQ(astype(got, DType::i64).to_vector<int64_t>(),
              astype(want, DType::i64).to_vector<int64_t>());
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, Gpt2Golden, ::testing::Values("tied", "untied"),
                         [](const auto& info) { return info.param; });

// The cached decode gives the full forward's logits: a prompt run at once,
// then token after token, each against the cache; under jit the cache is
// written in place and one program serves every position.
void expect_cache_matches_full_forward(Device d) {
  Golden g("tied");
  Params w;
  for (auto& [n, v] : g.weights) w.emplace(n, v.to(d));
  const Array ids = g.ids().to(d);
  const int64_t b = ids.shape()[0], t = ids.shape()[1], v = g.cfg.vocab_size;
  const Array whole = g.model.apply(w, ids);
  nn::KVCache cache = g.model.empty_cache(b, t + 2, d);
  const int64_t p = 4;
  const Array first =
      g.model.apply_cached(w, slice(ids, {0, 0}, {b, p}), cache, zeros({}, DType::i32, d));
  EXPECT_LT(relative_error(first, slice(whole, {0, 0, 0}, {b, p, v})), 1e-5);
  const size_t layers = cache.keys.size();
  int traces = 0;
  Jitted step = jit(
      [&](const std::vector<Array>& in) {
        ++traces;
        nn::KVCache c;
        for (size_t l = 0; l < layers; ++l) {
          c.keys.push_back(in[2 + l]);
          c.values.push_back(in[2 + layers + l]);
        }
        std::vector<Array> out{g.model.apply_cached(w, in[0], c, in[1])};
        for (Array& a : c.keys) out.push_back(a);
        for (Array& a : c.values) out.push_back(a);
        return out;
      },
      {.donate = {2, 3, 4, 5}});
  const void* address = cache.keys[0].raw();
  for (int64_t i = p; i < t; ++i) {
    SCOPED_TRACE("position " + std::to_string(i));
    std::vector<Array> in{slice(ids, {0, i}, {b, i + 1}),
                          full({}, static_cast<double>(i), DType::i32, d)};
    for (Array& a : cache.keys) in.push_back(a);
    for (Array& a : cache.values) in.push_back(a);
    std::vector<Array> out = step(in);
    cache.keys = {out[1], out[2]};
    cache.values = {out[3], out[4]};
    EXPECT_EQ(cache.keys[0].raw(), address) << "the cache moved";
    EXPECT_LT(relative_error(out[0], slice(whole, {0, i, 0}, {b, i + 1, v})), 1e-5);
  }
  EXPECT_EQ(traces, 1);
}

TEST(Gpt2, KvCacheDecodeMatchesTheFullForward) {
  expect_cache_matches_full_forward(Device::cpu());
  expect_cache_matches_full_forward(Device::ref());
}

TEST(Gpt2, GpuKvCacheDecodeMatchesTheFullForward) {
  KILN_REQUIRE_GPU();
  expect_cache_matches_full_forward(test_gpu());
}

TEST(Gpt2, GpuLogitsAndGradientsMatchTransformers) {
  KILN_REQUIRE_GPU();
  Golden g("tied");
  const Device d = test_gpu();
  Params w;
  for (auto& [n, v] : g.weights) w.emplace(n, v.to(d));
  const Array ids = g.ids().to(d), labels = g.labels().to(d);
  EXPECT_LT(relative_error(g.model.apply(w, ids).to(Device::cpu()), g.expected.at("logits")), 1e-5);
  auto [loss, grads] = value_and_grad(
      [&](const Params& p) { return g.model.loss(g.model.apply(p, ids), labels); })(w);
  EXPECT_NEAR(loss.to(Device::cpu()).item<double>(), g.expected.at("loss").item<double>(), 1e-4);
  for (auto& [n, grad] : grads)
    EXPECT_LT(relative_error(grad.to(Device::cpu()), g.expected.at("grad." + n)), 1e-4) << n;
}

// bf16 mixed precision stays near f32 (the matmuls' operands and the
// attention's q, k, v rounded to bf16).
TEST(Gpt2, Bf16MixedPrecisionStaysNearF32) {
  Golden g("tied");
  const nn::ModelOptions bf{.train = true, .matmul_dtype = DType::bf16};
  const Array loss = g.model.loss(g.model.apply(g.weights, g.ids(), bf), g.labels());
  EXPECT_NEAR(loss.item<double>(), g.expected.at("loss").item<double>(), 2e-2);
  const Array greedy = nn::generate(g.model, g.weights, g.expected.at("prompt"),
                                    {.max_new_tokens = 4, .matmul_dtype = DType::bf16});
  EXPECT_EQ(greedy.shape(), (Shape{2, 9}));
  // The matmul weights rounded once beforehand (the head as lm_head.weight
  // of this tied model): the same cached logits and tokens, compiled and
  // eagerly; f32 leaves the parameters as they are.
  const Params prepared = g.model.inference_params(g.weights, DType::bf16);
  EXPECT_EQ(prepared.at("lm_head.weight").dtype(), DType::bf16);
  EXPECT_EQ(prepared.at("transformer.h.1.mlp.c_fc.weight").dtype(), DType::bf16);
  EXPECT_EQ(prepared.at("transformer.wte.weight").dtype(), DType::f32);
  EXPECT_EQ(prepared.at("transformer.h.0.ln_1.weight").dtype(), DType::f32);
  EXPECT_EQ(g.model.inference_params(g.weights, DType::f32).count("lm_head.weight"), 0u);
  const Array ids = g.ids();
  auto cached = [&](const Params& w) {
    nn::KVCache c = g.model.empty_cache(ids.shape()[0], ids.shape()[1], Device::cpu(), DType::bf16);
    return g.model.apply_cached(w, ids, c, zeros({}, DType::i32), DType::bf16);
  };
  EXPECT_EQ(relative_error(cached(prepared), cached(g.weights)), 0.0);
  auto tokens = [](const Array& a) { return astype(a, DType::i64).to_vector<int64_t>(); };
  for (bool compiled : {true, false})
    EXPECT_EQ(tokens(nn::generate(
                  g.model, prepared, g.expected.at("prompt"),
                  {.max_new_tokens = 4, .matmul_dtype = DType::bf16, .compiled = compiled})),
              tokens(greedy));
}

// Sampling: the same seed draws the same tokens compiled and eagerly; another
// seed others; top_k = 1 is greedy; temperature and top_p narrow the draws.
TEST(Gpt2, SamplingIsReproducibleAcrossModesAndSeeds) {
  Golden g("tied");
  const Array prompt = g.expected.at("prompt");
  auto run = [&](nn::GenerateOptions o) {
    o.max_new_tokens = 10;
    return astype(nn::generate(g.model, g.weights, prompt, o), DType::i64).to_vector<int64_t>();
  };
  const auto a = run({.temperature = 1.0, .seed = 3});
  EXPECT_EQ(a, run({.temperature = 1.0, .seed = 3, .compiled = false}));
  EXPECT_NE(a, run({.temperature = 1.0, .seed = 4}));
  EXPECT_EQ(run({.temperature = 1.0, .top_k = 1, .seed = 5}), run({}));
  EXPECT_EQ(run({.temperature = 0.7, .top_p = 1e-6, .seed = 6}), run({}));
  const auto k = run({.temperature = 2.0, .top_k = 5, .top_p = 0.9, .seed = 7});
  EXPECT_EQ(k, run({.temperature = 2.0, .top_k = 5, .top_p = 0.9, .seed = 7, .compiled = false}));
}

// A sequence that reaches eos_token_id stops there; the batch's finished
// sequences are padded until every one has.
TEST(Gpt2, GenerationStopsAtEos) {
  Golden g("tied");
  const Array prompt = g.expected.at("prompt");
  const auto greedy = astype(g.expected.at("generated"), DType::i64).to_vector<int64_t>();
  // Row 0 of the fixture produces 6 after 5 + 1 tokens ([57, 49, 93, 5, 50, 50, 6, ...]).
  const Array got = nn::generate(g.model, g.weights, prompt,
                                 {.max_new_tokens = 12, .eos_token_id = 6, .pad_token_id = 0});
  const auto v = astype(got, DType::i64).to_vector<int64_t>();
  const int64_t len = got.shape()[1];
  ASSERT_EQ(v[6], 6);
  for (int64_t j = 7; j < len; ++j) EXPECT_EQ(v[j], 0) << "row 0 padded at " << j;
  for (int64_t j = 0; j < len; ++j) EXPECT_EQ(v[len + j], greedy[17 + j]) << "row 1 at " << j;
}

TEST(Gpt2, BadInputGetsClearErrors) {
  Golden g("tied");
  const Array long_prompt = zeros({1, 41}, DType::i64);
  EXPECT_NE(error_of([&] {
              nn::generate(g.model, g.weights, long_prompt);
            }).find("the prompt has 41 tokens, more than the model's n_positions 40"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              nn::generate(g.model, g.weights, zeros({1, 30}, DType::i64), {.max_new_tokens = 11});
            }).find("make 41, more than the model's n_positions 40"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              g.model.apply(g.weights, zeros({1, 41}, DType::i64));
            }).find("41 tokens, more than the model's n_positions 40"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              nn::generate(g.model, g.weights, full({1, 3}, 97, DType::i64));
            }).find("token 97, outside the vocabulary [0, 97)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              g.model.apply(g.weights, zeros({1, 3}, DType::f32));
            }).find("input_ids must be integers"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              g.model.loss(zeros({1, 3, 97}), zeros({1, 2}, DType::i64));
            }).find("labels must be integers [batch, tokens]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              nn::GPT2Config::from_json(R"({"n_embd": 30, "n_head": 4})", "c.json");
            }).find("n_embd 30 is not a multiple of n_head 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              nn::GPT2Config::from_json(R"({"activation_function": "gelu_newer"})", "c.json");
            }).find("c.json: field 'activation_function' is \"gelu_newer\", expected one of"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              nn::GPT2Config::from_json(R"({"model_type": "vit"})", "c.json");
            }).find("field 'model_type' is \"vit\", expected \"gpt2\""),
            std::string::npos);
  Params missing = g.weights;
  missing.erase("transformer.h.1.mlp.c_fc.bias");
  EXPECT_NE(error_of([&] {
              g.model.check(missing, "w.safetensors");
            }).find("[w.safetensors] missing parameter 'transformer.h.1.mlp.c_fc.bias'"),
            std::string::npos);
}

// transformers' init: weights normal(0.02), the residual projections
// normal(0.02 / √(2·n_layer)), zero biases, unit LayerNorms.
TEST(Gpt2, InitFollowsTransformers) {
  const nn::GPT2Config c = nn::GPT2Config::preset("gpt2-tiny");
  const nn::GPT2LMHeadModel m(c);
  const Params p = m.init(random::Key(1));
  auto stddev = [&](const std::string& n) {
    const auto v = p.at(n).to_vector<double>();
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  EXPECT_NEAR(stddev("transformer.wte.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("transformer.h.0.attn.c_attn.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("transformer.h.3.mlp.c_proj.weight"), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_NEAR(stddev("transformer.h.2.attn.c_proj.weight"), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_EQ(stddev("transformer.h.0.attn.c_attn.bias"), 0.0);
  EXPECT_EQ(p.at("transformer.ln_f.weight").to_vector<float>(), std::vector<float>(128, 1.0f));
  EXPECT_EQ(p.count("lm_head.weight"), 0u);
  EXPECT_EQ(p.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{128, 384}));
  // The 124M model: 124,439,808 parameters, as transformers counts them.
  int64_t count = 0;
  for (const auto& [n, s] : nn::GPT2LMHeadModel(nn::GPT2Config::preset("gpt2")).parameter_shapes())
    count += numel(s);
  EXPECT_EQ(count, 124439808);
}

}  // namespace
}  // namespace kiln
