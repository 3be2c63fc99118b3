// kiln nn: transformers' ResNetForImageClassification (modeling_resnet.py):
// a 7x7 stride-2 stem with BatchNorm and a 3x3 max pool, stages of basic
// (two 3x3) or bottleneck (1x1, 3x3, 1x1 at a quarter of the width) residual
// layers with a 1x1 projection shortcut where the shape changes, global
// average pooling and a linear classifier.
#include "kiln/resnet.h"

#include "kiln/layers.h"

#include <cmath>
#include <optional>

namespace kiln::nn {
namespace {

// One convolution (no bias) with its BatchNorm and optional activation:
// transformers' ResNetConvLayer and ResNetShortCut, named by `name`.
struct ConvSpec {
  std::string name;
  int64_t in = 0, out = 0, kernel = 1, stride = 1;
  bool act = true;
};
struct Block {
  std::vector<ConvSpec> layer;
  std::optional<ConvSpec> shortcut;
};
struct Plan {
  ConvSpec stem;
  std::vector<Block> blocks;
};

Plan plan_of(const ResNetConfig& c) {
  Plan p;
  p.stem = {"resnet.embedder.embedder", c.num_channels, c.embedding_size, 7, 2, true};
  for (size_t s = 0; s < c.hidden_sizes.size(); ++s) {
    const int64_t in_stage = s == 0 ? c.embedding_size : c.hidden_sizes[s - 1];
    const int64_t out = c.hidden_sizes[s];
    const int64_t stride = s == 0 ? (c.downsample_in_first_stage ? 2 : 1) : 2;
    for (int64_t l = 0; l < c.depths[s]; ++l) {
      const std::string base =
          "resnet.encoder.stages." + std::to_string(s) + ".layers." + std::to_string(l);
      const int64_t in = l == 0 ? in_stage : out, st = l == 0 ? stride : 1;
      Block b;
      if (in != out || st != 1) b.shortcut = ConvSpec{base + ".shortcut", in, out, 1, st, false};
      const std::string layer = base + ".layer.";
      if (c.bottleneck) {
        const int64_t r = out / 4;
        const bool first = c.downsample_in_bottleneck;
        b.layer = {{layer + "0", in, r, 1, first ? st : 1, true},
                   {layer + "1", r, r, 3, first ? 1 : st, true},
                   {layer + "2", r, out, 1, 1, false}};
      } else {
        b.layer = {{layer + "0", in, out, 3, st, true}, {layer + "1", out, out, 3, 1, false}};
      }
      p.blocks.push_back(std::move(b));
    }
  }
  return p;
}

template <typename F>
void for_each_conv(const Plan& p, F&& f) {
  f(p.stem);
  for (const Block& b : p.blocks) {
    for (const ConvSpec& c : b.layer) f(c);
    if (b.shortcut) f(*b.shortcut);
  }
}

// transformers' ResNetConvLayer: the convolution (no bias; kaiming normal,
// fan out), its BatchNorm.
Conv2d conv_of(const ConvSpec& c) {
  return {.name = c.name + ".convolution",
          .in = c.in,
          .out = c.out,
          .kernel = c.kernel,
          .stride = c.stride,
          .padding = Conv2d::pad(c.kernel / 2),
          .bias = false,
          .weight_init = Init::kaiming_normal_fan_out(c.out * c.kernel * c.kernel),
          .bf16_result = true};
}
BatchNorm norm_of(const ConvSpec& c) {
  return {c.name + ".normalization", c.out};
}

// The classifier (after a flatten: "classifier.1"), torch's default init.
Linear classifier_of(const ResNetConfig& c) {
  const Init init = Init::torch_default(c.hidden_sizes.back());
  return {"classifier.1", c.hidden_sizes.back(), c.num_labels, true, init, init};
}

Decls declarations(const ResNetConfig& cfg) {
  Decls d;
  for_each_conv(plan_of(cfg), [&](const ConvSpec& c) {
    conv_of(c).declare(d);
    norm_of(c).declare(d);
  });
  if (cfg.num_labels > 0) classifier_of(cfg).declare(d);
  return d;
}

Decls state_declarations(const ResNetConfig& cfg) {
  Decls d;
  for_each_conv(plan_of(cfg), [&](const ConvSpec& c) { norm_of(c).declare_state(d); });
  return d;
}

}  // namespace

ResNetConfig ResNetConfig::preset(const std::string& name) {
  ResNetConfig c;
  if (name == "resnet-18" || name == "resnet-34") {
    c.bottleneck = false;
    c.hidden_sizes = {64, 128, 256, 512};
    c.depths =
        name == "resnet-18" ? std::vector<int64_t>{2, 2, 2, 2} : std::vector<int64_t>{3, 4, 6, 3};
  } else if (name == "resnet-fmnist") {
    // ResNet-18 for Fashion-MNIST: 28x28 grey images (7x7 after the stem and
    // its pooling), 10 classes.
    c.bottleneck = false;
    c.hidden_sizes = {64, 128, 256, 512};
    c.depths = {2, 2, 2, 2};
    c.num_channels = 1;
    c.num_labels = 10;
  } else if (name == "resnet-101") {
    c.depths = {3, 4, 23, 3};
  } else if (name == "resnet-152") {
    c.depths = {3, 8, 36, 3};
  } else if (name != "resnet-50") {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    fail("resnet", "unknown preset '" + name + "', expected one of " + known);
  }
  return c;
}

const std::vector<std::string>& ResNetConfig::preset_names() {
  static const std::vector<std::string> names{"resnet-18",  "resnet-34",  "resnet-50",
                                              "resnet-101", "resnet-152", "resnet-fmnist"};
  return names;
}

void ResNetConfig::validate(const std::string& origin) const {
  auto bad = [&](const std::string& field, const std::string& what) {
    fail(origin, field + " " + what);
  };
  if (num_channels < 1)
    bad("num_channels", "is " + std::to_string(num_channels) + ", expected >= 1");
  if (embedding_size < 1)
    bad("embedding_size", "is " + std::to_string(embedding_size) + ", expected >= 1");
  if (hidden_sizes.empty() || hidden_sizes.size() != depths.size())
    bad("hidden_sizes", "has " + std::to_string(hidden_sizes.size()) + " stages and depths " +
                            std::to_string(depths.size()) +
                            ": expected one size per stage, 1 or more");
  for (int64_t h : hidden_sizes)
    if (h < (bottleneck ? 4 : 1))
      bad("hidden_sizes", "holds " + std::to_string(h) + ", expected >= " +
                              (bottleneck ? "4 (a bottleneck reduces by 4)" : std::string("1")));
  for (int64_t d : depths)
    if (d < 1) bad("depths", "holds " + std::to_string(d) + ", expected >= 1");
  if (num_labels < 0) bad("num_labels", "is " + std::to_string(num_labels) + ", expected >= 0");
  // Bounds far above any real ResNet that keep every size kiln derives from
  // a config (shapes, parameter counts) inside 64-bit integers.
  constexpr int64_t kMaxSize = int64_t{1} << 20, kMaxStages = 64, kMaxDepth = 1024;
  auto at_most = [&](int64_t v, int64_t limit, const char* field) {
    if (v > limit)
      bad(field, "is " + std::to_string(v) + ", expected at most " + std::to_string(limit));
  };
  at_most(num_channels, kMaxSize, "num_channels");
  at_most(embedding_size, kMaxSize, "embedding_size");
  at_most(num_labels, kMaxSize, "num_labels");
  at_most(static_cast<int64_t>(hidden_sizes.size()), kMaxStages, "hidden_sizes (its stages)");
  for (int64_t h : hidden_sizes) at_most(h, kMaxSize, "hidden_sizes (a stage's size)");
  for (int64_t d : depths) at_most(d, kMaxDepth, "depths (a stage's layers)");
  if (!id2label.empty() && static_cast<int64_t>(id2label.size()) != num_labels)
    bad("id2label", "has " + std::to_string(id2label.size()) + " labels for num_labels " +
                        std::to_string(num_labels));
}

double ResNetConfig::train_flops_per_image(Size2d image) const {
  // Every convolution pads k / 2: its output is (size - 1) / stride + 1.
  auto out = [](int64_t size, int64_t stride) { return (size - 1) / stride + 1; };
  auto flops = [](const ConvSpec& c, int64_t h, int64_t w) {
    return 2.0 * static_cast<double>(c.in) * static_cast<double>(c.out) *
           static_cast<double>(c.kernel * c.kernel) * static_cast<double>(h) *
           static_cast<double>(w);
  };
  const Plan p = plan_of(*this);
  int64_t h = out(image.height, 2), w = out(image.width, 2);
  const double stem = flops(p.stem, h, w);
  h = out(h, 2), w = out(w, 2);  // the 3x3 max pool, stride 2
  double forward = stem;
  for (const Block& b : p.blocks) {
    int64_t bh = h, bw = w;
    for (const ConvSpec& c : b.layer) {
      bh = out(bh, c.stride), bw = out(bw, c.stride);
      forward += flops(c, bh, bw);
    }
    if (b.shortcut) forward += flops(*b.shortcut, bh, bw);
    h = bh, w = bw;
  }
  forward += 2.0 * static_cast<double>(hidden_sizes.back()) * static_cast<double>(num_labels);
  return 3 * forward - stem;
}

ResNetForImageClassification::ResNetForImageClassification(ResNetConfig cfg)
    : cfg_(std::move(cfg)) {
  cfg_.validate();
}

std::vector<std::pair<std::string, Shape>> ResNetForImageClassification::parameter_shapes() const {
  return shapes_of(declarations(cfg_));
}

std::vector<std::pair<std::string, Shape>> ResNetForImageClassification::state_shapes() const {
  return shapes_of(state_declarations(cfg_));
}

Params ResNetForImageClassification::init(const random::Key& key, Device device) const {
  return init_params(declarations(cfg_), key, device);
}

Params ResNetForImageClassification::init_state(Device device) const {
  return nn::init_state(state_declarations(cfg_), device);
}

void ResNetForImageClassification::check(const Params& params, const Params& state,
                                         const std::string& origin) const {
  auto check_tree = [&](const Params& tree, const std::vector<std::pair<std::string, Shape>>& want,
                        const char* what) {
    for (auto& [name, shape] : want) {
      auto it = tree.find(name);
      if (it == tree.end()) fail(origin, std::string("missing ") + what + " '" + name + "'");
      if (it->second.shape() != shape)
        fail(origin, std::string(what) + " '" + name + "' has shape " + str(it->second.shape()) +
                         ", expected " + str(shape));
    }
  };
  check_tree(params, parameter_shapes(), "parameter");
  check_tree(state, state_shapes(), "BatchNorm statistic");
}

ResNetOutput ResNetForImageClassification::apply(const Params& params, const Params& state,
                                                 const Array& pixels, bool train, Layout layout,
                                                 DType matmul_dtype) const {
  const bool nhwc = layout == Layout::NHWC;
  if (pixels.ndim() != 4 || pixels.shape()[nhwc ? 3 : 1] != cfg_.num_channels)
    fail("resnet", "pixel_values " + str(pixels.shape()) + ": expected " +
                       (nhwc ? "[batch, height, width, " : "[batch, ") +
                       std::to_string(cfg_.num_channels) + (nhwc ? "]" : ", height, width]") +
                       " (num_channels " + std::to_string(cfg_.num_channels) + ")");
  // Computed channels last whatever the pixels' layout (the convolutions'
  // fastest form on the cpu: oneDNN's direct kernels, 2x its NCHW GEMMs).
  Scope s(params, state, {.train = train, .matmul_dtype = matmul_dtype}, "resnet");
  auto conv_bn = [&](const ConvSpec& c, const Array& x) {
    const Array y = norm_of(c)(s, conv_of(c)(s, x, Layout::NHWC), Layout::NHWC);
    return c.act ? activate(cfg_.hidden_act, y) : y;
  };
  const Plan plan = plan_of(cfg_);
  const Array x = nhwc ? pixels : transpose(pixels, {0, 2, 3, 1});
  Array h = max_pool2d(conv_bn(plan.stem, x), {3},
                       {.stride = {2}, .padding = {{1, 1}}, .channels_last = true});
  for (const Block& b : plan.blocks) {
    Array y = h;
    for (const ConvSpec& c : b.layer) y = conv_bn(c, y);
    h = activate(cfg_.hidden_act, y + (b.shortcut ? conv_bn(*b.shortcut, h) : h));
  }
  // (In bf16 mixed precision the activations are bf16 from the first
  // convolution on, as autocast keeps them; pooled in f32.)
  const Array pooled = mean(astype(h, DType::f32), {1, 2});  // [B, C]
  ResNetOutput out;
  out.logits = cfg_.num_labels > 0 ? classifier_of(cfg_)(s, pooled) : pooled;
  out.state = s.take_state();
  return out;
}

Array ResNetForImageClassification::loss(const Array& logits, const Array& labels,
                                         double label_smoothing) const {
  return classification_loss(logits, labels, cfg_.num_labels, cfg_.problem_type, label_smoothing,
                             "resnet");
}

}  // namespace kiln::nn
