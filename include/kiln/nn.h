// kiln — neural-network models over parameter trees.
#pragma once
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/ops.h"
#include "kiln/random.h"
#include "kiln/transforms.h"

namespace kiln::nn {

// transformers' ACT2FN (activations.py), one value per name, for hidden_act.
// Names that compute the same function (silu and swish, gelu and gelu_python)
// stay apart so that a config.json is written back as it was read.
enum class Activation {
  Gelu,             // x·Φ(x), erf form
  Gelu10,           // gelu clipped to [-10, 10]
  GeluFast,         // tanh approximation, 0.7978845608 for √(2/π)
  GeluNew,          // tanh approximation
  GeluPython,       // x·Φ(x) written with erf in Python
  GeluPytorchTanh,  // tanh approximation (torch's approximate="tanh")
  GeluAccurate,     // tanh approximation
  Laplace,          // (1 + erf((x − 0.707107) / (0.282095·√2))) / 2
  LeakyRelu,        // slope 0.01 below 0 (torch.nn.LeakyReLU())
  Linear,           // the identity
  Mish,             // x·tanh(softplus(x))
  QuickGelu,        // x·σ(1.702x)
  Relu,             // max(x, 0)
  Relu2,            // relu(x)²
  Relu6,            // min(relu(x), 6)
  Sigmoid,          // σ(x) = 1 / (1 + e⁻ˣ)
  Silu,             // x·σ(x)
  Swish,            // x·σ(x)
  Tanh,             // tanh(x)
};
// The config.json name of an activation ("gelu_new", ...).
const char* activation_name(Activation act);
// The activation of a config.json name, if transformers 4.46 has it.
std::optional<Activation> activation_from_name(const std::string& name);
// Every name activation_from_name accepts, in ACT2FN's order.
const std::vector<std::string>& activation_names();
// The activation applied elementwise, made of kiln's primitives (so autodiff
// and the compiler see ordinary ops).
Array activate(Activation act, const Array& x);
// log(1 + eˣ) without overflow, and the logistic function σ(x) = 1 / (1 + e⁻ˣ).
Array softplus(const Array& x);
Array sigmoid(const Array& x);

// transformers' problem_type: which loss ViTForImageClassification computes.
enum class ProblemType {
  Unset,        // decided per batch: regression when num_labels == 1, else
                // single-label for integer labels, multi-label otherwise
  Regression,   // mean squared error (MSELoss) against float labels
  SingleLabel,  // softmax cross-entropy (CrossEntropyLoss) against integer labels
  MultiLabel,   // sigmoid binary cross-entropy (BCEWithLogitsLoss) against float labels
};
// "regression", "single_label_classification", "multi_label_classification"
// (Unset: "null").
const char* problem_type_name(ProblemType p);

// The problem type transformers' image classifiers use for labels of this
// dtype: the config's when set; else regression for one label, single-label
// classification for integer labels, multi-label otherwise.
ProblemType resolve_problem(ProblemType configured, int64_t num_labels, DType labels);
// The mean loss an image classifier's forward computes from its logits
// [B, num_logits] and labels (see ViTForImageClassification::loss); `who`
// names the model in errors.
Array classification_loss(const Array& logits, const Array& labels, int64_t num_labels,
                          ProblemType configured, double label_smoothing, const char* who);

// A height and a width: transformers takes image_size and patch_size as one
// integer (a square) or as a pair [height, width].
struct Size2d {
  int64_t height = 0, width = 0;
  Size2d() = default;
  // A square, as transformers reads an integer.
  Size2d(int64_t side) : height(side), width(side) {}  // NOLINT(google-explicit-constructor)
  Size2d(int64_t h, int64_t w) : height(h), width(w) {}
  bool square() const { return height == width; }
  bool operator==(const Size2d&) const = default;
};
// "224" for a square, "30x20" (height x width) otherwise.
std::string to_string(const Size2d& s);

// The models of the ViT family, one encoder: ViTForImageClassification;
// DeiTForImageClassification (names under "deit.", a distillation token
// after [CLS] with its own position embedding; the classifier reads [CLS]);
// DeiTForImageClassificationWithTeacher (cls_classifier on [CLS],
// distillation_classifier on the distillation token, the logits their mean).
// A DeiTConfig is a ViTConfig.
enum class ViTVariant { ViT, DeiT, DeiTWithTeacher };

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
  // Stochastic depth of the last encoder layer's two residual branches,
  // rising linearly from 0 at the first (timm's drop_path_rate, which
  // transformers' ViT and DeiT lack: config.json holds it only when set).
  double drop_path_rate = 0.0;
  // The images are exactly image_size; the patch embedding (a convolution
  // with stride patch_size) ignores the rows and columns left over when
  // image_size is not a multiple of patch_size, as torch's Conv2d does.
  Size2d image_size = 224;
  Size2d patch_size = 16;
  int64_t num_channels = 3;
  bool qkv_bias = true;
  // 0: no classifier (nn.Identity); the logits are the final [CLS] features.
  int64_t num_labels = 1000;
  ProblemType problem_type = ProblemType::Unset;
  // The labels' names (config.json's id2label), one per label; empty: the
  // names transformers makes up, LABEL_0 ... LABEL_{num_labels-1}.
  std::vector<std::string> id2label;
  // Heads removed from the attention of a layer (PretrainedConfig.pruned_heads,
  // which transformers applies when it builds the model): the layer's query,
  // key and value have (num_attention_heads - pruned) * head_dim outputs.
  std::map<int64_t, std::vector<int64_t>> pruned_heads;

  // "vit-tiny", "vit-small", "vit-base" (== ViTConfig()), "vit-large", and "vit-fmnist"
  // (28x28x1 images, patch 7, 10 labels: Fashion-MNIST).
  static ViTConfig preset(const std::string& name);
  static const std::vector<std::string>& preset_names();
  // Patches per column and per row.
  Size2d grid() const {
    return {image_size.height / patch_size.height, image_size.width / patch_size.width};
  }
  int64_t num_patches() const { return grid().height * grid().width; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t heads_in_layer(int64_t layer) const;  // num_attention_heads less the pruned ones
  int64_t num_logits() const { return num_labels > 0 ? num_labels : hidden_size; }
  std::string label_name(int64_t i) const;  // id2label[i], or LABEL_i
  // The problem type transformers uses for labels of this dtype (the config's
  // when set).
  ProblemType problem_for(DType labels) const;
  // Throws naming the field when the configuration is inconsistent.
  void validate(const std::string& origin = "ViTConfig") const;
  // Training FLOPs of one image (forward + backward, matmuls only: 3x
  // forward) with `tokens` before the patches ([CLS]; DeiT's distillation token).
  double train_flops_per_image(int64_t tokens = 1) const;
  // transformers' config.json of a model of this model_type ("vit" or
  // "deit"): every field it reads, errors naming `path` and the field.
  static ViTConfig from_json(std::string_view json, const std::string& path,
                             const std::string& model_type = "vit");
  // config.json as save_pretrained writes it for the variant.
  std::string to_json(ViTVariant variant = ViTVariant::ViT) const;
};

// Position embeddings [1, leading + from.height * from.width, hidden] (the
// [CLS] one, and DeiT's distillation one with leading 2, then the patch grid
// row by row) for a grid of `to` patches, as transformers'
// ViTEmbeddings.interpolate_pos_encoding (and DeiT's) makes them: the leading
// embeddings kept, the grid resampled by torch's bicubic interpolation
// (a = -0.75, align_corners=False, edge pixels repeated), in double on the
// host; the same grid gives the same array back.
Array resample_position_embeddings(const Array& pos, Size2d from, Size2d to, int64_t leading = 1);

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
  // No backward pass follows (predict, evaluation): in bf16 mode the MLP's
  // activation then reads the intermediate linear's f32 sum, which a
  // compiled forward fuses into the GEMM (training rounds that sum to bf16
  // first, since the backward pass keeps it). f32 mode is unaffected.
  bool inference = false;
};


// ViTForImageClassification with HuggingFace's parameter names and shapes
// (or DeiT's, by `variant`).
class ViTForImageClassification {
 public:
  explicit ViTForImageClassification(ViTConfig cfg, ViTVariant variant = ViTVariant::ViT);
  const ViTConfig& config() const { return cfg_; }
  ViTVariant variant() const { return variant_; }
  // HuggingFace's initialization: truncated normal(initializer_range) for
  // weights, cls token and position embeddings; zero biases; unit LayerNorm.
  // Drawn on `device` (the same numbers on every device: Threefry).
  Params init(const random::Key& key, Device device = Device::cpu()) const;
  // The parameter names and shapes this model expects.
  std::vector<std::pair<std::string, Shape>> parameter_shapes() const;
  // Checks a parameter tree against parameter_shapes(); throws naming the entry.
  void check(const Params& params, const std::string& origin) const;
  // pixel_values [B, C, H, W] (NCHW) or [B, H, W, C] (NHWC) -> logits [B, num_logits()].
  Array apply(const Params& params, const Array& pixels, const ApplyOptions& opt = {}) const;
  // The mean loss ViTForImageClassification.forward computes from its logits
  // and labels, by problem_for(labels): regression, mean squared error
  // against float labels [B, num_labels] ([B] or [B, 1] with one label, whose
  // logits are squeezed as transformers does); single label, softmax
  // cross-entropy against integer labels [B]; multi-label, binary
  // cross-entropy with logits against float labels [B, num_logits()].
  // Labels of another dtype or shape get an error naming them.
  // label_smoothing (single label only): CrossEntropyLoss(label_smoothing=ε),
  // (1 - ε) · cross-entropy + ε · the mean over classes of −log softmax.
  Array loss(const Array& logits, const Array& labels, double label_smoothing = 0.0) const;

 private:
  ViTConfig cfg_;
  ViTVariant variant_ = ViTVariant::ViT;
  std::string prefix() const { return variant_ == ViTVariant::ViT ? "vit" : "deit"; }
  int64_t tokens() const { return variant_ == ViTVariant::ViT ? 1 : 2; }  // before the patches
};

class Model;
// The ViT family behind the model interface (kiln/model.h), and the
// network of such a model (null for the other families).
std::shared_ptr<const Model> vit_model(ViTConfig cfg, ViTVariant variant = ViTVariant::ViT);
const ViTForImageClassification* as_vit(const Model& model);

}  // namespace kiln::nn
