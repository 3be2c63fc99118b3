// kiln — neural-network models over parameter trees.
#pragma once
#include <string>

#include "kiln/ops.h"
#include "kiln/random.h"
#include "kiln/transforms.h"

namespace kiln::nn {

enum class Activation { Gelu, GeluTanh, Relu };

// transformers' ViTConfig, field for field (the defaults are ViTConfig()).
struct ViTConfig {
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  Activation hidden_act = Activation::Gelu;
  double hidden_dropout_prob = 0.0;
  double attention_probs_dropout_prob = 0.0;
  double initializer_range = 0.02;
  double layer_norm_eps = 1e-12;
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t num_channels = 3;
  bool qkv_bias = true;
  int64_t num_labels = 1000;

  // "vit-tiny", "vit-small", "vit-base" (== ViTConfig()), "vit-large", and "vit-fmnist"
  // (28x28x1 images, patch 7, 10 labels: Fashion-MNIST).
  static ViTConfig preset(const std::string& name);
  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Throws naming the field when the configuration is inconsistent.
  void validate(const std::string& origin = "ViTConfig") const;
  // Training FLOPs of one image (forward + backward, matmuls only: 3x forward).
  double train_flops_per_image() const;
};

enum class Layout { NCHW, NHWC };

struct ApplyOptions {
  Layout layout = Layout::NCHW;
  bool train = false;       // dropout active
  random::Key dropout_key;  // used when train and a dropout probability is > 0
  // When set, the dropout key comes from this i32[2] array (random::key_array)
  // instead: a compiled step takes it as an argument and draws anew each call.
  // Both give the same masks for the same key.
  Array dropout_key_array;
  // The matmuls' input precision: f32, or bf16 (mixed precision: parameters,
  // LayerNorm, softmax, the loss and every accumulation stay f32; the
  // operands of each matmul are rounded to bf16 and the products summed in f32;
  // the fused attention kernel computes in f32).
  DType matmul_dtype = DType::f32;
  // Self-attention as one fused primitive (kiln::attention) on the output of
  // one query/key/value GEMM against the three weights concatenated; when
  // false, as transformers' eager attention: three linears, batched matmuls
  // and a softmax whose T×T output is kept for the backward. Dropout on the
  // attention probabilities (when training with a non-zero
  // attention_probs_dropout_prob) always takes the unfused path.
  bool fused_attention = true;
};

// ViTForImageClassification with HuggingFace's parameter names and shapes.
class ViTForImageClassification {
 public:
  explicit ViTForImageClassification(ViTConfig cfg);
  const ViTConfig& config() const { return cfg_; }
  // HuggingFace's initialization: truncated normal(initializer_range) for
  // weights, cls token and position embeddings; zero biases; unit LayerNorm.
  Params init(const random::Key& key) const;
  // The parameter names and shapes this model expects.
  std::vector<std::pair<std::string, Shape>> parameter_shapes() const;
  // Checks a parameter tree against parameter_shapes(); throws naming the entry.
  void check(const Params& params, const std::string& origin) const;
  // pixel_values [B, C, H, W] (NCHW) or [B, H, W, C] (NHWC) -> logits [B, num_labels].
  Array apply(const Params& params, const Array& pixels, const ApplyOptions& opt = {}) const;

 private:
  ViTConfig cfg_;
};

}  // namespace kiln::nn
