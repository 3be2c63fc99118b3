// kiln — ResNet (transformers' ResNetForImageClassification): parameters
// and BatchNorm state as trees in HuggingFace's names.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "kiln/nn.h"

namespace kiln::nn {

// transformers' ResNetConfig, field for field (the defaults are
// ResNetConfig(): ResNet-50).
struct ResNetConfig {
  int64_t num_channels = 3;
  int64_t embedding_size = 64;
  std::vector<int64_t> hidden_sizes{256, 512, 1024, 2048};
  std::vector<int64_t> depths{3, 4, 6, 3};
  bool bottleneck = true;  // layer_type "bottleneck", else "basic"
  Activation hidden_act = Activation::Relu;
  bool downsample_in_first_stage = false;
  bool downsample_in_bottleneck = false;  // a bottleneck's stride on its first 1x1, not its 3x3
  int64_t num_labels = 1000;              // 0: no classifier (the pooled features)
  ProblemType problem_type = ProblemType::Unset;
  std::vector<std::string> id2label;

  // "resnet-18", "resnet-34", "resnet-50" (== ResNetConfig()), "resnet-101",
  // "resnet-152": microsoft/resnet-*'s architectures; "resnet-fmnist":
  // ResNet-18 for Fashion-MNIST (1 channel, 10 labels).
  static ResNetConfig preset(const std::string& name);
  static const std::vector<std::string>& preset_names();
  int64_t num_logits() const { return num_labels > 0 ? num_labels : hidden_sizes.back(); }
  // Throws naming the field when the configuration is inconsistent.
  void validate(const std::string& origin = "ResNetConfig") const;
  // Training FLOPs of one image of this size (3x the forward's convolutions
  // and classifier; the stem's input gradient not counted).
  double train_flops_per_image(Size2d image) const;
  // transformers' config.json (model_type "resnet"): errors name `path` and the field.
  static ResNetConfig from_json(std::string_view json, const std::string& path);
  // config.json as save_pretrained writes it.
  std::string to_json() const;
};

struct ResNetOutput {
  Array logits;  // [B, num_logits()]
  Params state;  // the running statistics after the forward (training), else as given
};

class ResNetForImageClassification {
 public:
  explicit ResNetForImageClassification(ResNetConfig cfg);
  const ResNetConfig& config() const { return cfg_; }
  // transformers' initialization: convolutions kaiming-normal (fan out,
  // ReLU gain), the classifier torch.nn.Linear's uniform ±1/√fan_in, unit
  // BatchNorm weights and zero biases.
  Params init(const random::Key& key, Device device = Device::cpu()) const;
  // BatchNorm's state: running means 0, running variances 1 and
  // num_batches_tracked 0 (i64), as a fresh model has them.
  Params init_state(Device device = Device::cpu()) const;
  std::vector<std::pair<std::string, Shape>> parameter_shapes() const;
  std::vector<std::pair<std::string, Shape>> state_shapes() const;
  // Throws naming the entry where a tree does not hold these names and shapes.
  void check(const Params& params, const Params& state, const std::string& origin) const;
  // pixel_values [B, C, H, W] (NCHW) or [B, H, W, C] (NHWC). In training
  // BatchNorm normalizes by the batch's statistics and the returned state
  // holds the updated running statistics (momentum 0.1, as torch's
  // BatchNorm2d); in evaluation by the running statistics, which stay.
  // matmul_dtype bf16: bf16 mixed precision (the convolutions' and the
  // classifier's operands rounded to bf16; BatchNorm and the rest f32).
  ResNetOutput apply(const Params& params, const Params& state, const Array& pixels, bool train,
                     Layout layout = Layout::NCHW, DType matmul_dtype = DType::f32) const;
  // The loss ResNetForImageClassification.forward computes (as ViT's).
  Array loss(const Array& logits, const Array& labels, double label_smoothing = 0.0) const;

 private:
  ResNetConfig cfg_;
};

}  // namespace kiln::nn
