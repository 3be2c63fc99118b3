// kiln nn: ConvNeXt behind the model interface: config.json in and out,
// presets, registration.
#include "config_json.h"
#include "kiln/convnext.h"
#include "kiln/model.h"

namespace kiln::nn {

ConvNextConfig ConvNextConfig::from_json(std::string_view text, const std::string& path) {
  using namespace config_json;
  const json j = parse_object(text, path);
  const BadField bad = bad_field(path);
  expect_model_type(j, bad, "convnext");
  ConvNextConfig c;
  integer(j, bad, "num_channels", c.num_channels);
  integer(j, bad, "patch_size", c.patch_size);
  integers(j, bad, "hidden_sizes", c.hidden_sizes);
  integers(j, bad, "depths", c.depths);
  if (j.contains("num_stages")) {
    int64_t stages = 0;
    integer(j, bad, "num_stages", stages);
    if (stages != static_cast<int64_t>(c.depths.size()))
      bad("num_stages", "is " + std::to_string(stages) + " for " + std::to_string(c.depths.size()) +
                            " depths: expected one depth per stage");
  }
  parse_activation(j, bad, c.hidden_act);
  real(j, bad, "initializer_range", c.initializer_range);
  real(j, bad, "layer_norm_eps", c.layer_norm_eps);
  real(j, bad, "layer_scale_init_value", c.layer_scale_init_value);
  real(j, bad, "drop_path_rate", c.drop_path_rate);
  integer(j, bad, "image_size", c.image_size);
  parse_labels(j, bad, c.num_labels, c.id2label, c.problem_type);
  c.validate("config " + path);
  return c;
}

std::string ConvNextConfig::to_json() const {
  using config_json::json;
  json stages = json::array({"stem"});
  for (size_t s = 0; s < depths.size(); ++s) stages.push_back("stage" + std::to_string(s + 1));
  json j = {{"architectures", {"ConvNextForImageClassification"}},
            {"model_type", "convnext"},
            {"num_channels", num_channels},
            {"patch_size", patch_size},
            {"num_stages", static_cast<int64_t>(depths.size())},
            {"hidden_sizes", hidden_sizes},
            {"depths", depths},
            {"hidden_act", activation_name(hidden_act)},
            {"initializer_range", initializer_range},
            {"layer_norm_eps", layer_norm_eps},
            {"layer_scale_init_value", layer_scale_init_value},
            {"drop_path_rate", drop_path_rate},
            {"image_size", image_size},
            {"stage_names", stages},
            {"torch_dtype", "float32"}};
  config_json::write_labels(j, num_labels, id2label, problem_type);
  return j.dump(2) + "\n";
}

namespace {

class ConvNextModel final : public Model {
 public:
  explicit ConvNextModel(ConvNextConfig cfg) : net_(std::move(cfg)) {}
  std::string model_type() const override { return "convnext"; }
  std::string architecture() const override { return "ConvNextForImageClassification"; }
  std::vector<std::pair<std::string, Shape>> parameter_shapes() const override {
    return net_.parameter_shapes();
  }
  Params init(const random::Key& key, Device device) const override {
    return net_.init(key, device);
  }
  ModelOutput apply(const Params& params, const Params& state, const Array& pixels,
                    const ModelOptions& opt) const override {
    const Array key =
        opt.key.valid() ? opt.key : random::key_array(random::Key(0), pixels.device());
    return {net_.apply(params, pixels, opt.train && opt.drop, opt.layout, key, opt.matmul_dtype),
            state};
  }
  int64_t num_labels() const override { return cfg().num_labels; }
  int64_t num_logits() const override { return cfg().num_logits(); }
  ProblemType problem_type() const override { return cfg().problem_type; }
  std::vector<std::string> label_names() const override {
    return config_json::label_names(cfg().num_labels, cfg().id2label);
  }
  std::shared_ptr<const Model> with_labels(const std::vector<std::string>& names) const override {
    ConvNextConfig c = cfg();
    c.num_labels = static_cast<int64_t>(names.size());
    c.id2label = names;
    return std::make_shared<ConvNextModel>(std::move(c));
  }
  int64_t num_channels() const override { return cfg().num_channels; }
  Size2d image_size() const override { return cfg().image_size; }
  bool stochastic() const override { return cfg().drop_path_rate > 0; }
  std::shared_ptr<const Model> with_drop_path(double rate) const override {
    ConvNextConfig c = cfg();
    c.drop_path_rate = rate;
    c.validate("--drop-path " + std::to_string(rate));
    return std::make_shared<ConvNextModel>(std::move(c));
  }
  double train_flops_per_example(Size2d image) const override {
    return cfg().train_flops_per_image(image);
  }
  std::string config_json() const override { return cfg().to_json(); }
  // timm's ConvNeXt groups: the stem, one per ConvNeXt layer (a stage's
  // downsampling with its first layer), the final LayerNorm with the
  // classifier.
  int64_t num_layer_groups() const override { return blocks_before(cfg().depths.size()) + 2; }
  int64_t layer_group(const std::string& param) const override {
    if (param.starts_with("convnext.embeddings.")) return 0;
    const std::string stages = "convnext.encoder.stages.";
    const int64_t s = config_json::index_after(param, stages);
    if (s >= 0 && s < static_cast<int64_t>(cfg().depths.size())) {
      const std::string stage = stages + std::to_string(s) + ".";
      if (param.starts_with(stage + "downsampling_layer."))
        return blocks_before(static_cast<size_t>(s)) + 1;
      const int64_t l = config_json::index_after(param, stage + "layers.");
      if (l >= 0) return blocks_before(static_cast<size_t>(s)) + l + 1;
    }
    return num_layer_groups() - 1;
  }

 private:
  const ConvNextConfig& cfg() const { return net_.config(); }
  // The layers of the stages before stage `stages`.
  int64_t blocks_before(size_t stages) const {
    int64_t n = 0;
    for (size_t s = 0; s < stages && s < cfg().depths.size(); ++s) n += cfg().depths[s];
    return n;
  }

  ConvNextForImageClassification net_;
};

const bool registered = register_model_family(
    {.model_type = "convnext",
     .presets = ConvNextConfig::preset_names(),
     .from_config = [](std::string_view text,
                       const std::string& path) -> std::shared_ptr<const Model> {
       return std::make_shared<ConvNextModel>(ConvNextConfig::from_json(text, path));
     },
     .from_preset = [](const std::string& name) -> std::shared_ptr<const Model> {
       return std::make_shared<ConvNextModel>(ConvNextConfig::preset(name));
     }});

}  // namespace
}  // namespace kiln::nn
