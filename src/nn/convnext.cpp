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

namespace kiln::nn {
namespace {

const Array& entry(const Params& tree, const std::string& name) {
  auto it = tree.find(name);
  if (it == tree.end()) fail("convnext", "missing parameter '" + name + "'");
  return it->second;
}

std::string stage_name(size_t s) {
  return "convnext.encoder.stages." + std::to_string(s);
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
                            std::to_string(depths.size()) +
                            ": expected one size per stage, 1 to " + std::to_string(kMaxStages));
  for (int64_t h : hidden_sizes) range(h, 1, kMaxSize, "hidden_sizes (a stage's size)");
  for (int64_t d : depths) range(d, 1, kMaxDepth, "depths (a stage's layers)");
  if (!(drop_path_rate >= 0 && drop_path_rate < 1))
    bad("drop_path_rate", "is " + std::to_string(drop_path_rate) + ", expected 0 to 1 (not 1)");
  if (!(layer_norm_eps > 0)) bad("layer_norm_eps", "is " + std::to_string(layer_norm_eps) + ", expected > 0");
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
  const auto& c = cfg_;
  std::vector<std::pair<std::string, Shape>> out;
  auto add = [&](const std::string& n, Shape s) { out.emplace_back(n, std::move(s)); };
  const int64_t c0 = c.hidden_sizes[0];
  add("convnext.embeddings.patch_embeddings.weight", {c0, c.num_channels, c.patch_size, c.patch_size});
  add("convnext.embeddings.patch_embeddings.bias", {c0});
  add("convnext.embeddings.layernorm.weight", {c0});
  add("convnext.embeddings.layernorm.bias", {c0});
  int64_t prev = c0;
  for (size_t s = 0; s < c.hidden_sizes.size(); ++s) {
    const int64_t d = c.hidden_sizes[s];
    if (s > 0 || prev != d) {
      const std::string down = stage_name(s) + ".downsampling_layer.";
      add(down + "0.weight", {prev});
      add(down + "0.bias", {prev});
      add(down + "1.weight", {d, prev, 2, 2});
      add(down + "1.bias", {d});
    }
    for (int64_t l = 0; l < c.depths[s]; ++l) {
      const std::string p = stage_name(s) + ".layers." + std::to_string(l) + ".";
      add(p + "dwconv.weight", {d, 1, 7, 7});
      add(p + "dwconv.bias", {d});
      add(p + "layernorm.weight", {d});
      add(p + "layernorm.bias", {d});
      add(p + "pwconv1.weight", {4 * d, d});
      add(p + "pwconv1.bias", {4 * d});
      add(p + "pwconv2.weight", {d, 4 * d});
      add(p + "pwconv2.bias", {d});
      if (c.layer_scale_init_value > 0) add(p + "layer_scale_parameter", {d});
    }
    prev = d;
  }
  add("convnext.layernorm.weight", {prev});
  add("convnext.layernorm.bias", {prev});
  if (c.num_labels > 0) {
    add("classifier.weight", {c.num_labels, prev});
    add("classifier.bias", {c.num_labels});
  }
  return out;
}

Params ConvNextForImageClassification::init(const random::Key& key, Device device) const {
  Params p;
  uint32_t i = 0;
  for (auto& [name, shape] : parameter_shapes()) {
    const random::Key k = random::fold_in(key, i++);
    const bool norm = name.find("layernorm") != std::string::npos ||
                      name.find("downsampling_layer.0") != std::string::npos;
    if (name.ends_with("layer_scale_parameter"))
      p.emplace(name, full(shape, cfg_.layer_scale_init_value, DType::f32, device));
    else if (name.ends_with(".bias"))
      p.emplace(name, zeros(shape, DType::f32, device));
    else if (norm)
      p.emplace(name, ones(shape, DType::f32, device));
    else
      p.emplace(name, random::normal(k, shape, DType::f32, device) * cfg_.initializer_range);
  }
  eval(p);
  return p;
}

void ConvNextForImageClassification::check(const Params& params, const std::string& origin) const {
  for (auto& [name, shape] : parameter_shapes()) {
    auto it = params.find(name);
    if (it == params.end()) fail(origin, "missing parameter '" + name + "'");
    if (it->second.shape() != shape)
      fail(origin, "parameter '" + name + "' has shape " + str(it->second.shape()) +
                       ", expected " + str(shape));
  }
}

Array ConvNextForImageClassification::apply(const Params& params, const Array& pixels, bool train,
                                            Layout layout, const random::Key& key) const {
  return apply(params, pixels, train, layout, random::key_array(key, pixels.device()));
}

Array ConvNextForImageClassification::apply(const Params& params, const Array& pixels, bool train,
                                            Layout layout, const Array& key) const {
  const auto& c = cfg_;
  const bool nhwc = layout == Layout::NHWC;
  if (pixels.ndim() != 4 || pixels.shape()[nhwc ? 3 : 1] != c.num_channels)
    fail("convnext", "pixel_values " + str(pixels.shape()) + ": expected " +
                         std::to_string(c.num_channels) + " channels (num_channels) on axis " +
                         (nhwc ? "3 (NHWC)" : "1 (NCHW)"));
  auto P = [&](const std::string& n) -> const Array& { return entry(params, n); };
  auto norm = [&](const Array& x, const std::string& n, double eps) {
    return layer_norm(x, P(n + ".weight"), P(n + ".bias"), eps);
  };
  auto conv = [&](const Array& x, const std::string& n, int64_t stride, int64_t pad,
                  int64_t groups) {
    return conv2d(x, P(n + ".weight"),
                  {.stride = {stride}, .padding = {{pad, pad}}, .groups = groups,
                   .channels_last = true}) +
           P(n + ".bias");
  };
  auto linear = [&](const Array& x, const std::string& n) {
    return matmul(x, P(n + ".weight"), {.transpose_b = true}) + P(n + ".bias");
  };
  Array h = nhwc ? pixels : transpose(pixels, {0, 2, 3, 1});
  h = norm(conv(h, "convnext.embeddings.patch_embeddings", c.patch_size, 0, 1),
           "convnext.embeddings.layernorm", 1e-6);
  int64_t total = 0, layer = 0;
  for (int64_t d : c.depths) total += d;
  int64_t prev = c.hidden_sizes[0];
  for (size_t s = 0; s < c.hidden_sizes.size(); ++s) {
    const int64_t d = c.hidden_sizes[s];
    if (s > 0 || prev != d) {
      const std::string down = stage_name(s) + ".downsampling_layer.";
      h = conv(norm(h, down + "0", 1e-6), down + "1", 2, 0, 1);
    }
    for (int64_t l = 0; l < c.depths[s]; ++l, ++layer) {
      const std::string p = stage_name(s) + ".layers." + std::to_string(l) + ".";
      Array x = norm(conv(h, p + "dwconv", 1, 3, d), p + "layernorm", 1e-6);
      x = linear(activate(c.hidden_act, linear(x, p + "pwconv1")), p + "pwconv2");
      if (c.layer_scale_init_value > 0) x = x * P(p + "layer_scale_parameter");
      // torch.linspace(0, drop_path_rate, total)[layer]
      const double rate =
          total > 1 ? c.drop_path_rate * static_cast<double>(layer) / static_cast<double>(total - 1)
                    : 0.0;
      if (train && rate > 0) {
        const Array keep = random::bernoulli(key.to(x.device()), static_cast<uint32_t>(layer),
                                             {x.shape()[0], 1, 1, 1}, 1 - rate);
        x = x * astype(keep, x.dtype()) / (1 - rate);
      }
      h = h + x;
    }
    prev = d;
  }
  const Array pooled = norm(mean(h, {1, 2}), "convnext.layernorm", c.layer_norm_eps);
  return c.num_labels > 0 ? linear(pooled, "classifier") : pooled;
}

Array ConvNextForImageClassification::loss(const Array& logits, const Array& labels,
                                           double label_smoothing) const {
  return classification_loss(logits, labels, cfg_.num_labels, cfg_.problem_type, label_smoothing,
                             "convnext");
}

}  // namespace kiln::nn
