// kiln nn: GPT-2 behind the model interface: config.json in and out, presets,
// checkpoint names, registration.
#include "config_json.h"
#include "kiln/gpt2.h"
#include "kiln/model.h"

namespace kiln::nn {
namespace {

class GPT2Model final : public Model {
 public:
  explicit GPT2Model(GPT2Config cfg) : net_(std::move(cfg)) {}
  const GPT2LMHeadModel& net() const { return net_; }
  std::string model_type() const override { return "gpt2"; }
  std::string architecture() const override { return "GPT2LMHeadModel"; }
  std::vector<std::pair<std::string, Shape>> parameter_shapes() const override {
    return net_.parameter_shapes();
  }
  Params init(const random::Key& key, Device device) const override {
    return net_.init(key, device);
  }
  ModelOutput apply(const Params& params, const Params& state, const Array& input_ids,
                    const ModelOptions& opt) const override {
    return {net_.apply(params, input_ids, opt), state};
  }
  Array loss(const Array& logits, const Array& labels, double label_smoothing) const override {
    if (label_smoothing != 0)
      fail("gpt2", "label smoothing is for image classifiers; GPT2LMHeadModel's loss has none");
    return net_.loss(logits, labels);
  }
  bool causal_lm() const override { return true; }
  // GPT2Model's names (the first GPT-2 checkpoints on the Hub) lack the
  // "transformer." prefix; their saved causal masks are not weights.
  std::string weight_name(const std::string& stored) const override {
    if (stored.ends_with(".attn.bias") || stored.ends_with(".attn.masked_bias")) return "";
    // A tied head is wte itself (a checkpoint may store it twice).
    if (stored == "lm_head.weight" && cfg().tie_word_embeddings) return "";
    if (stored.starts_with("transformer.") || stored.starts_with("lm_head.")) return stored;
    return "transformer." + stored;
  }
  std::set<std::string> head_parameters() const override { return {}; }
  int64_t num_labels() const override { return 0; }
  int64_t num_logits() const override { return cfg().vocab_size; }
  ProblemType problem_type() const override { return ProblemType::Unset; }
  std::vector<std::string> label_names() const override { return {}; }
  std::shared_ptr<const Model> with_labels(const std::vector<std::string>& names) const override {
    fail("gpt2", "GPT2LMHeadModel predicts tokens: it has no classifier to give " +
                     std::to_string(names.size()) + " labels");
  }
  Params init_head(const random::Key& /*key*/) const override { return {}; }
  int64_t num_channels() const override { return 0; }
  Size2d image_size() const override { return {0, 0}; }
  bool stochastic() const override {
    return cfg().resid_pdrop > 0 || cfg().embd_pdrop > 0 || cfg().attn_pdrop > 0;
  }
  double train_flops_per_example(Size2d /*image*/) const override {
    return cfg().train_flops_per_token(cfg().n_positions) * static_cast<double>(cfg().n_positions);
  }
  std::string config_json() const override { return cfg().to_json(); }
  std::string config_summary() const override {
    return "vocab_size " + std::to_string(cfg().vocab_size) + ", n_positions " +
           std::to_string(cfg().n_positions) + ", n_embd " + std::to_string(cfg().n_embd) +
           ", n_layer " + std::to_string(cfg().n_layer) +
           (cfg().tie_word_embeddings ? ", tied head" : ", untied head");
  }
  // The embeddings, one group per block, then ln_f with the head.
  int64_t num_layer_groups() const override { return cfg().n_layer + 2; }
  int64_t layer_group(const std::string& param) const override {
    if (param.starts_with("transformer.wte.") || param.starts_with("transformer.wpe.")) return 0;
    const int64_t l = config_json::index_after(param, "transformer.h.");
    if (l >= 0 && l < cfg().n_layer) return l + 1;
    return cfg().n_layer + 1;
  }

 private:
  const GPT2Config& cfg() const { return net_.config(); }
  GPT2LMHeadModel net_;
};

const bool registered = register_model_family(
    {.model_type = "gpt2",
     .presets = GPT2Config::preset_names(),
     .from_config =
         [](std::string_view text, const std::string& path) {
           return gpt2_model(GPT2Config::from_json(text, path));
         },
     .from_preset = [](const std::string& name) { return gpt2_model(GPT2Config::preset(name)); }});

}  // namespace

std::shared_ptr<const Model> gpt2_model(GPT2Config cfg) {
  return std::make_shared<GPT2Model>(std::move(cfg));
}

const GPT2LMHeadModel* as_gpt2(const Model& model) {
  const auto* m = dynamic_cast<const GPT2Model*>(&model);
  return m ? &m->net() : nullptr;
}

}  // namespace kiln::nn
