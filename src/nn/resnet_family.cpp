// kiln nn: ResNet behind the model interface: config.json in and out,
// presets, registration.
#include "config_json.h"
#include "kiln/model.h"
#include "kiln/resnet.h"

namespace kiln::nn {

ResNetConfig ResNetConfig::from_json(std::string_view text, const std::string& path) {
  using namespace config_json;
  const json j = parse_object(text, path);
  const BadField bad = bad_field(path);
  expect_model_type(j, bad, "resnet");
  ResNetConfig c;
  integer(j, bad, "num_channels", c.num_channels);
  integer(j, bad, "embedding_size", c.embedding_size);
  integers(j, bad, "hidden_sizes", c.hidden_sizes);
  integers(j, bad, "depths", c.depths);
  if (j.contains("layer_type")) {
    if (j["layer_type"] != "basic" && j["layer_type"] != "bottleneck")
      bad("layer_type", "is " + j["layer_type"].dump() + ", expected \"basic\" or \"bottleneck\"");
    c.bottleneck = j["layer_type"] == "bottleneck";
  }
  parse_activation(j, bad, c.hidden_act);
  boolean(j, bad, "downsample_in_first_stage", c.downsample_in_first_stage);
  boolean(j, bad, "downsample_in_bottleneck", c.downsample_in_bottleneck);
  parse_labels(j, bad, c.num_labels, c.id2label, c.problem_type);
  c.validate("config " + path);
  return c;
}

std::string ResNetConfig::to_json() const {
  using config_json::json;
  json stages = json::array({"stem"});
  for (size_t s = 0; s < depths.size(); ++s) stages.push_back("stage" + std::to_string(s + 1));
  json j = {{"architectures", {"ResNetForImageClassification"}},
            {"model_type", "resnet"},
            {"num_channels", num_channels},
            {"embedding_size", embedding_size},
            {"hidden_sizes", hidden_sizes},
            {"depths", depths},
            {"layer_type", bottleneck ? "bottleneck" : "basic"},
            {"hidden_act", activation_name(hidden_act)},
            {"downsample_in_first_stage", downsample_in_first_stage},
            {"downsample_in_bottleneck", downsample_in_bottleneck},
            {"stage_names", stages},
            {"torch_dtype", "float32"}};
  config_json::write_labels(j, num_labels, id2label, problem_type);
  return j.dump(2) + "\n";
}

namespace {

class ResNetModel final : public Model {
 public:
  explicit ResNetModel(ResNetConfig cfg) : net_(std::move(cfg)) {}
  std::string model_type() const override { return "resnet"; }
  std::string architecture() const override { return "ResNetForImageClassification"; }
  std::vector<std::pair<std::string, Shape>> parameter_shapes() const override {
    return net_.parameter_shapes();
  }
  std::vector<std::pair<std::string, Shape>> state_shapes() const override {
    return net_.state_shapes();
  }
  Params init(const random::Key& key, Device device) const override {
    return net_.init(key, device);
  }
  Params init_state(Device device) const override { return net_.init_state(device); }
  ModelOutput apply(const Params& params, const Params& state, const Array& pixels,
                    const ModelOptions& opt) const override {
    ResNetOutput out = net_.apply(params, state, pixels, opt.train, opt.layout, opt.matmul_dtype);
    return {std::move(out.logits), std::move(out.state)};
  }
  int64_t num_labels() const override { return cfg().num_labels; }
  int64_t num_logits() const override { return cfg().num_logits(); }
  ProblemType problem_type() const override { return cfg().problem_type; }
  std::vector<std::string> label_names() const override {
    return config_json::label_names(cfg().num_labels, cfg().id2label);
  }
  std::shared_ptr<const Model> with_labels(const std::vector<std::string>& names) const override {
    ResNetConfig c = cfg();
    c.num_labels = static_cast<int64_t>(names.size());
    c.id2label = names;
    return std::make_shared<ResNetModel>(std::move(c));
  }
  int64_t num_channels() const override { return cfg().num_channels; }
  // ResNetImageProcessor's crop (any size runs).
  Size2d image_size() const override { return 224; }
  bool stochastic() const override { return false; }
  double train_flops_per_example(Size2d image) const override {
    return cfg().train_flops_per_image(image);
  }
  std::string config_json() const override { return cfg().to_json(); }
  // timm's ResNet groups: the stem, one per residual layer, the classifier.
  int64_t num_layer_groups() const override { return blocks_before(cfg().depths.size()) + 2; }
  int64_t layer_group(const std::string& param) const override {
    if (param.starts_with("resnet.embedder.")) return 0;
    const std::string stages = "resnet.encoder.stages.";
    const int64_t s = config_json::index_after(param, stages);
    if (s >= 0 && s < static_cast<int64_t>(cfg().depths.size())) {
      const int64_t l = config_json::index_after(param, stages + std::to_string(s) + ".layers.");
      if (l >= 0) return blocks_before(static_cast<size_t>(s)) + l + 1;
    }
    return num_layer_groups() - 1;
  }

 private:
  const ResNetConfig& cfg() const { return net_.config(); }
  // The layers of the stages before stage `stages`.
  int64_t blocks_before(size_t stages) const {
    int64_t n = 0;
    for (size_t s = 0; s < stages && s < cfg().depths.size(); ++s) n += cfg().depths[s];
    return n;
  }

  ResNetForImageClassification net_;
};

const bool registered = register_model_family(
    {.model_type = "resnet",
     .presets = ResNetConfig::preset_names(),
     .from_config = [](std::string_view text,
                       const std::string& path) -> std::shared_ptr<const Model> {
       return std::make_shared<ResNetModel>(ResNetConfig::from_json(text, path));
     },
     .from_preset = [](const std::string& name) -> std::shared_ptr<const Model> {
       return std::make_shared<ResNetModel>(ResNetConfig::preset(name));
     }});

}  // namespace
}  // namespace kiln::nn
