// kiln — GPT-2 (transformers' GPT2LMHeadModel): a decoder language model
// whose parameters are a tree in HuggingFace's names, its Conv1D weights
// stored [in, out] as transformers stores them.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/layers.h"
#include "kiln/nn.h"

namespace kiln::nn {

// transformers' GPT2Config, field for field (the defaults are GPT2Config():
// the 124M "gpt2").
struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;  // 0 (config.json's null): 4 * n_embd
  Activation activation_function = Activation::GeluNew;
  double resid_pdrop = 0.1;
  double embd_pdrop = 0.1;
  double attn_pdrop = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  // Scores divided by √head_dim; and (by the inverse layer index) by
  // layer + 1 as well.
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;
  // transformers computes the scores in f32 under autocast; kiln's attention
  // always does, so this changes nothing but is kept for config.json.
  bool reorder_and_upcast_attn = false;
  // The head's weight is transformer.wte.weight (no lm_head.weight).
  bool tie_word_embeddings = true;
  int64_t bos_token_id = 50256;
  int64_t eos_token_id = 50256;

  // "gpt2" (== GPT2Config(), 124M), "gpt2-medium" (355M), "gpt2-large",
  // "gpt2-xl", and "gpt2-tiny" (a 4-layer, 128-wide model of GPT-2's vocabulary
  // and 256 positions, for tests and small runs).
  static GPT2Config preset(const std::string& name);
  static const std::vector<std::string>& preset_names();
  int64_t inner() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  int64_t head_dim() const { return n_embd / n_head; }
  // The scale of layer `layer`'s scores.
  double attention_scale(int64_t layer) const;
  // Throws naming `origin` and the field when the configuration is inconsistent.
  void validate(const std::string& origin = "GPT2Config") const;
  // Training FLOPs of one token in a sequence of `seq_len` (forward +
  // backward, 3x the forward's 2 x multiply-adds: the matmuls, the head and
  // the attention's scores and sums).
  double train_flops_per_token(int64_t seq_len) const;
  // transformers' config.json (model_type "gpt2"): errors name `path` and the field.
  static GPT2Config from_json(std::string_view json, const std::string& path);
  // config.json as save_pretrained writes it.
  std::string to_json() const;
};

// The keys and values a decoder has seen, one [batch, capacity, heads,
// head_dim] pair per layer, the first `length` positions filled.
struct KVCache {
  std::vector<Array> keys, values;
  int64_t capacity() const { return keys.empty() ? 0 : keys[0].shape()[1]; }
};

class GPT2LMHeadModel {
 public:
  explicit GPT2LMHeadModel(GPT2Config cfg);
  const GPT2Config& config() const { return cfg_; }
  // transformers' initialization: linear and embedding weights
  // normal(initializer_range), the c_proj weights normal(initializer_range /
  // √(2·n_layer)), zero biases, unit LayerNorms.
  Params init(const random::Key& key, Device device = Device::cpu()) const;
  // The parameters in transformers' order ("transformer.wte.weight", ...,
  // "lm_head.weight" only when untied).
  std::vector<std::pair<std::string, Shape>> parameter_shapes() const;
  void check(const Params& params, const std::string& origin) const;

  // input_ids [B, T] (integers) -> logits [B, T, vocab_size] (f32). Positions
  // count from 0. attention_mask (optional, [B, T], nonzero where a token is
  // real) hides padded keys as transformers' attention_mask does.
  // Options as for the image models: train (dropout by the key), drop,
  // matmul_dtype (bf16 mixed precision), fused_attention (the attention's
  // fused kernel; attention dropout always takes the unfused path),
  // inference.
  Array apply(const Params& params, const Array& input_ids, const ModelOptions& opt = {},
              const Array& attention_mask = Array()) const;
  // transformers' loss: cross-entropy of logits [B, T, V] at position t
  // against labels [B, T] at t + 1 (the shift is inside), labels -100
  // ignored, the mean over the rest (NaN when every label is ignored, as
  // torch's CrossEntropyLoss).
  Array loss(const Array& logits, const Array& labels) const;

  // An empty cache for `batch` sequences of up to `capacity` tokens
  // (capacity <= n_positions).
  KVCache empty_cache(int64_t batch, int64_t capacity, Device device = Device::cpu(),
                      DType dtype = DType::f32) const;
  // The logits of T new tokens [B, T] at positions position ... position +
  // T - 1 (position: an i32 scalar array, read at run time), attending to the
  // cache's first `position` entries and to themselves; their keys and values
  // are written into the cache (in place under jit when it is donated).
  // Inference only (no dropout); f32 or the cache's dtype for bf16.
  Array apply_cached(const Params& params, const Array& input_ids, KVCache& cache,
                     const Array& position, DType matmul_dtype = DType::f32) const;
  // The parameters for apply_cached and generate at matmul_dtype `dtype`,
  // each matmul operand (the blocks' Conv1D weights, the head) rounded to it
  // once, as transformers' model.to(torch.bfloat16) is done once before
  // generating; embeddings, norms and biases as they are. The head's copy is
  // "lm_head.weight" also when it is tied (apply_cached reads that entry
  // where it is present). The logits equal those of rounding at each step.
  // f32: the parameters as they are.
  Params inference_params(const Params& params, DType dtype) const;

 private:
  GPT2Config cfg_;
};

class Model;
// GPT-2 behind the model interface (kiln/model.h; registered as model_type
// "gpt2" with the presets above), and the network of such a model (null for
// the other families).
std::shared_ptr<const Model> gpt2_model(GPT2Config cfg);
const GPT2LMHeadModel* as_gpt2(const Model& model);

// How generate() chooses each next token: greedy (temperature 0), or
// sampled from softmax(logits / temperature) narrowed to the top_k most
// likely tokens (0: all) and to the smallest set whose probability reaches
// top_p (1: all), as transformers' logits warpers do (temperature, then
// top-k, then top-p).
struct GenerateOptions {
  int64_t max_new_tokens = 20;
  double temperature = 0;  // 0: greedy
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;  // the draws: token i of a run from fold_in(Key(seed), i)
  // Stops a sequence at this token (it is kept); -1: never. Finished
  // sequences of a batch are padded with pad_token_id.
  int64_t eos_token_id = -1;
  int64_t pad_token_id = 0;
  DType matmul_dtype = DType::f32;
  // Each step's logits computed on the KV cache in one compiled program (the
  // default), or eagerly (for checks).
  bool compiled = true;
};

// The prompts [B, P] followed by up to max_new_tokens tokens each: [B, P +
// n]; the first step runs the prompt, each later one only the new token
// against the KV cache. A prompt and its new tokens beyond n_positions are
// an error naming them.
Array generate(const GPT2LMHeadModel& model, const Params& params, const Array& prompt,
               const GenerateOptions& opt = {});

}  // namespace kiln::nn
