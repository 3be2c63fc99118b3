// kiln — one interface for every model family, and the registry that makes
// a model from transformers' config.json by its model_type (as
// AutoModelForImageClassification does). A family registers itself from its
// own source file; nothing else names its config.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/layers.h"
#include "kiln/nn.h"

namespace kiln::nn {

struct ModelOutput {
  Array logits;  // [B, num_logits()]; a language model's [B, T, num_logits()]
  Params state;  // the state after the forward: updated in training, else as given
};

// A model of transformers: an image classifier (ViT, DeiT, ResNet,
// ConvNeXt, ...) or a causal language model (GPT-2; causal_lm() true, whose
// inputs are token ids and which has no classifier and no images), its
// parameters and state (BatchNorm's running statistics) as trees in
// HuggingFace's names.
class Model {
 public:
  virtual ~Model() = default;
  // config.json's model_type ("vit", "resnet", ...) and architectures[0]
  // ("ViTForImageClassification", ...).
  virtual std::string model_type() const = 0;
  virtual std::string architecture() const = 0;

  // The names and shapes of the parameters (trained) and of the state (not
  // trained; saved and loaded with the weights).
  virtual std::vector<std::pair<std::string, Shape>> parameter_shapes() const = 0;
  virtual std::vector<std::pair<std::string, Shape>> state_shapes() const { return {}; }
  // transformers' initialization, drawn on `device` (the same numbers on
  // every device), and the state of a fresh model.
  virtual Params init(const random::Key& key, Device device = Device::cpu()) const = 0;
  virtual Params init_state(Device /*device*/ = Device::cpu()) const { return {}; }
  // Throws naming `origin` and the entry where the trees do not hold exactly
  // these names and shapes.
  void check(const Params& params, const Params& state, const std::string& origin) const;
  // Splits weights as a pretrained folder holds them (parameters and state
  // in one tree) into the parameters and the state; a missing entry is an
  // error naming it (e.g. a BatchNorm without running statistics).
  std::pair<Params, Params> split(Params weights, const std::string& origin) const;

  // pixel_values [B, C, H, W] (NCHW) or [B, H, W, C] (NHWC) -> logits and
  // state; a language model's input_ids [B, T] -> logits [B, T, vocab].
  virtual ModelOutput apply(const Params& params, const Params& state, const Array& pixels,
                            const ModelOptions& opt = {}) const = 0;
  // The mean loss the family's forward computes from its logits and labels:
  // an image classifier's by the problem type (see classification_loss); a
  // language model's the next token's cross-entropy (labels [B, T], shifted
  // inside, -100 ignored).
  virtual Array loss(const Array& logits, const Array& labels, double label_smoothing = 0.0) const;
  // A causal language model (token ids in, the next token's logits out).
  virtual bool causal_lm() const { return false; }
  // The model's name for a tensor a checkpoint stores as `stored` (GPT-2's
  // first checkpoints lack the "transformer." prefix); "" for a tensor that
  // is not a weight (a saved attention mask). By default `stored` itself.
  virtual std::string weight_name(const std::string& stored) const { return stored; }

  // The labels: num_labels 0 means no classifier (the logits are features).
  virtual int64_t num_labels() const = 0;
  virtual int64_t num_logits() const = 0;
  virtual ProblemType problem_type() const = 0;
  // id2label's names, one per label (transformers' LABEL_i where unnamed).
  virtual std::vector<std::string> label_names() const = 0;
  ProblemType problem_for(DType labels) const {
    return resolve_problem(problem_type(), num_labels(), labels);
  }
  // The same model with a new classifier for these labels (a head swap:
  // num_labels and id2label changed, nothing else).
  virtual std::shared_ptr<const Model> with_labels(const std::vector<std::string>& names) const = 0;
  // The parameters of the classifier (those whose shapes follow num_labels;
  // none for a language model).
  virtual std::set<std::string> head_parameters() const;
  // The classifier's parameters drawn afresh (a head swap of pretrained
  // weights, io::adapt_classifier): those of init(key) by default; a family
  // may draw them as its checkpoints always have (a ViT: transformers' ViT
  // init of the classifier from `key` itself).
  virtual Params init_head(const random::Key& key) const;

  // The images it takes: channels, and the size its config names (0 for a
  // language model).
  virtual int64_t num_channels() const = 0;
  virtual Size2d image_size() const = 0;
  // Whether it takes images of image_size() only (a ViT: its position
  // embeddings are made for one grid), or any size (convolutional models).
  virtual bool fixed_image_size() const { return false; }
  // For a model of fixed_image_size(): the same model made for images of
  // `size` (a new ViT's config; fresh weights only: a pretrained one's
  // position embeddings are resampled by resized, io::set_image_size's). An invalid
  // size, or a model that takes any size, is an error naming `origin`.
  virtual std::shared_ptr<const Model> with_image_size(Size2d size,
                                                       const std::string& origin) const;
  // For a model of fixed_image_size() with trained `params`: the model for
  // images of `size` and its parameters made for it (a ViT's or DeiT's
  // position embeddings resampled to the new grid of patches as
  // transformers' interpolate_pos_encoding does), what was done appended to
  // `notes` (nothing at the same size). By default with_image_size, the
  // parameters unchanged.
  virtual std::shared_ptr<const Model> resized(Params& params, Size2d size,
                                               std::vector<std::string>& notes) const;
  // Whether training draws random numbers (dropout or drop path on).
  virtual bool stochastic() const = 0;
  // The same model with stochastic depth rising linearly over its blocks to
  // `rate` (timm's drop_path_rate; `--drop-path`), or an error naming the
  // family where it has none.
  virtual std::shared_ptr<const Model> with_drop_path(double rate) const;
  // Training FLOPs of one image of this size (forward + backward: 3x the
  // forward's 2 x multiply-adds of its matmuls and convolutions), for the
  // model FLOP utilization. (ViTs take only their config's image size; a
  // language model counts one sequence of its n_positions tokens.)
  virtual double train_flops_per_example(Size2d image) const = 0;
  // config.json as transformers' save_pretrained writes it.
  virtual std::string config_json() const = 0;
  // The config's fields that its parameters' shapes follow, for errors
  // about weights of other shapes (a ViT: "hidden_size 768, image_size 224,
  // patch_size 16, 1000 labels, 12 layers"); by default its architecture.
  virtual std::string config_summary() const { return architecture(); }

  // Layer-wise learning-rate decay (BEiT's, as timm's
  // param_groups_layer_decay groups a model): the group of a parameter,
  // from 0 (the embeddings or stem) through one group per block to
  // num_layer_groups() - 1 (the classifier).
  virtual int64_t num_layer_groups() const = 0;
  virtual int64_t layer_group(const std::string& param) const = 0;
};

// Each parameter's learning-rate scale under layer-wise decay `decay` (in
// (0, 1]): decay^(num_layer_groups() - 1 - layer_group(name)), 1 for the
// classifier (timm's --layer-decay).
std::map<std::string, double> layer_decay_scales(const Model& model, double decay);

// A family: the model_type it reads, its presets, and how it is made.
struct ModelFamily {
  std::string model_type;
  std::vector<std::string> presets;
  // From config.json's text; errors name `origin` and the field.
  std::function<std::shared_ptr<const Model>(std::string_view json, const std::string& origin)>
      from_config;
  std::function<std::shared_ptr<const Model>(const std::string& preset)> from_preset;
};
// Adds a family (called from the family's source file at load time); a
// model_type registered twice is an error.
bool register_model_family(ModelFamily family);

// The model of a config.json by its model_type; an unknown model_type is an
// error naming the types kiln has, and so is a missing one unless
// `missing_type` names the family to read it as (kiln's first ViT
// checkpoints wrote none).
std::shared_ptr<const Model> model_from_config(std::string_view json, const std::string& origin,
                                               const std::string& missing_type = "");
// A preset of any family ("vit-base", "resnet-50", ...); an unknown name is
// an error naming them all.
std::shared_ptr<const Model> model_from_preset(const std::string& name);
// The registered model types and presets, sorted.
std::vector<std::string> model_types();
std::vector<std::string> model_presets();

}  // namespace kiln::nn
