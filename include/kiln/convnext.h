// kiln — ConvNeXt (transformers' ConvNextForImageClassification):
// parameters as a tree in HuggingFace's names.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "kiln/nn.h"

namespace kiln::nn {

// transformers' ConvNextConfig, field for field (the defaults are
// ConvNextConfig(): ConvNeXt-T).
struct ConvNextConfig {
  int64_t num_channels = 3;
  int64_t patch_size = 4;
  std::vector<int64_t> hidden_sizes{96, 192, 384, 768};
  std::vector<int64_t> depths{3, 3, 9, 3};
  Activation hidden_act = Activation::Gelu;
  double initializer_range = 0.02;
  double layer_norm_eps = 1e-12;         // the final LayerNorm's (the others: 1e-6)
  double layer_scale_init_value = 1e-6;  // <= 0: no layer scale
  double drop_path_rate = 0.0;           // the last layer's; rising linearly from 0
  int64_t image_size = 224;
  int64_t num_labels = 1000;  // 0: no classifier (the pooled, normalized features)
  ProblemType problem_type = ProblemType::Unset;
  std::vector<std::string> id2label;

  // "convnext-tiny" (== ConvNextConfig()), "convnext-small", "convnext-base",
  // "convnext-large": facebook/convnext-*-224's architectures.
  static ConvNextConfig preset(const std::string& name);
  static const std::vector<std::string>& preset_names();
  int64_t num_logits() const { return num_labels > 0 ? num_labels : hidden_sizes.back(); }
  void validate(const std::string& origin = "ConvNextConfig") const;
  // Training FLOPs of one image of this size (3x the forward's convolutions
  // and linears; the stem's input gradient not counted).
  double train_flops_per_image(Size2d image) const;
  // transformers' config.json (model_type "convnext"): errors name `path` and the field.
  static ConvNextConfig from_json(std::string_view json, const std::string& path);
  // config.json as save_pretrained writes it.
  std::string to_json() const;
};

class ConvNextForImageClassification {
 public:
  explicit ConvNextForImageClassification(ConvNextConfig cfg);
  const ConvNextConfig& config() const { return cfg_; }
  // transformers' initialization: convolution and linear weights normal
  // (initializer_range), zero biases, unit LayerNorms, layer scales at
  // layer_scale_init_value.
  Params init(const random::Key& key, Device device = Device::cpu()) const;
  std::vector<std::pair<std::string, Shape>> parameter_shapes() const;
  void check(const Params& params, const std::string& origin) const;
  // pixel_values [B, C, H, W] (NCHW) or [B, H, W, C] (NHWC) -> logits. In
  // training with drop_path_rate > 0 each residual branch is dropped per
  // sample (stochastic depth) by draws from `key`, folded in per layer.
  Array apply(const Params& params, const Array& pixels, bool train = false,
              Layout layout = Layout::NCHW, const random::Key& key = random::Key(0)) const;
  // The same with the key held in an i32[2] array (random::key_array; the
  // same draws for the same key), as a compiled step takes it.
  // matmul_dtype bf16: bf16 mixed precision (the convolutions' and matmuls'
  // operands rounded to bf16, their results, LayerNorms and the rest f32).
  Array apply(const Params& params, const Array& pixels, bool train, Layout layout,
              const Array& key, DType matmul_dtype = DType::f32) const;
  Array loss(const Array& logits, const Array& labels, double label_smoothing = 0.0) const;

 private:
  ConvNextConfig cfg_;
};

}  // namespace kiln::nn
