// kiln nn: transformers' ConvNextForImageClassification (modeling_convnext.py):
// a patchify stem (a stride-p convolution and a LayerNorm over channels),
// stages of a downsampling LayerNorm and 2x2 stride-2 convolution (the
// first stage: none) and ConvNeXt layers (7x7 depthwise convolution,
// LayerNorm, a 4x MLP, layer scale, stochastic depth, residual), global
// average pooling, a LayerNorm and a linear classifier. Computed channels
// last throughout: transformers' channels-first LayerNorms are LayerNorms
// over the last axis there.
#include "kiln/convnext.h"

#include <cmath>
#include <optional>

#include "kiln/layers.h"

namespace kiln::nn {
namespace {

std::string stage_name(size_t s) {
  return "convnext.encoder.stages." + std::to_string(s);
}

// The layers, by name, as transformers' ConvNext modules hold them (LayerNorms
// over channels, computed channels last).
struct Stem {
  Conv2d patch;
  LayerNorm norm;
};
Stem stem_of(const ConvNextConfig& c) {
  const int64_t c0 = c.hidden_sizes[0];
  return {{.name = "convnext.embeddings.patch_embeddings",
           .in = c.num_channels,
           .out = c0,
           .kernel = c.patch_size,
           .stride = c.patch_size,
           .weight_init = Init::normal(c.initializer_range)},
          {"convnext.embeddings.layernorm", c0, 1e-6}};
}

struct Downsampling {
  LayerNorm norm;
  Conv2d conv;
};
Downsampling downsampling_of(const ConvNextConfig& c, size_t s, int64_t in, int64_t out) {
  const std::string down = stage_name(s) + ".downsampling_layer.";
  return {{down + "0", in, 1e-6},
          {.name = down + "1",
           .in = in,
           .out = out,
           .kernel = 2,
           .stride = 2,
           .weight_init = Init::normal(c.initializer_range)}};
}

// ConvNextLayer: 7x7 depthwise convolution, LayerNorm, the 4x MLP, layer
// scale, drop path (its rate: torch.linspace(0, drop_path_rate, total)[index]).
struct Block {
  Conv2d dwconv;
  LayerNorm norm;
  MLP mlp;
  std::string layer_scale;  // empty: none
  int64_t dim;
  DropPath drop_path;

  void declare(Decls& d, double layer_scale_init) const {
    dwconv.declare(d);
    norm.declare(d);
    mlp.declare(d);
    if (!layer_scale.empty()) d.push_back({layer_scale, {dim}, Init::constant(layer_scale_init)});
  }
  Array operator()(Scope& s, const Array& h) const {
    Array x = mlp(s, norm(s, dwconv(s, h, Layout::NHWC)));
    if (!layer_scale.empty()) x = x * s.param(layer_scale);
    return h + drop_path(s, x);
  }
};
Block block_of(const ConvNextConfig& c, size_t s, int64_t l, int64_t index, int64_t total) {
  const std::string p = stage_name(s) + ".layers." + std::to_string(l) + ".";
  const int64_t d = c.hidden_sizes[s];
  const Init w = Init::normal(c.initializer_range);
  const double rate =
      total > 1 ? c.drop_path_rate * static_cast<double>(index) / static_cast<double>(total - 1)
                : 0.0;
  return {{.name = p + "dwconv",
           .in = d,
           .out = d,
           .kernel = 7,
           .padding = Conv2d::pad(3),
           .groups = d,
           .weight_init = w},
          {p + "layernorm", d, 1e-6},
          {.up = {p + "pwconv1", d, 4 * d, true, w},
           .down = {p + "pwconv2", 4 * d, d, true, w},
           .act = c.hidden_act},
          c.layer_scale_init_value > 0 ? p + "layer_scale_parameter" : std::string(),
          d,
          {rate}};
}

// Visits the stages: f(stage, its downsampling or null, its blocks).
template <typename F>
void for_each_stage(const ConvNextConfig& c, F&& f) {
  int64_t total = 0, index = 0;
  for (int64_t d : c.depths) total += d;
  int64_t prev = c.hidden_sizes[0];
  for (size_t s = 0; s < c.hidden_sizes.size(); ++s) {
    const int64_t d = c.hidden_sizes[s];
    std::optional<Downsampling> down;
    if (s > 0 || prev != d) down = downsampling_of(c, s, prev, d);
    std::vector<Block> blocks;
    for (int64_t l = 0; l < c.depths[s]; ++l) blocks.push_back(block_of(c, s, l, index++, total));
    f(down, blocks);
    prev = d;
  }
}

LayerNorm final_norm(const ConvNextConfig& c) {
  return {"convnext.layernorm", c.hidden_sizes.back(), c.layer_norm_eps};
}
Linear classifier_of(const ConvNextConfig& c) {
  return {"classifier", c.hidden_sizes.back(), c.num_labels, true,
          Init::normal(c.initializer_range)};
}

Decls declarations(const ConvNextConfig& c) {
  Decls d;
  const Stem stem = stem_of(c);
  stem.patch.declare(d);
  stem.norm.declare(d);
  for_each_stage(c, [&](const std::optional<Downsampling>& down, const std::vector<Block>& blocks) {
    if (down) {
      down->norm.declare(d);
      down->conv.declare(d);
    }
    for (const Block& b : blocks) b.declare(d, c.layer_scale_init_value);
  });
  final_norm(c).declare(d);
  if (c.num_labels > 0) classifier_of(c).declare(d);
  return d;
}

}  // namespace

ConvNextConfig ConvNextConfig::preset(const std::string& name) {
  ConvNextConfig c;
  if (name == "convnext-small") {
    c.depths = {3, 3, 27, 3};
  } else if (name == "convnext-base") {
    c.depths = {3, 3, 27, 3};
    c.hidden_sizes = {128, 256, 512, 1024};
  } else if (name == "convnext-large") {
    c.depths = {3, 3, 27, 3};
    c.hidden_sizes = {192, 384, 768, 1536};
  } else if (name != "convnext-tiny") {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    fail("convnext", "unknown preset '" + name + "', expected one of " + known);
  }
  return c;
}

const std::vector<std::string>& ConvNextConfig::preset_names() {
  static const std::vector<std::string> names{"convnext-tiny", "convnext-small", "convnext-base",
                                              "convnext-large"};
  return names;
}

void ConvNextConfig::validate(const std::string& origin) const {
  auto bad = [&](const std::string& field, const std::string& what) {
    fail(origin, field + " " + what);
  };
  constexpr int64_t kMaxSize = int64_t{1} << 20, kMaxStages = 64, kMaxDepth = 1024;
  auto range = [&](int64_t v, int64_t lo, int64_t hi, const char* field) {
    if (v < lo || v > hi)
      bad(field, "is " + std::to_string(v) + ", expected " + std::to_string(lo) + " to " +
                     std::to_string(hi));
  };
  range(num_channels, 1, kMaxSize, "num_channels");
  range(patch_size, 1, kMaxSize, "patch_size");
  range(num_labels, 0, kMaxSize, "num_labels");
  if (hidden_sizes.empty() || hidden_sizes.size() != depths.size() ||
      static_cast<int64_t>(hidden_sizes.size()) > kMaxStages)
    bad("hidden_sizes", "has " + std::to_string(hidden_sizes.size()) + " stages and depths " +
                            std::to_string(depths.size()) + ": expected one size per stage, 1 to " +
                            std::to_string(kMaxStages));
  for (int64_t h : hidden_sizes) range(h, 1, kMaxSize, "hidden_sizes (a stage's size)");
  for (int64_t d : depths) range(d, 1, kMaxDepth, "depths (a stage's layers)");
  if (!(drop_path_rate >= 0 && drop_path_rate < 1))
    bad("drop_path_rate", "is " + std::to_string(drop_path_rate) + ", expected 0 to 1 (not 1)");
  if (!(layer_norm_eps > 0))
    bad("layer_norm_eps", "is " + std::to_string(layer_norm_eps) + ", expected > 0");
  if (!id2label.empty() && static_cast<int64_t>(id2label.size()) != num_labels)
    bad("id2label", "has " + std::to_string(id2label.size()) + " labels for num_labels " +
                        std::to_string(num_labels));
}

double ConvNextConfig::train_flops_per_image(Size2d image) const {
  // In double throughout: a config's sizes may be large enough to overflow int64.
  const double p = static_cast<double>(patch_size);
  double h = static_cast<double>(image.height / patch_size),
         w = static_cast<double>(image.width / patch_size);
  const double stem = 2.0 * static_cast<double>(num_channels) *
                      static_cast<double>(hidden_sizes[0]) * p * p * h * w;
  double forward = stem;
  int64_t prev = hidden_sizes[0];
  for (size_t s = 0; s < hidden_sizes.size(); ++s) {
    const double d = static_cast<double>(hidden_sizes[s]);
    if (s > 0 || prev != hidden_sizes[s]) {  // 2x2, stride 2
      h = std::floor(h / 2), w = std::floor(w / 2);
      forward += 2.0 * static_cast<double>(prev) * d * 4 * h * w;
    }
    // 7x7 depthwise, then d -> 4d -> d.
    forward += static_cast<double>(depths[s]) * 2.0 * (d * 49 * h * w + 2 * d * 4 * d * h * w);
    prev = hidden_sizes[s];
  }
  forward += 2.0 * static_cast<double>(hidden_sizes.back()) * static_cast<double>(num_labels);
  return 3 * forward - stem;
}

ConvNextForImageClassification::ConvNextForImageClassification(ConvNextConfig cfg)
    : cfg_(std::move(cfg)) {
  cfg_.validate();
}

std::vector<std::pair<std::string, Shape>> ConvNextForImageClassification::parameter_shapes()
    const {
  return shapes_of(declarations(cfg_));
}

Params ConvNextForImageClassification::init(const random::Key& key, Device device) const {
  return init_params(declarations(cfg_), key, device);
}

void ConvNextForImageClassification::check(const Params& params, const std::string& origin) const {
  for (auto& [name, shape] : parameter_shapes()) {
    auto it = params.find(name);
    if (it == params.end()) fail(origin, "missing parameter '" + name + "'");
    if (it->second.shape() != shape)
      fail(origin, "parameter '" + name + "' has shape " + str(it->second.shape()) + ", expected " +
                       str(shape));
  }
}

Array ConvNextForImageClassification::apply(const Params& params, const Array& pixels, bool train,
                                            Layout layout, const random::Key& key) const {
  return apply(params, pixels, train, layout, random::key_array(key, pixels.device()));
}

Array ConvNextForImageClassification::apply(const Params& params, const Array& pixels, bool train,
                                            Layout layout, const Array& key,
                                            DType matmul_dtype) const {
  const auto& c = cfg_;
  const bool nhwc = layout == Layout::NHWC;
  if (pixels.ndim() != 4 || pixels.shape()[nhwc ? 3 : 1] != c.num_channels)
    fail("convnext", "pixel_values " + str(pixels.shape()) + ": expected " +
                         std::to_string(c.num_channels) + " channels (num_channels) on axis " +
                         (nhwc ? "3 (NHWC)" : "1 (NCHW)"));
  const Params no_state;
  Scope s(params, no_state, {.train = train, .key = key, .matmul_dtype = matmul_dtype}, "convnext");
  const Stem stem = stem_of(c);
  Array h = nhwc ? pixels : transpose(pixels, {0, 2, 3, 1});
  h = stem.norm(s, stem.patch(s, h, Layout::NHWC));
  for_each_stage(c, [&](const std::optional<Downsampling>& down, const std::vector<Block>& blocks) {
    if (down) h = down->conv(s, down->norm(s, h), Layout::NHWC);
    for (const Block& b : blocks) h = b(s, h);
  });
  const Array pooled = final_norm(c)(s, mean(h, {1, 2}));
  return c.num_labels > 0 ? classifier_of(c)(s, pooled) : pooled;
}

Array ConvNextForImageClassification::loss(const Array& logits, const Array& labels,
                                           double label_smoothing) const {
  return classification_loss(logits, labels, cfg_.num_labels, cfg_.problem_type, label_smoothing,
                             "convnext");
}

}  // namespace kiln::nn
