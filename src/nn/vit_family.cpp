// kiln nn: the ViT family (ViT, DeiT, DeiT with its teacher's head) behind
// the model interface: config.json in and out, presets, registration.
#include <algorithm>

#include "config_json.h"
#include "kiln/model.h"

namespace kiln::nn {

ViTConfig ViTConfig::from_json(std::string_view text, const std::string& path,
                               const std::string& model_type) {
  using namespace config_json;
  const json j = parse_object(text, path);
  const BadField bad = bad_field(path);
  expect_model_type(j, bad, model_type);
  ViTConfig c;
  // An integer (a square), or [height, width] as transformers' ViTPatchEmbeddings reads a pair.
  auto size2d = [&](const char* f, Size2d& dst) {
    if (!j.contains(f)) return;
    const json& v = j[f];
    if (v.is_number_integer()) {
      dst = v.get<int64_t>();
    } else if (v.is_array() && v.size() == 2 && v[0].is_number_integer() &&
               v[1].is_number_integer()) {
      dst = {v[0].get<int64_t>(), v[1].get<int64_t>()};
    } else {
      bad(f, "is " + v.dump() + ", expected an integer or a list [height, width] of two integers");
    }
  };
  integer(j, bad, "hidden_size", c.hidden_size);
  integer(j, bad, "num_hidden_layers", c.num_hidden_layers);
  integer(j, bad, "num_attention_heads", c.num_attention_heads);
  integer(j, bad, "intermediate_size", c.intermediate_size);
  size2d("image_size", c.image_size);
  size2d("patch_size", c.patch_size);
  integer(j, bad, "num_channels", c.num_channels);
  real(j, bad, "hidden_dropout_prob", c.hidden_dropout_prob);
  real(j, bad, "attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  real(j, bad, "initializer_range", c.initializer_range);
  real(j, bad, "layer_norm_eps", c.layer_norm_eps);
  real(j, bad, "drop_path_rate", c.drop_path_rate);
  boolean(j, bad, "qkv_bias", c.qkv_bias);
  parse_activation(j, bad, c.hidden_act);
  parse_labels(j, bad, c.num_labels, c.id2label, c.problem_type);
  if (j.contains("pruned_heads")) c.pruned_heads = parse_pruned_heads(j["pruned_heads"], bad);
  // Both of transformers' attention implementations for ViT compute
  // softmax(QKᵀ/√d)V, as kiln does; it has no others.
  for (const char* f : {"attn_implementation", "_attn_implementation"})
    if (j.contains(f) && !j[f].is_null() && j[f] != "eager" && j[f] != "sdpa")
      bad(f, "is " + j[f].dump() + ", expected \"eager\" or \"sdpa\" (transformers' " + model_type +
                 " has no other)");
  c.validate("config " + path);
  return c;
}

namespace {

const char* architecture_of(ViTVariant v) {
  switch (v) {
    case ViTVariant::ViT: return "ViTForImageClassification";
    case ViTVariant::DeiT: return "DeiTForImageClassification";
    case ViTVariant::DeiTWithTeacher: return "DeiTForImageClassificationWithTeacher";
  }
  return "";
}

}  // namespace

std::string ViTConfig::to_json(ViTVariant variant) const {
  using config_json::json;
  const ViTConfig& c = *this;
  auto size = [](const Size2d& s) {
    return s.square() ? json(s.height) : json::array({s.height, s.width});
  };
  json j = {{"architectures", {architecture_of(variant)}},
            {"model_type", variant == ViTVariant::ViT ? "vit" : "deit"},
            {"hidden_size", c.hidden_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"intermediate_size", c.intermediate_size},
            {"hidden_act", activation_name(c.hidden_act)},
            {"hidden_dropout_prob", c.hidden_dropout_prob},
            {"attention_probs_dropout_prob", c.attention_probs_dropout_prob},
            {"initializer_range", c.initializer_range},
            {"layer_norm_eps", c.layer_norm_eps},
            {"image_size", size(c.image_size)},
            {"patch_size", size(c.patch_size)},
            {"num_channels", c.num_channels},
            {"qkv_bias", c.qkv_bias},
            {"torch_dtype", "float32"}};
  config_json::write_labels(j, c.num_labels, c.id2label, c.problem_type);
  if (c.drop_path_rate > 0) j["drop_path_rate"] = c.drop_path_rate;
  // Only masked image modeling reads encoder_stride; ViTConfig's default is 16.
  if (c.patch_size.square()) j["encoder_stride"] = c.patch_size.height;
  if (!c.pruned_heads.empty()) {
    json pruned = json::object();
    for (const auto& [layer, heads] : c.pruned_heads) pruned[std::to_string(layer)] = heads;
    j["pruned_heads"] = pruned;
  }
  return j.dump(2) + "\n";
}

namespace {

class ViTModel final : public Model {
 public:
  ViTModel(ViTConfig cfg, ViTVariant variant) : net_(std::move(cfg), variant) {}
  const ViTForImageClassification& net() const { return net_; }

  std::string model_type() const override {
    return net_.variant() == ViTVariant::ViT ? "vit" : "deit";
  }
  std::string architecture() const override { return architecture_of(net_.variant()); }
  std::vector<std::pair<std::string, Shape>> parameter_shapes() const override {
    return net_.parameter_shapes();
  }
  Params init(const random::Key& key, Device device) const override {
    return net_.init(key, device);
  }
  ModelOutput apply(const Params& params, const Params& state, const Array& pixels,
                    const ModelOptions& opt) const override {
    ApplyOptions o{.layout = opt.layout,
                   .train = opt.train && opt.drop,
                   .matmul_dtype = opt.matmul_dtype,
                   .fused_attention = opt.fused_attention,
                   .inference = opt.inference};
    if (opt.key.valid())
      o.dropout_key_array = opt.key;
    else
      o.dropout_key = random::Key(0);
    return {net_.apply(params, pixels, o), state};
  }
  int64_t num_labels() const override { return cfg().num_labels; }
  int64_t num_logits() const override { return cfg().num_logits(); }
  ProblemType problem_type() const override { return cfg().problem_type; }
  std::vector<std::string> label_names() const override {
    return config_json::label_names(cfg().num_labels, cfg().id2label);
  }
  std::shared_ptr<const Model> with_labels(const std::vector<std::string>& names) const override {
    ViTConfig c = cfg();
    c.num_labels = static_cast<int64_t>(names.size());
    c.id2label = names;
    return vit_model(std::move(c), net_.variant());
  }
  int64_t num_channels() const override { return cfg().num_channels; }
  Size2d image_size() const override { return cfg().image_size; }
  bool fixed_image_size() const override { return true; }
  bool stochastic() const override {
    return cfg().hidden_dropout_prob > 0 || cfg().attention_probs_dropout_prob > 0 ||
           cfg().drop_path_rate > 0;
  }
  std::shared_ptr<const Model> with_image_size(Size2d size,
                                               const std::string& origin) const override {
    ViTConfig c = cfg();
    c.image_size = size;
    c.validate(origin);
    return vit_model(std::move(c), net_.variant());
  }
  std::shared_ptr<const Model> resized(Params& params, Size2d size,
                                       std::vector<std::string>& notes) const override {
    const ViTConfig& was = cfg();
    ViTConfig c = was;
    c.image_size = size;
    c.validate("image size " + to_string(size));
    if (size == was.image_size) return vit_model(std::move(c), net_.variant());
    const Size2d from = was.grid(), to = c.grid();
    const std::string what =
        "image size " + to_string(was.image_size) + " -> " + to_string(size) + ": ";
    if (from != to) {
      const bool deit = net_.variant() != ViTVariant::ViT;
      Array& pos = params.at(deit ? "deit.embeddings.position_embeddings"
                                  : "vit.embeddings.position_embeddings");
      pos = resample_position_embeddings(pos, from, to, deit ? 2 : 1);
      notes.push_back(what + "position embeddings resampled from " + to_string(from) + " to " +
                      to_string(to) +
                      " patches (bicubic, as transformers' interpolate_pos_encoding)");
    } else {
      notes.push_back(what + "the same grid of " + to_string(to) + " patches");
    }
    return vit_model(std::move(c), net_.variant());
  }
  // A ViT's classifier as kiln's ViT checkpoints have always drawn it
  // (transformers' ViT init: truncated normal of initializer_range from the
  // key itself, zero bias); a DeiT's heads as the family's init draws them.
  Params init_head(const random::Key& key) const override {
    if (net_.variant() != ViTVariant::ViT || cfg().num_labels <= 0) return Model::init_head(key);
    const double std = cfg().initializer_range;
    Params head;
    head["classifier.weight"] = random::truncated_normal(key, {cfg().num_labels, cfg().hidden_size},
                                                         -2.0 / std, 2.0 / std) *
                                std;
    head["classifier.bias"] = zeros({cfg().num_labels});
    return head;
  }
  std::shared_ptr<const Model> with_drop_path(double rate) const override {
    ViTConfig c = cfg();
    c.drop_path_rate = rate;
    c.validate("--drop-path " + std::to_string(rate));
    return vit_model(std::move(c), net_.variant());
  }
  double train_flops_per_example(Size2d /*image*/) const override {
    const bool deit = net_.variant() != ViTVariant::ViT;
    double flops = cfg().train_flops_per_image(deit ? 2 : 1);
    // DeiT with its teacher's head: a second classifier on the distillation token.
    if (net_.variant() == ViTVariant::DeiTWithTeacher)
      flops +=
          3 * 2.0 * static_cast<double>(cfg().hidden_size) * static_cast<double>(cfg().num_labels);
    return flops;
  }
  std::string config_json() const override { return cfg().to_json(net_.variant()); }
  std::string config_summary() const override {
    return "hidden_size " + std::to_string(cfg().hidden_size) + ", image_size " +
           to_string(cfg().image_size) + ", patch_size " + to_string(cfg().patch_size) + ", " +
           std::to_string(cfg().num_labels) + " labels, " +
           std::to_string(cfg().num_hidden_layers) + " layers";
  }
  // timm's ViT groups: the embeddings, one per encoder layer (the final
  // LayerNorm with the last), the classifiers.
  int64_t num_layer_groups() const override { return cfg().num_hidden_layers + 2; }
  int64_t layer_group(const std::string& param) const override {
    const std::string m = model_type() + ".";
    const int64_t layers = cfg().num_hidden_layers;
    if (param.starts_with(m + "embeddings.")) return 0;
    const int64_t l = config_json::index_after(param, m + "encoder.layer.");
    if (l >= 0) return l + 1;
    if (param.starts_with(m + "layernorm.")) return layers;
    return layers + 1;
  }

 private:
  const ViTConfig& cfg() const { return net_.config(); }
  ViTForImageClassification net_;
};

// facebook/deit-{tiny,small,base}-patch16-224's encoders.
ViTConfig deit_preset(const std::string& name) {
  ViTConfig c;
  if (name == "deit-tiny")
    c.hidden_size = 192, c.num_attention_heads = 3, c.intermediate_size = 768;
  if (name == "deit-small")
    c.hidden_size = 384, c.num_attention_heads = 6, c.intermediate_size = 1536;
  return c;
}

// The DeiT variant config.json names in architectures (DeiTForImageClassification
// when it names neither).
ViTVariant deit_variant(std::string_view text, const std::string& path) {
  const config_json::json j = config_json::parse_object(text, path);
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      if (a == "DeiTForImageClassificationWithTeacher") return ViTVariant::DeiTWithTeacher;
  return ViTVariant::DeiT;
}

const bool registered_vit = register_model_family(
    {.model_type = "vit",
     .presets = ViTConfig::preset_names(),
     .from_config =
         [](std::string_view text, const std::string& path) {
           return vit_model(ViTConfig::from_json(text, path));
         },
     .from_preset = [](const std::string& name) { return vit_model(ViTConfig::preset(name)); }});

const bool registered_deit = register_model_family(
    {.model_type = "deit",
     .presets = {"deit-base", "deit-small", "deit-tiny"},
     .from_config =
         [](std::string_view text, const std::string& path) {
           return vit_model(ViTConfig::from_json(text, path, "deit"), deit_variant(text, path));
         },
     .from_preset =
         [](const std::string& name) { return vit_model(deit_preset(name), ViTVariant::DeiT); }});

}  // namespace

std::shared_ptr<const Model> vit_model(ViTConfig cfg, ViTVariant variant) {
  return std::make_shared<ViTModel>(std::move(cfg), variant);
}

const ViTForImageClassification* as_vit(const Model& model) {
  const auto* m = dynamic_cast<const ViTModel*>(&model);
  return m ? &m->net() : nullptr;
}

}  // namespace kiln::nn
