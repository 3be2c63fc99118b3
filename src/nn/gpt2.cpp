// kiln nn: GPT2LMHeadModel, parameter for parameter as transformers builds it
// (modeling_gpt2.py): its config, forward, loss and KV-cache decoding.
#include "kiln/gpt2.h"

#include <cmath>
#include <limits>

#include "config_json.h"
#include "kiln/compiler.h"

namespace kiln::nn {
namespace {

// transformers' Conv1D (pytorch_utils.py): weight [in, out], y = x · W + b.
struct Conv1D {
  std::string name;
  int64_t in = 0, out = 0;
  Init weight_init = Init::normal(0.02);
  void declare(Decls& d) const {
    d.push_back({join_name(name, "weight"), {in, out}, weight_init});
    d.push_back({join_name(name, "bias"), {out}, Init::zeros()});
  }
  Array operator()(Scope& s, const Array& x) const {
    return mixed_matmul(x, s.param(join_name(name, "weight")), {}, s.matmul_dtype()) +
           s.param(join_name(name, "bias"));
  }
};

// A bias [1, 1, T, S] that lets query i (at position `first` + i) see key j
// where j <= first + i: 0 there, -inf elsewhere. `first` an i32 scalar array.
Array causal_bias(int64_t t, int64_t s, const Array& first, Device device) {
  const Array rows = reshape(arange(t, DType::i32, device) + first, {t, 1});
  const Array cols = reshape(arange(s, DType::i32, device), {1, s});
  const Array seen = less_equal(cols, rows);
  return reshape(where(seen, zeros({}, DType::f32, device),
                       full({}, -std::numeric_limits<double>::infinity(), DType::f32, device)),
                 {1, 1, t, s});
}

// One transformer block, transformer.h.{l}.
struct Block {
  const GPT2Config* cfg = nullptr;
  int64_t layer = 0;
  LayerNorm ln_1, ln_2;
  Conv1D c_attn, attn_proj, c_fc, mlp_proj;
  Dropout attn_dropout, resid_dropout;

  Block(const GPT2Config& c, int64_t l) : cfg(&c), layer(l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    const Init w = Init::normal(c.initializer_range);
    // GPT-2's scaled init of the residual projections (_init_weights).
    const Init proj =
        Init::normal(c.initializer_range / std::sqrt(2.0 * static_cast<double>(c.n_layer)));
    ln_1 = {p + "ln_1", c.n_embd, c.layer_norm_epsilon};
    c_attn = {p + "attn.c_attn", c.n_embd, 3 * c.n_embd, w};
    attn_proj = {p + "attn.c_proj", c.n_embd, c.n_embd, proj};
    ln_2 = {p + "ln_2", c.n_embd, c.layer_norm_epsilon};
    c_fc = {p + "mlp.c_fc", c.n_embd, c.inner(), w};
    mlp_proj = {p + "mlp.c_proj", c.inner(), c.n_embd, proj};
    attn_dropout = {c.attn_pdrop};
    resid_dropout = {c.resid_pdrop};
  }
  void declare(Decls& d) const {
    ln_1.declare(d);
    c_attn.declare(d);
    attn_proj.declare(d);
    ln_2.declare(d);
    c_fc.declare(d);
    mlp_proj.declare(d);
  }

  // x [B, T, E] -> q, k, v [B, T, H, D], in dt where given: the projection
  // cast once before it is split (the cast then fuses into the projection's
  // GEMM, and the split and its gradient move half the bytes).
  std::vector<Array> qkv(Scope& s, const Array& x, std::optional<DType> dt = std::nullopt) const {
    const int64_t b = x.shape()[0], t = x.shape()[1], h = cfg->n_head, d = cfg->head_dim();
    Array packed = reshape(c_attn(s, ln_1(s, x)), {b, t, 3, h, d});
    if (dt) packed = astype(packed, *dt);
    std::vector<Array> out;
    for (int64_t i = 0; i < 3; ++i)
      out.push_back(reshape(slice(packed, {0, 0, i, 0, 0}, {b, t, i + 1, h, d}), {b, t, h, d}));
    return out;
  }

  // bf16 mixed precision runs the fused attention on bf16 q, k and v where
  // the backend has that kernel.
  static bool bf16_attention(const Scope& s, const Array& q) {
    return s.matmul_dtype() == DType::bf16 && sdpa_runs_in(q.device(), DType::bf16, true);
  }

  // The rest of the block from the attention's context [B, T, H, D].
  Array finish(Scope& s, const Array& x, const Array& ctx) const {
    const int64_t b = x.shape()[0], t = x.shape()[1];
    Array c = reshape(ctx, {b, t, cfg->n_embd});
    if (s.matmul_dtype() == DType::f32 && c.dtype() != DType::f32) c = astype(c, DType::f32);
    Array h = x + resid_dropout(s, attn_proj(s, c));
    Array pre = c_fc(s, ln_2(s, h));
    if (s.matmul_dtype() == DType::bf16 && !s.options().inference) pre = astype(pre, DType::bf16);
    return h + resid_dropout(s, mlp_proj(s, activate(cfg->activation_function, pre)));
  }

  Array operator()(Scope& s, const Array& x, const std::optional<Array>& keep) const {
    const bool fused = s.options().fused_attention && !(s.dropping() && cfg->attn_pdrop > 0);
    const std::vector<Array> q =
        qkv(s, x, fused && bf16_attention(s, x) ? std::optional(DType::bf16) : std::nullopt);
    const double scale = cfg->attention_scale(layer);
    Array ctx;
    if (fused) {
      s.next_site();  // the probabilities' dropout site, unused here (as in the eager form)
      ctx = attention(q[0], q[1], q[2], {.scale = scale, .causal = true, .key_padding_mask = keep});
    } else {
      // transformers' eager attention: the T×T probabilities materialized.
      const int64_t b = x.shape()[0], t = x.shape()[1];
      auto heads = [](const Array& a) { return transpose(a, {0, 2, 1, 3}); };  // [B, H, T, D]
      Array scores =
          mixed_matmul(heads(q[0]), heads(q[1]), {.transpose_b = true}, s.matmul_dtype()) * scale;
      // Masked scores at the lowest float, as transformers' eager attention
      // (a query that sees no key then spreads over all of them: only a
      // padded query can, and its output is ignored).
      Array seen = less_equal(reshape(arange(t, DType::i32, x.device()), {1, t}),
                              reshape(arange(t, DType::i32, x.device()), {t, 1}));
      seen = reshape(seen, {1, 1, t, t});
      if (keep) seen = logical_and(seen, reshape(*keep, {b, 1, 1, t}));
      scores = where(seen, scores,
                     full({}, std::numeric_limits<float>::lowest(), DType::f32, x.device()));
      const Array probs = attn_dropout(s, softmax(scores, -1));
      ctx = heads(mixed_matmul(probs, heads(q[2]), {}, s.matmul_dtype()));
    }
    return finish(s, x, ctx);
  }
};

std::vector<Block> blocks_of(const GPT2Config& c) {
  std::vector<Block> out;
  for (int64_t l = 0; l < c.n_layer; ++l) out.emplace_back(c, l);
  return out;
}

Decls declarations(const GPT2Config& c) {
  Decls d;
  const Init w = Init::normal(c.initializer_range);
  Embedding{"transformer.wte", c.vocab_size, c.n_embd, w}.declare(d);
  Embedding{"transformer.wpe", c.n_positions, c.n_embd, w}.declare(d);
  for (const Block& b : blocks_of(c)) b.declare(d);
  LayerNorm{"transformer.ln_f", c.n_embd, c.layer_norm_epsilon}.declare(d);
  if (!c.tie_word_embeddings) d.push_back({"lm_head.weight", {c.vocab_size, c.n_embd}, w});
  return d;
}

void check_ids(const GPT2Config& c, const Array& ids, int64_t first_position, const char* what) {
  if (!is_integral(ids.dtype()) || ids.ndim() != 2)
    fail("gpt2", std::string(what) + " must be integers [batch, tokens], got " +
                     name_of(ids.dtype()) + " " + str(ids.shape()));
  if (ids.shape()[1] < 1) fail("gpt2", std::string(what) + " has no tokens");
  if (first_position + ids.shape()[1] > c.n_positions)
    fail("gpt2", std::string(what) + ": " + std::to_string(first_position + ids.shape()[1]) +
                     " tokens, more than the model's n_positions " + std::to_string(c.n_positions));
}

// The logits of the final hidden states: ln_f, then the head (wte's
// transpose when tied).
// The logits of the last hidden states; `prepared`: the parameters hold the
// head's weight as "lm_head.weight" also when it is tied (inference_params).
Array head(Scope& s, const GPT2Config& c, const Array& h, bool prepared = false) {
  const Array x = LayerNorm{"transformer.ln_f", c.n_embd, c.layer_norm_epsilon}(s, h);
  const Array& w =
      s.param(c.tie_word_embeddings && !prepared ? "transformer.wte.weight" : "lm_head.weight");
  return mixed_matmul(x, w, {.transpose_b = true}, s.matmul_dtype());
}

}  // namespace

const std::vector<std::string>& GPT2Config::preset_names() {
  static const std::vector<std::string> names = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
                                                 "gpt2-tiny"};
  return names;
}

GPT2Config GPT2Config::preset(const std::string& name) {
  GPT2Config c;
  if (name == "gpt2") {
  } else if (name == "gpt2-medium") {
    c.n_embd = 1024, c.n_layer = 24, c.n_head = 16;
  } else if (name == "gpt2-large") {
    c.n_embd = 1280, c.n_layer = 36, c.n_head = 20;
  } else if (name == "gpt2-xl") {
    c.n_embd = 1600, c.n_layer = 48, c.n_head = 25;
  } else if (name == "gpt2-tiny") {
    c.n_embd = 128, c.n_layer = 4, c.n_head = 4, c.n_positions = 256;
  } else {
    fail("model", "unknown preset '" + name +
                      "', expected one of gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-tiny");
  }
  return c;
}

double GPT2Config::attention_scale(int64_t layer) const {
  double scale = scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(head_dim())) : 1.0;
  if (scale_attn_by_inverse_layer_idx) scale /= static_cast<double>(layer + 1);
  return scale;
}

void GPT2Config::validate(const std::string& origin) const {
  auto positive = [&](int64_t v, const char* field) {
    if (v <= 0) fail(origin, std::string(field) + " must be positive, got " + std::to_string(v));
  };
  auto at_most = [&](int64_t v, int64_t limit, const char* field) {
    if (v > limit)
      fail(origin, std::string(field) + " is " + std::to_string(v) + ", expected at most " +
                       std::to_string(limit));
  };
  positive(vocab_size, "vocab_size");
  positive(n_positions, "n_positions");
  positive(n_embd, "n_embd");
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  if (n_inner < 0) fail(origin, "n_inner must be positive or null, got " + std::to_string(n_inner));
  constexpr int64_t kMaxSize = int64_t{1} << 20, kMaxLayers = 4096;
  at_most(vocab_size, int64_t{1} << 24, "vocab_size");
  at_most(n_positions, kMaxSize, "n_positions");
  at_most(n_embd, kMaxSize, "n_embd");
  at_most(n_layer, kMaxLayers, "n_layer");
  at_most(n_head, kMaxSize, "n_head");
  at_most(n_inner, kMaxSize, "n_inner");
  if (n_embd % n_head != 0)
    fail(origin, "n_embd " + std::to_string(n_embd) + " is not a multiple of n_head " +
                     std::to_string(n_head));
  auto probability = [&](double v, const char* field) {
    if (!(v >= 0 && v <= 1))
      fail(origin, std::string(field) + " must lie in [0, 1], got " + std::to_string(v));
  };
  probability(resid_pdrop, "resid_pdrop");
  probability(embd_pdrop, "embd_pdrop");
  probability(attn_pdrop, "attn_pdrop");
  if (!(initializer_range > 0)) fail(origin, "initializer_range must be positive");
  if (!(layer_norm_epsilon >= 0)) fail(origin, "layer_norm_epsilon must be >= 0");
  for (auto [v, field] : {std::pair{bos_token_id, "bos_token_id"}, {eos_token_id, "eos_token_id"}})
    if (v < -1 || v >= vocab_size)
      fail(origin, std::string(field) + " is " + std::to_string(v) +
                       ", expected a token id below " + "vocab_size " + std::to_string(vocab_size));
}

double GPT2Config::train_flops_per_token(int64_t seq_len) const {
  const double e = static_cast<double>(n_embd), l = static_cast<double>(n_layer);
  const double per_layer = e * 3 * e + e * e + 2 * e * static_cast<double>(inner()) +
                           static_cast<double>(seq_len) * e;  // scores and sums: T·E each, halved
  const double forward_macs = l * per_layer + e * static_cast<double>(vocab_size);
  return 3.0 * 2.0 * forward_macs;
}

GPT2Config GPT2Config::from_json(std::string_view text, const std::string& path) {
  using namespace config_json;
  const json j = parse_object(text, path);
  const BadField bad = bad_field(path);
  expect_model_type(j, bad, "gpt2");
  GPT2Config c;
  integer(j, bad, "vocab_size", c.vocab_size);
  integer(j, bad, "n_positions", c.n_positions);
  integer(j, bad, "n_embd", c.n_embd);
  integer(j, bad, "n_layer", c.n_layer);
  integer(j, bad, "n_head", c.n_head);
  if (j.contains("n_inner") && !j["n_inner"].is_null()) integer(j, bad, "n_inner", c.n_inner);
  if (j.contains("activation_function")) {
    const json& a = j["activation_function"];
    const auto act = a.is_string() ? activation_from_name(a.get<std::string>()) : std::nullopt;
    if (!act) {
      std::string names;
      for (const std::string& n : activation_names()) names += (names.empty() ? "" : ", ") + n;
      bad("activation_function", "is " + a.dump() + ", expected one of " + names);
    }
    c.activation_function = *act;
  }
  real(j, bad, "resid_pdrop", c.resid_pdrop);
  real(j, bad, "embd_pdrop", c.embd_pdrop);
  real(j, bad, "attn_pdrop", c.attn_pdrop);
  real(j, bad, "layer_norm_epsilon", c.layer_norm_epsilon);
  real(j, bad, "initializer_range", c.initializer_range);
  boolean(j, bad, "scale_attn_weights", c.scale_attn_weights);
  boolean(j, bad, "scale_attn_by_inverse_layer_idx", c.scale_attn_by_inverse_layer_idx);
  boolean(j, bad, "reorder_and_upcast_attn", c.reorder_and_upcast_attn);
  boolean(j, bad, "tie_word_embeddings", c.tie_word_embeddings);
  for (auto [field, dst] :
       {std::pair{"bos_token_id", &c.bos_token_id}, {"eos_token_id", &c.eos_token_id}}) {
    if (j.contains(field) && j[field].is_null())
      *dst = -1;
    else
      integer(j, bad, field, *dst);
  }
  c.validate("config " + path);
  return c;
}

std::string GPT2Config::to_json() const {
  using config_json::json;
  json j = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", vocab_size},
            {"n_positions", n_positions},
            {"n_embd", n_embd},
            {"n_layer", n_layer},
            {"n_head", n_head},
            {"n_inner", n_inner > 0 ? json(n_inner) : json(nullptr)},
            {"activation_function", activation_name(activation_function)},
            {"resid_pdrop", resid_pdrop},
            {"embd_pdrop", embd_pdrop},
            {"attn_pdrop", attn_pdrop},
            {"layer_norm_epsilon", layer_norm_epsilon},
            {"initializer_range", initializer_range},
            {"scale_attn_weights", scale_attn_weights},
            {"scale_attn_by_inverse_layer_idx", scale_attn_by_inverse_layer_idx},
            {"reorder_and_upcast_attn", reorder_and_upcast_attn},
            {"tie_word_embeddings", tie_word_embeddings},
            {"bos_token_id", bos_token_id >= 0 ? json(bos_token_id) : json(nullptr)},
            {"eos_token_id", eos_token_id >= 0 ? json(eos_token_id) : json(nullptr)},
            {"use_cache", true},
            {"torch_dtype", "float32"}};
  return j.dump(2) + "\n";
}

GPT2LMHeadModel::GPT2LMHeadModel(GPT2Config cfg) : cfg_(std::move(cfg)) {
  cfg_.validate();
}

Params GPT2LMHeadModel::init(const random::Key& key, Device device) const {
  return init_params(declarations(cfg_), key, device);
}

std::vector<std::pair<std::string, Shape>> GPT2LMHeadModel::parameter_shapes() const {
  return shapes_of(declarations(cfg_));
}

void GPT2LMHeadModel::check(const Params& params, const std::string& origin) const {
  const auto shapes = parameter_shapes();
  for (const auto& [name, shape] : shapes) {
    auto it = params.find(name);
    if (it == params.end()) fail(origin, "missing parameter '" + name + "'");
    if (it->second.shape() != shape)
      fail(origin, "parameter '" + name + "' has shape " + str(it->second.shape()) + ", expected " +
                       str(shape));
  }
  if (params.size() != shapes.size())
    for (const auto& [name, value] : params) {
      bool known = false;
      for (const auto& [n, s] : shapes) known = known || n == name;
      if (!known) fail(origin, "unexpected parameter '" + name + "' for GPT2LMHeadModel");
    }
}

Array GPT2LMHeadModel::apply(const Params& params, const Array& input_ids, const ModelOptions& opt,
                             const Array& attention_mask) const {
  check_ids(cfg_, input_ids, 0, "input_ids");
  const int64_t t = input_ids.shape()[1];
  std::optional<Array> keep;
  if (attention_mask.valid()) {
    if (attention_mask.shape() != input_ids.shape())
      fail("gpt2", "attention_mask " + str(attention_mask.shape()) + ", expected input_ids' " +
                       str(input_ids.shape()));
    keep = attention_mask.dtype() == DType::bool_
               ? attention_mask
               : not_equal(attention_mask, scalar_like(attention_mask, 0.0));
  }
  Scope s(params, {}, opt, "gpt2");
  const Device dev = input_ids.device();
  const Array pos = arange(t, DType::i32, dev);
  Array h = take(s.param("transformer.wte.weight"), input_ids, 0) +
            reshape(take(s.param("transformer.wpe.weight"), pos, 0), {1, t, cfg_.n_embd});
  h = Dropout{cfg_.embd_pdrop}(s, h);
  for (const Block& block : blocks_of(cfg_)) h = block(s, h, keep);
  return head(s, cfg_, h);
}

Array GPT2LMHeadModel::loss(const Array& logits, const Array& labels) const {
  if (logits.ndim() != 3 || logits.shape()[2] != cfg_.vocab_size)
    fail("gpt2", "logits " + str(logits.shape()) + ", expected [batch, tokens, " +
                     std::to_string(cfg_.vocab_size) + "]");
  if (!is_integral(labels.dtype()) || labels.shape() != Shape{logits.shape()[0], logits.shape()[1]})
    fail("gpt2", "labels must be integers [batch, tokens] " +
                     str(Shape{logits.shape()[0], logits.shape()[1]}) + ", got " +
                     name_of(labels.dtype()) + " " + str(labels.shape()));
  const int64_t b = logits.shape()[0], t = logits.shape()[1], v = logits.shape()[2];
  if (t < 2) fail("gpt2", "the loss needs at least 2 tokens (each predicts the next), got 1");
  // Position t predicts label t + 1: the labels moved one to the left and
  // the last position ignored, rather than a slice of the logits (a copy of
  // [B, T, V]: 0.55 s of GPT-2 124M's step at 4 x 1024).
  (void)v;
  const Array lb = concatenate(
      {slice(labels, {0, 1}, {b, t}), full({b, 1}, -100, labels.dtype(), labels.device())}, 1);
  const Array keep = not_equal(lb, scalar_like(lb, -100));
  const Array safe = where(keep, lb, scalar_like(lb, 0));
  const Array weight = astype(keep, DType::f32);
  return sum(softmax_cross_entropy(astype(logits, DType::f32), safe) * weight) / sum(weight);
}

KVCache GPT2LMHeadModel::empty_cache(int64_t batch, int64_t capacity, Device device,
                                     DType dtype) const {
  if (capacity < 1 || capacity > cfg_.n_positions)
    fail("gpt2", "a KV cache of " + std::to_string(capacity) + " positions, expected 1 ... " +
                     std::to_string(cfg_.n_positions) + " (n_positions)");
  KVCache c;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    c.keys.push_back(zeros({batch, capacity, cfg_.n_head, cfg_.head_dim()}, dtype, device));
    c.values.push_back(zeros({batch, capacity, cfg_.n_head, cfg_.head_dim()}, dtype, device));
  }
  return c;
}

Array GPT2LMHeadModel::apply_cached(const Params& params, const Array& input_ids, KVCache& cache,
                                    const Array& position, DType matmul_dtype) const {
  check_ids(cfg_, input_ids, 0, "input_ids");
  const int64_t t = input_ids.shape()[1], cap = cache.capacity();
  if (static_cast<int64_t>(cache.keys.size()) != cfg_.n_layer ||
      cache.values.size() != cache.keys.size())
    fail("gpt2", "a KV cache of " + std::to_string(cache.keys.size()) + " layers, expected " +
                     std::to_string(cfg_.n_layer));
  if (t > cap) fail("gpt2", std::to_string(t) + " tokens for a KV cache of " + std::to_string(cap));
  if (position.ndim() != 0 || !is_integral(position.dtype()))
    fail("gpt2", "position must be an integer scalar array, got " +
                     std::string(name_of(position.dtype())) + " " + str(position.shape()));
  Scope s(params, {}, {.matmul_dtype = matmul_dtype, .inference = true}, "gpt2");
  const Device dev = input_ids.device();
  const Array first = astype(position, DType::i32);
  const Array pos = arange(t, DType::i32, dev) + first;
  Array h = take(s.param("transformer.wte.weight"), input_ids, 0) +
            reshape(take(s.param("transformer.wpe.weight"), pos, 0), {1, t, cfg_.n_embd});
  const Array zero = zeros({1}, DType::i32, dev);
  const Array starts = concatenate({zero, reshape(first, {1}), zero, zero}, 0);
  const Array bias = causal_bias(t, cap, first, dev);
  const DType kv = cache.keys[0].dtype();
  for (const Block& block : blocks_of(cfg_)) {
    std::vector<Array> q = block.qkv(s, h);
    const size_t l = static_cast<size_t>(block.layer);
    cache.keys[l] = dynamic_update_slice(cache.keys[l], astype(q[1], kv), starts);
    cache.values[l] = dynamic_update_slice(cache.values[l], astype(q[2], kv), starts);
    const Array ctx = attention(astype(q[0], kv), cache.keys[l], cache.values[l],
                                {.scale = cfg_.attention_scale(block.layer), .bias = bias});
    h = block.finish(s, h, ctx);
  }
  return head(s, cfg_, h, params.count("lm_head.weight") > 0);
}

Params GPT2LMHeadModel::inference_params(const Params& params, DType dtype) const {
  if (dtype == DType::f32) return params;
  Params out = params;
  auto round = [&](const std::string& name) {
    auto it = params.find(name);
    if (it == params.end()) fail("gpt2", "the parameters lack " + name);
    return astype(it->second, dtype);
  };
  for (const Block& block : blocks_of(cfg_))
    for (const Conv1D* c : {&block.c_attn, &block.attn_proj, &block.c_fc, &block.mlp_proj}) {
      const std::string w = join_name(c->name, "weight");
      out[w] = round(w);
    }
  auto head = params.find("lm_head.weight");
  if (!(head != params.end() && head->second.dtype() == dtype))
    out["lm_head.weight"] =
        round(cfg_.tie_word_embeddings ? "transformer.wte.weight" : "lm_head.weight");
  return out;
}

namespace {

// The next token of each sequence from the last logits [B, V]: argmax, or a
// draw from the warped distribution (transformers' order: temperature,
// top-k, top-p).
Array choose(const Array& logits, const GenerateOptions& o, const random::Key& key) {
  if (o.temperature == 0) return argmax(logits, -1);
  const int64_t v = logits.shape()[1];
  const Array lowest =
      full({}, -std::numeric_limits<double>::infinity(), DType::f32, logits.device());
  Array l = logits / o.temperature;
  if (o.top_k > 0 && o.top_k < v) {
    // Keep the scores no lower than the k-th highest (ties at it kept).
    const Array kth = slice(sort(l, -1, true), {0, o.top_k - 1}, {logits.shape()[0], o.top_k});
    l = where(less(l, kth), lowest, l);
  }
  if (o.top_p < 1) {
    // Keep the smallest set of the most likely tokens whose probability
    // reaches top_p (at least one): a sorted token stays while the mass
    // before it is below top_p.
    const Array sorted = sort(l, -1, true);
    const Array p = softmax(sorted, -1);
    const Array before = cumsum(p, -1) - p;
    const Array kept = less(before, scalar_like(before, o.top_p));
    const Array floor =
        min(where(kept, sorted,
                  full({}, std::numeric_limits<double>::infinity(), DType::f32, logits.device())),
            {-1}, true);
    l = where(less(l, floor), lowest, l);
  }
  return random::categorical(key, l, -1);
}

}  // namespace

Array generate(const GPT2LMHeadModel& model, const Params& params, const Array& prompt,
               const GenerateOptions& o) {
  const GPT2Config& c = model.config();
  if (!is_integral(prompt.dtype()) || prompt.ndim() != 2 || prompt.shape()[1] < 1 ||
      prompt.shape()[0] < 1)
    fail("generate", "the prompt must be integers [batch, tokens] with at least one token, got " +
                         std::string(name_of(prompt.dtype())) + " " + str(prompt.shape()));
  const int64_t b = prompt.shape()[0], p = prompt.shape()[1];
  if (o.max_new_tokens < 0)
    fail("generate", "max_new_tokens must be >= 0, got " + std::to_string(o.max_new_tokens));
  if (p > c.n_positions)
    fail("generate", "the prompt has " + std::to_string(p) +
                         " tokens, more than the model's n_positions " +
                         std::to_string(c.n_positions));
  const int64_t total = p + o.max_new_tokens;
  if (total > c.n_positions)
    fail("generate", "the prompt's " + std::to_string(p) + " tokens and max_new_tokens " +
                         std::to_string(o.max_new_tokens) + " make " + std::to_string(total) +
                         ", more than the model's n_positions " + std::to_string(c.n_positions));
  if (!(o.temperature >= 0 && std::isfinite(o.temperature)))
    fail("generate", "temperature must be >= 0 (0: greedy), got " + std::to_string(o.temperature));
  if (o.top_k < 0) fail("generate", "top_k must be >= 0 (0: off), got " + std::to_string(o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1))
    fail("generate", "top_p must lie in (0, 1], got " + std::to_string(o.top_p));
  for (int64_t id : astype(prompt, DType::i64).to_vector<int64_t>())
    if (id < 0 || id >= c.vocab_size)
      fail("generate", "the prompt holds token " + std::to_string(id) +
                           ", outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  if (o.max_new_tokens == 0) return prompt;

  const Device dev = prompt.device();
  const DType kv = o.matmul_dtype == DType::bf16 ? DType::bf16 : DType::f32;
  KVCache cache = model.empty_cache(b, total, dev, kv);
  // The matmul weights rounded once (both programs read the same copies).
  const Params run = model.inference_params(params, o.matmul_dtype);
  const size_t layers = cache.keys.size();
  // One step: the tokens at `position` -> the last position's logits, the
  // cache written (donated under jit, so in place).
  auto step = [&model, &run, layers, o](const std::vector<Array>& in) {
    KVCache kvc;
    for (size_t l = 0; l < layers; ++l) {
      kvc.keys.push_back(in[2 + l]);
      kvc.values.push_back(in[2 + layers + l]);
    }
    const Array logits = model.apply_cached(run, in[0], kvc, in[1], o.matmul_dtype);
    const int64_t bb = logits.shape()[0], t = logits.shape()[1], v = logits.shape()[2];
    std::vector<Array> out{reshape(slice(logits, {0, t - 1, 0}, {bb, t, v}), {bb, v})};
    for (Array& a : kvc.keys) out.push_back(std::move(a));
    for (Array& a : kvc.values) out.push_back(std::move(a));
    return out;
  };
  std::vector<int> donate;
  for (size_t i = 0; i < 2 * layers; ++i) donate.push_back(static_cast<int>(2 + i));
  Jitted compiled = jit(step, {.donate = donate, .cache_capacity = 2});

  std::vector<std::vector<int32_t>> seqs(static_cast<size_t>(b));
  {
    const auto flat = astype(prompt, DType::i64).to_vector<int64_t>();
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < p; ++j)
        seqs[static_cast<size_t>(i)].push_back(static_cast<int32_t>(flat[i * p + j]));
  }
  std::vector<bool> done(static_cast<size_t>(b), false);
  Array input = astype(prompt, DType::i32);
  int64_t position = 0;
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    std::vector<Array> in{input, full({}, static_cast<double>(position), DType::i32, dev)};
    for (Array& a : cache.keys) in.push_back(a);
    for (Array& a : cache.values) in.push_back(a);
    std::vector<Array> out = o.compiled ? compiled(in) : step(in);
    cache.keys.assign(out.begin() + 1, out.begin() + 1 + static_cast<std::ptrdiff_t>(layers));
    cache.values.assign(out.begin() + 1 + static_cast<std::ptrdiff_t>(layers), out.end());
    position += input.shape()[1];
    const auto next =
        astype(choose(out[0], o, random::fold_in(random::Key(o.seed), static_cast<uint32_t>(n))),
               DType::i32)
            .to_vector<int32_t>();
    bool all_done = true;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int32_t tok = done[i] ? static_cast<int32_t>(o.pad_token_id) : next[i];
      seqs[i].push_back(tok);
      if (o.eos_token_id >= 0 && tok == o.eos_token_id) done[i] = true;
      all_done = all_done && done[i];
    }
    if (all_done) break;
    std::vector<int32_t> last;
    for (const auto& s : seqs) last.push_back(s.back());
    input = Array::from_vector(last, {b, 1}).to(dev);
  }
  const int64_t len = static_cast<int64_t>(seqs[0].size());
  std::vector<int32_t> flat;
  for (const auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
  return astype(Array::from_vector(flat, {b, len}), prompt.dtype()).to(dev);
}

}  // namespace kiln::nn
